"""`gradleak experiment property-inference` (DLG rebuttal Table 2): Melis et al.'s property
classifier on the shared updates vs the property read from DLG's reconstructions, on real
Fashion-MNIST images. The property ("an image in the brightest quartile of its own class") must
be independent of the label, the smoke run must write every target as a row with sane AUCs, and
DLG must really rebuild the smoke targets (measured first: 4 of 4 at 65-72 dB, 60 iterations).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from gradleak.cli import main
from gradleak.data import batch_of
from gradleak.errors import ConfigError
from gradleak.experiments import make_options, run_experiment
from gradleak.experiments import property_data as pdata
from gradleak.experiments import property_inference as pi
from gradleak.experiments import property_stats as pstats
from gradleak.experiments.base import output_name

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def splits():
    return pi._splits("fashion-mnist")


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_the_property_is_a_quartile_of_every_class_not_the_label(splits):
    """~25 % of every class has the property (exactly on the train split, which sets the
    thresholds; within sampling noise on the held-out test split), so the label says nothing
    about it; and the scorer on the loaded images agrees exactly with the table of the IDX pixels
    (which is what makes the ground-truth AUC 1)."""
    train, test = splits
    v_tr, y_tr = pdata.intensity_table(train)
    v_te, y_te = pdata.intensity_table(test)
    thr = pdata.class_thresholds(v_tr, y_tr, train.num_classes)
    b_tr, b_te = pdata.has_property(v_tr, y_tr, thr), pdata.has_property(v_te, y_te, thr)
    rates_tr = [b_tr[y_tr == c].mean() for c in range(10)]
    rates_te = [b_te[y_te == c].mean() for c in range(10)]
    assert all(abs(r - 0.25) < 0.005 for r in rates_tr), rates_tr     # measured: 0.250 each
    assert all(abs(r - 0.25) < 0.04 for r in rates_te), rates_te      # measured: 0.239..0.269
    # not a brightness cut that one class passes wholesale: the thresholds differ by class
    assert thr.max() - thr.min() > 0.2, thr                             # measured: 0.171..0.476
    prop = pdata.Brightness(thr)
    items = [int(i) for i in np.flatnonzero(np.abs(v_te - thr[y_te]) < 2e-3)[:6]] + [0, 1, 2]
    batch = batch_of(test, items, 28, 1)
    scores = prop.scores(batch.images, [int(y) for y in batch.labels])
    assert np.array_equal(scores > 0, b_te[items])
    assert np.allclose(scores, v_te[items] - thr[y_te[items]], atol=1e-12, rtol=0)


def test_batches_are_drawn_with_distinct_labels_and_the_planned_property(splits):
    train, _ = splits
    values, labels = pdata.intensity_table(train)
    bright = pdata.has_property(values, labels, pdata.class_thresholds(values, labels, 10))
    plan = pdata.plan_batches(labels, bright, 3, 12, seed=5, stream=1)
    assert [has for _, has in plan] == [i % 2 == 1 for i in range(12)]
    for ids, has in plan:
        assert len(set(labels[ids])) == 3
        assert bool(bright[ids].any()) == has
    # reproducible, and more batches keep the earlier ones (resumed cells stay the same)
    assert pdata.plan_batches(labels, bright, 3, 16, seed=5, stream=1)[:12] == plan
    assert pdata.plan_batches(labels, bright, 3, 12, seed=6, stream=1) != plan


def test_bootstrap_auc_is_sklearns_auc():
    """The bootstrap's rank-sum AUC (many resamples at once) equals roc_auc_score, ties included."""
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    y = rng.random((50, 12)) < 0.5
    y[:, 0], y[:, 1] = True, False
    s = np.round(rng.random((50, 12)), 1)  # ties
    assert np.allclose(pstats.rank_aucs(y, s), [roc_auc_score(a, b) for a, b in zip(y, s)], atol=1e-12, rtol=0)
    boot = pstats.bootstrap_aucs(np.array([0, 1, 0, 1], bool), {"m": np.array([0.1, 0.9, 0.2, 0.3])}, seed=0)
    assert boot["m"].size > 0 and np.all((boot["m"] >= 0) & (boot["m"] <= 1))


def test_smoke_run_end_to_end(tmp_path):
    out = tmp_path / "prop"
    # inline: the cells run in this process (the same cells and numbers as the default process pool,
    # without a worker's start-up)
    result, folder = run_experiment("property-inference", make_options(out=str(out), smoke=True, progress=False,
                                                                       executor="inline"))
    for name in ("results.csv", "summary.csv", "results.md", "experiment.json"):
        assert (folder / name).is_file(), name
    assert result.figures == ["roc.png", "reconstructions.png"]
    for fig in result.figures:
        assert (folder / fig).read_bytes()[:8] == PNG
    rows = _csv(folder / "results.csv")
    assert list(rows[0]) == [output_name(c) for c in pi.COLUMNS]
    # every target is a row, half of them with the property (the plan), none dropped
    assert [int(r["target"]) for r in rows] == [0, 1, 2, 3]
    assert [r["property"] for r in rows] == ["False", "True", "False", "True"]
    assert all(r["attack_status"] == "ok" for r in rows)
    # the scorer's check: the truth score is > 0 exactly for the batches with the property
    for r in rows:
        assert (float(r["truth_score"]) > 0) == (r["property"] == "True")
        assert (int(r["bright_images"]) > 0) == (r["property"] == "True")
        assert 0.0 <= float(r["classifier_score"]) <= 1.0
    summary = {s["method"]: s for s in _csv(folder / "summary.csv")}
    assert set(summary) == {"truth", "classifier", "dlg", "dlg (converged)"}
    assert float(summary["truth"]["auc"]) == 1.0
    for s in summary.values():
        assert 0.0 <= float(s["auc"]) <= 1.0
        assert float(s["auc_ci_low"]) <= float(s["auc"]) <= float(s["auc_ci_high"])
        assert (int(s["targets"]), int(s["with_property"])) == (4, 2) or s["method"] == "dlg (converged)"
    # DLG really rebuilt the smoke targets (measured: 65-72 dB, label accuracy 1) and so reads the
    # property off them: its score is the truth's up to the reconstruction error, its AUC 1
    for r in rows:
        assert r["verdict"] == "leaked" and float(r["psnr_oracle_pairing"]) >= 40.0, r
        assert float(r["psnr_by_label"]) >= 40.0 and r["images_leaked"] == str(len(r["images"].split())), r
        assert sorted(r["labels_restored"].split()) == sorted(r["labels"].split())
        assert math.isclose(float(r["dlg_score"]), float(r["truth_score"]), abs_tol=1e-3)
    assert float(summary["dlg"]["auc"]) == 1.0 and int(summary["dlg"]["leaked"]) == 4
    md = (folder / "results.md").read_text()
    for key in ("data", "model", "property", "classifier", "samples", "seeds", "success threshold"):
        assert f"**{key}**" in md, key
    assert "0.94" in md and "0.92" in md and "Melis" in md
    assert any("very updates the attack received" in n for n in result.notes), result.notes
    assert json.loads((folder / "experiment.json").read_text())["cells"]["total"] == 4


@pytest.mark.parametrize("options, message", [
    (dict(attacks=["gradinversion"]), "one attack of the DLG family"),
    (dict(attacks=["dlg", "idlg"]), "one attack of the DLG family"),
    (dict(batch_sizes=[2, 4]), "one batch size"),
    (dict(batch_sizes=[11]), "distinct labels"),
    (dict(samples=1), "at least 2 target batches"),
    (dict(batches=1), "auxiliary updates"),
    (dict(data="cifar10-samples"), "train and test splits"),
])
def test_bad_options_are_one_line_errors_before_any_work(tmp_path, options, message):
    out = tmp_path / "bad"
    with pytest.raises(ConfigError, match=message):
        run_experiment("property-inference", make_options(out=str(out), smoke=True, progress=False, **options))
    assert not out.exists()  # the new folder is removed again


def test_cli_bad_option_exit_2(tmp_path, capsys):
    assert main(["experiment", "property-inference", "--out", str(tmp_path / "x"), "--smoke",
                 "--batch-sizes", "2,4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "one batch size" in err[0], err


def test_plan_honours_attacks_samples_and_batch_size(tmp_path, monkeypatch):
    """--attacks idlg, --samples 6, --batch-sizes 3: six cells of idlg on held-out test batches of
    three named images at native 28 px (no attack runs)."""
    from gradleak.experiments.cells import Workspace

    class Planned(Exception):
        pass

    def stop(self, cells, *, run_folders=()):
        raise Planned(dict(cells))

    monkeypatch.setattr(Workspace, "run", stop)
    with pytest.raises(Planned) as caught:
        run_experiment("property-inference", make_options(out=str(tmp_path / "p"), smoke=True, progress=False,
                                                          attacks=["idlg"], samples=6, batch_sizes=[3], batches=20))
    cells = caught.value.args[0]
    assert sorted(cells) == [("idlg", t) for t in range(6)]
    for cfg in cells.values():
        assert (cfg["attack"], cfg["split"], cfg["batch_size"], cfg["image_size"]) == ("idlg", "test", 3, 28)
        assert len(cfg["indices"]) == 3
    assert len({tuple(c["indices"]) for c in cells.values()}) == 6
