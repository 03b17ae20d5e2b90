"""Issue 17: an experiment's numbers must never show a failed attack as a protected client.

Every row of results.csv carries the attack's own verdict (``converged``, from the run's
metrics.json) and a ``verdict``: leaked / defended / inconclusive (gradleak/outcome.py); a summary
per setting gives mean, spread and the non-converged count; the defenses table's ``defended`` needs
outcome.py's positive evidence; the defaults run at least 3 samples per setting outside --smoke. Stubbed cells (no attack
runs) except for one 2-iteration attack.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gradleak.experiments import make_options, run_experiment
from gradleak.experiments.cells import CellResult, Checkpoint, Trained, Workspace
from gradleak.experiments.common import (DEFENDED, INCONCLUSIVE, LEAKED, converged_of, summarize, trend_notes,
                                         verdict_of)

ATTACKING = ("ablation", "batch-size", "comparison", "defenses", "identifiability", "local-iterations", "model-size",
             "optimizers", "training-stage")


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _fake_trained(self: Workspace, cfg: Any, name: str = "model") -> Trained:
    folder = self.folder / "training" / name
    cps = [Checkpoint(fraction=float(f), path=folder / f"checkpoint-{f:.2f}.safetensors", test_accuracy=0.5)
           for f in cfg.checkpoints]
    return Trained(folder=folder, checkpoints=cps, final_accuracy=0.5, epsilon=None, train_images=10, test_images=10,
                   total_steps=1, wall_seconds=0.0)


def _metrics(psnr: float, converged: bool | None, evidence: dict[str, Any] | None = None) -> dict[str, Any]:
    """A stubbed cell's metrics; ``evidence``: what outcome.py needs beyond them for "defended"."""
    m: dict[str, Any] = {"psnr_mean": psnr, "ssim_mean": 0.2, "mse_mean": 10 ** (-psnr / 10), "label_accuracy": 1.0,
                         "iterations": 2, "wall_seconds": 0.1, "update": {"loss": 1.0},
                         "per_image": [{"index": 0, "psnr": psnr, "ssim": 0.2, "label_true": 0, "label_restored": 0}]}
    if converged is not None:
        m["converged"] = converged
        m["convergence"] = {"converged": converged, "relative_gradient_distance": 1e-9 if converged else 0.3,
                            "threshold": 1e-4, "plateau": not converged, "restarts_used": 0, "reason": "stub"}
    return {**m, **(evidence or {})}


# outcome.py's positive evidence for "defended": a defense whose noise floor exceeds the attack's
# line, an answer that fits like the truth, nothing identified, a control that leaked
DEFENDED_EVIDENCE = {"defenses": ["laplace:0.1"], "relative_gradient_distance": 0.9, "truth_relative_distance": 0.9,
                     "control": {"verdict": "leaked"}}


# --------------------------------------------------------------------------- the rules
def test_verdict_needs_positive_evidence_to_say_defended():
    for conv in (True, False, None):   # rebuilt by the experiment's rule: a leak, whatever else
        assert verdict_of(_metrics(5.0, conv), True) == LEAKED
    assert verdict_of(_metrics(5.0, True), False) == INCONCLUSIVE      # converged, but no defense / evidence
    assert verdict_of(_metrics(5.0, False), False) == INCONCLUSIVE
    assert verdict_of(_metrics(5.0, None), False) == INCONCLUSIVE       # no verdict recorded: never protection
    assert verdict_of(_metrics(5.0, True), None) == INCONCLUSIVE
    conv = {"convergence": {"converged": True, "relative_gradient_distance": 0.9, "noise_floor": 0.9}}
    assert verdict_of(_metrics(5.0, True, {**DEFENDED_EVIDENCE, **conv}), False) == DEFENDED
    assert verdict_of(_metrics(25.0, True, {**DEFENDED_EVIDENCE, **conv}), False) == LEAKED   # outcome's 20 dB
    assert converged_of({}) is None
    assert converged_of({"converged": False}) is False
    assert converged_of({"convergence": {"converged": True}}) is True


def test_summary_gives_mean_spread_and_non_converged_over_every_sample():
    rows = [{"k": 1, "sample": 0, "psnr": 40.0, "converged": True, "verdict": LEAKED},
            {"k": 1, "sample": 1, "psnr": 30.0, "converged": True, "verdict": LEAKED},
            {"k": 1, "sample": 2, "psnr": 5.0, "converged": False, "verdict": INCONCLUSIVE},
            {"k": 2, "sample": 0, "psnr": 10.0, "converged": True, "verdict": DEFENDED},
            {"k": 2, "sample": 1, "psnr": 12.0, "converged": None, "verdict": INCONCLUSIVE}]
    s1, s2 = summarize(rows, ["k"])
    assert (s1["k"], s1["samples"], s1["non_converged"]) == (1, 3, 1)
    assert s1["psnr_mean"] == pytest.approx(25.0)                   # all samples, the failed one included
    assert s1["psnr_mean_converged"] == pytest.approx(35.0)         # the converged ones only
    assert s1["psnr_std"] == pytest.approx(math.sqrt(((15) ** 2 + 5 ** 2 + 20 ** 2) / 2))  # n - 1
    assert (s1["psnr_min"], s1["psnr_max"]) == (5.0, 40.0)
    assert (s1["leaked"], s1["defended"], s1["inconclusive"]) == (2, 0, 1)
    assert (s2["samples"], s2["non_converged"], s2["inconclusive"], s2["defended"]) == (2, 0, 1, 1)
    assert s2["psnr_mean_converged"] == pytest.approx(10.0)
    # A trend that should fall: K=1 -> K=2 falls, nothing flagged; a rise is flagged with its numbers.
    assert "No neighbouring settings contradict" in trend_notes([s1, s2], "k", falls=True, claim="falls")[0]
    flag = trend_notes([s1, s2], "k", falls=False, claim="rises")
    assert len(flag) == 1 and "CONTRADICTS" in flag[0] and "25.00 -> 11.00" in flag[0] and "inconclusive 1/3" in flag[0]


# --------------------------------------------------------------------------- defenses: defended needs convergence
def test_defenses_non_converged_attack_is_inconclusive_never_defended(tmp_path, monkeypatch):
    """Stubbed cells (no training, no attack): per defense spec, the PSNR and the run's verdict."""
    outcome = {None: (50.0, True), "gaussian:0.0001": (48.0, False),   # rebuilt although not converged: leaked
               "gaussian:0.1": (5.0, False),                           # failed attack: inconclusive
               "laplace:0.1": (6.0, True),                             # with outcome.py's evidence: defended
               "prune:0.9": (4.0, None)}                               # no verdict recorded: inconclusive

    def fake_run(self, cells, *, run_folders=()):
        out = {}
        for i, (key, cfg) in enumerate(cells.items()):
            spec = (cfg.get("defense") or [None])[0]
            psnr, conv = outcome.get(spec, (45.0, True))
            evidence = None
            if spec == "laplace:0.1":
                evidence = {**DEFENDED_EVIDENCE, "convergence": {"converged": True, "relative_gradient_distance": 0.9,
                                                                 "noise_floor": 0.9}}
            out[key] = CellResult(key=key, cell_id=f"c{i}", config=dict(cfg), status="ok",
                                  metrics=_metrics(psnr, conv, evidence))
        self.report.total += len(out)
        return out

    monkeypatch.setattr(Workspace, "run", fake_run)
    monkeypatch.setattr(Workspace, "trained", _fake_trained)
    out = tmp_path / "def"
    result, _ = run_experiment("defenses", make_options(out=str(out), smoke=True, progress=False, samples=3,
                                                        executor="inline", attacks=["idlg"]))
    rows = _csv(out / "results.csv")
    assert len(rows) == 3 * len({r["spec"] for r in rows}) == len(result.rows)  # every sample a row
    by_spec = {r["spec"]: r for r in rows}
    assert (by_spec[""]["verdict"], by_spec[""]["defended"], by_spec[""]["converged"]) == (LEAKED, "False", "True")
    assert (by_spec["gaussian:0.0001"]["verdict"], by_spec["gaussian:0.0001"]["defended"]) == (LEAKED, "False")
    assert by_spec["gaussian:0.1"]["verdict"] == INCONCLUSIVE and by_spec["gaussian:0.1"]["defended"] == "False"
    assert by_spec["gaussian:0.1"]["converged"] == "False"
    assert by_spec["laplace:0.1"]["verdict"] == DEFENDED and by_spec["laplace:0.1"]["defended"] == "True"
    assert by_spec["prune:0.9"]["verdict"] == INCONCLUSIVE and by_spec["prune:0.9"]["converged"] == ""
    for r in rows:  # defended is exactly outcome.py's verdict
        assert r["defended"] == str(r["verdict"] == DEFENDED)
    summary = {r["spec"]: r for r in _csv(out / "summary.csv")}
    header = (out / "summary.csv").read_text().splitlines()[0].split(",")
    assert len(header) == len(set(header))   # one "defended": the setting's
    assert summary["gaussian:0.1"]["verdict"] == INCONCLUSIVE and summary["gaussian:0.1"]["defended"] == "False"
    assert summary["gaussian:0.1"]["non_converged"] == "3" and summary["gaussian:0.1"]["inconclusive"] == "3"
    assert summary["laplace:0.1"]["verdict"] == "defended" and summary["laplace:0.1"]["defended"] == "True"
    assert summary[""]["verdict"] == LEAKED and summary[""]["samples"] == "3"
    md = (out / "results.md").read_text()
    assert "## Summary per setting" in md and "idlg, gaussian:0.1: INCONCLUSIVE, not defended" in md
    assert "recorded no convergence verdict" in md and "did NOT converge" in md
    assert json.loads((out / "experiment.json").read_text())["summary"][0]["samples"] == 3


# --------------------------------------------------------------------------- a real 2-iteration attack
def test_a_two_iteration_attack_is_inconclusive_not_a_protected_client(tmp_path):
    out = tmp_path / "bs"
    run_experiment("batch-size", make_options(out=str(out), smoke=True, progress=False, executor="inline",
                                              attacks=["idlg"], batch_sizes=[1], samples=1, iterations=2))
    (row,) = _csv(out / "results.csv")
    assert float(row["psnr_oracle_pairing"]) < 20.0 and row["recovered"] == "False"
    # one image: the paper's pairing by restored label is the pixels' pairing
    assert float(row["psnr_by_label"]) == pytest.approx(float(row["psnr_oracle_pairing"]))
    assert float(row["zero_psnr"]) > 0 and float(row["prior_psnr"]) > 0 and row["images_leaked"] in ("0", "1")
    assert row["converged"] in ("False", "")   # "" until the runs record their verdict
    # never a protected client; measured: 16.1 dB but SSIM 0.54 against the photo, which
    # outcome.py's recognisable line (SSIM >= 0.5) reads as a leak whatever the PSNR
    assert row["verdict"] == (LEAKED if float(row["ssim"]) >= 0.5 else INCONCLUSIVE)
    (s,) = _csv(out / "summary.csv")
    assert s["defended"] == "0" and s["samples"] == "1"


# --------------------------------------------------------------------------- trends flagged in results.md
def test_batch_size_flags_a_row_against_its_trend(tmp_path, monkeypatch):
    psnr = {1: [30.0, 32.0, 31.0], 2: [45.0, 44.0, 7.0]}   # K=2 rises over K=1 in the mean: against the trend

    def fake_run(self, cells, *, run_folders=()):
        return {key: CellResult(key=key, cell_id=str(key), config=dict(cfg), status="ok",
                                metrics=_metrics(psnr[key[1]][key[2]], key[2] != 2))
                for key, cfg in cells.items()}

    monkeypatch.setattr(Workspace, "run", fake_run)
    out = tmp_path / "bs"
    run_experiment("batch-size", make_options(out=str(out), smoke=True, progress=False, attacks=["dlg"],
                                              batch_sizes=[1, 2], samples=3, executor="inline"))
    md = (out / "results.md").read_text()
    assert "CONTRADICTS the stated trend (leakage falls as the batch size grows) for attack dlg: batch_size 1 -> 2" in md
    assert "31.00 -> 32.00" in md and "inconclusive 0/3 / 1/3" in md
    (s1, s2) = _csv(out / "summary.csv")
    assert (s2["psnr_oracle_pairing_mean"], s2["psnr_oracle_pairing_mean_converged"], s2["non_converged"]) == \
        ("32.0", "44.5", "1")


# --------------------------------------------------------------------------- default samples
class _Planned(Exception):
    def __init__(self, cells: dict[Any, dict[str, Any]]):
        super().__init__("planned")
        self.cells = cells


def _plan(name: str, tmp_path: Path, monkeypatch, **options: Any) -> dict[Any, dict[str, Any]]:
    def stop(self, cells, *, run_folders=()):
        raise _Planned(dict(cells))

    monkeypatch.setattr(Workspace, "run", stop)
    monkeypatch.setattr(Workspace, "trained", _fake_trained)
    with pytest.raises(_Planned) as caught:
        run_experiment(name, make_options(out=str(tmp_path / name), progress=False, **options))
    return caught.value.cells


@pytest.mark.parametrize("name", ATTACKING)
def test_default_samples_per_setting_are_at_least_three_outside_smoke(name, tmp_path, monkeypatch):
    """The cells an experiment plans at its defaults (no attack runs): every setting (a cell's
    config without its seed) is attacked with at least 3 seeds; --smoke keeps 1."""
    def per_setting(cells: dict[Any, dict[str, Any]]) -> Counter:
        # a text cell's --text sentence is its sample's held-out data, drawn by the seed like an image
        return Counter(json.dumps({k: v for k, v in c.items() if k not in ("seed", "text")}, sort_keys=True,
                                  default=str) for c in cells.values())

    full = per_setting(_plan(name, tmp_path / "full", monkeypatch))
    assert min(full.values()) >= 3, (name, sorted(full.values()))
    smoke = per_setting(_plan(name, tmp_path / "smoke", monkeypatch, smoke=True))
    assert min(smoke.values()) >= 1 and sum(smoke.values()) < sum(full.values())


def test_training_stage_runs_the_attack_asked_for_or_refuses(tmp_path):
    """--attacks is not ignored: dlg (the rebuttal's), idlg or rgap; anything else is an error, and
    so is --iterations for the closed form."""
    from gradleak.errors import ConfigError

    for attacks in (["gradinversion"], ["dlg", "idlg"]):
        with pytest.raises(ConfigError, match="runs one attack"):
            run_experiment("training-stage", make_options(out=str(tmp_path / "t"), smoke=True, progress=False,
                                                          attacks=attacks, executor="inline"))
    with pytest.raises(ConfigError, match="--iterations does not apply to rgap"):
        run_experiment("training-stage", make_options(out=str(tmp_path / "t"), smoke=True, progress=False,
                                                      attacks=["rgap"], iterations=50, executor="inline"))


def test_experiments_refuse_attacks_they_would_not_run(tmp_path):
    from gradleak.errors import ConfigError

    for name, attacks in (("local-iterations", ["dlg", "idlg"]), ("local-iterations", ["gradinversion"]),
                          ("defenses", ["gradinversion"]), ("ablation", ["dlg"]), ("identifiability", ["ig"]),
                          ("optimizers", ["idlg"])):
        with pytest.raises(ConfigError, match="--attacks"):
            run_experiment(name, make_options(out=str(tmp_path / name), smoke=True, progress=False, attacks=attacks,
                                              executor="inline"))
    with pytest.raises(ConfigError, match="one batch size"):
        run_experiment("ablation", make_options(out=str(tmp_path / "ab"), smoke=True, progress=False,
                                                batch_sizes=[2, 4], executor="inline"))


def test_defenses_runs_each_attack_named(tmp_path, monkeypatch):
    """--attacks imprint,dlg: the dlg cells run dlg (not the first attack named)."""
    seen = []

    def fake_run(self, cells, *, run_folders=()):
        seen.extend(cfg["attack"] for cfg in cells.values())
        raise RuntimeError("stop")

    monkeypatch.setattr(Workspace, "run", fake_run)
    monkeypatch.setattr(Workspace, "trained", _fake_trained)
    with pytest.raises(RuntimeError, match="stop"):
        run_experiment("defenses", make_options(out=str(tmp_path / "d"), smoke=True, progress=False,
                                                attacks=["imprint", "dlg"], executor="inline"))
    assert set(seen) == {"imprint", "dlg"}


def test_defenses_plans_trap_like_imprint_and_cpa_on_the_mlp_batch(tmp_path, monkeypatch):
    """Issue 41: trap rows attack the same image and the same defended update as the imprint rows
    (only the attack and the server differ); cpa rows the mlp on a batch of 16 held-out images
    (labels may repeat); the mlp is trained under every setting for their accuracy column; the
    refusal names every attack the experiment compares."""
    from gradleak.errors import ConfigError
    from gradleak.experiments import defense_tradeoff as dt

    planned: dict = {}
    trained: list = []

    def fake_run(self, cells, *, run_folders=()):
        planned.update(cells)
        return {key: CellResult(key=key, cell_id=f"c{i}", config=dict(cfg), status="ok", metrics=_metrics(5.0, False))
                for i, (key, cfg) in enumerate(cells.items())}

    def fake_trained(self, cfg, name="model"):
        trained.append((cfg.model, name))
        return _fake_trained(self, cfg, name)

    monkeypatch.setattr(Workspace, "run", fake_run)
    monkeypatch.setattr(Workspace, "trained", fake_trained)
    result, _ = run_experiment("defenses", make_options(out=str(tmp_path / "d"), smoke=True, progress=False,
                                                        executor="inline"))
    assert {r["model"] for r in result.rows if r["attack"] == "cpa"} == {"mlp"}
    assert {r["model"] for r in result.rows if r["attack"] == "text-dlg"} == {"tiny-transformer"}
    assert {r["model"] for r in result.rows if r["attack"] not in ("cpa", "text-dlg")} == {"lenet-dlg"}
    assert dt.ATTACKS[:3] == ("dlg", "idlg", "imprint")   # the existing columns keep their order
    assert {a for a, _, _ in planned} == set(dt.DEFAULT_ATTACKS) == {"dlg", "idlg", "imprint", "trap", "cpa",
                                                                     "text-dlg"}
    for (a, i, s), cfg in planned.items():
        if a == "trap":
            imprint = planned[("imprint", i, s)]
            assert {**cfg, "attack": "imprint", "server": "imprint"} == imprint
            assert cfg["model"] == "lenet-dlg" and cfg["batch_size"] == 1 and cfg["split"] == "test"
        elif a == "cpa":
            assert (cfg["model"], cfg["batch_size"], cfg["allow_repeats"], cfg["split"]) == ("mlp", 16, True, "test")
            assert cfg["defense"] == planned[("idlg", i, s)]["defense"] and cfg["seed"] == planned[("idlg", i, s)]["seed"]
            assert "server" not in cfg
        elif a == "text-dlg":   # issue 42: the text row, one held-out sentence (the sample's), the same defense
            assert (cfg["attack"], cfg["modality"], cfg["model"]) == ("dlg", "text", "tiny-transformer")
            assert cfg["text"] == [dt.text_sentence(cfg["seed"])] and cfg["text"][0] in dt.TEXT_POOL
            assert cfg["defense"] == planned[("idlg", i, s)]["defense"] and cfg["seed"] == planned[("idlg", i, s)]["seed"]
    assert len({dt.text_sentence(seed) for seed in range(8)}) > 4   # the samples' sentences differ
    settings = len(dt.SMOKE_SETTINGS)
    assert Counter(m for m, _ in trained) == {"lenet-dlg": settings, "mlp": settings}
    assert ("lenet-dlg", "none") in trained and ("mlp", "mlp-none") in trained   # the LeNet's names unchanged
    with pytest.raises(ConfigError, match="dlg, idlg, imprint, trap, cpa, text-dlg and text-tag; got --attacks ig"):
        run_experiment("defenses", make_options(out=str(tmp_path / "r"), smoke=True, progress=False, attacks=["ig"],
                                                executor="inline"))


def test_optimizers_verdict_uses_the_common_leak_line_not_its_time_target(tmp_path, monkeypatch):
    """A converged DLG answer at 22 dB has rebuilt the photo: 'leaked' (the experiments' 20 dB
    line), although it did not reach the optimizers experiment's 30 dB time-to-quality target (it
    read 'not rebuilt' before: a client called protected by the wrong threshold)."""
    psnr = {"lbfgs": 22.0, "adam": 12.0, "sgd": 45.0}

    def fake_run(self, cells, *, run_folders=()):
        return {key: CellResult(key=key, cell_id=str(key), config=dict(cfg), status="ok",
                                metrics=_metrics(psnr[key[0]], key[0] != "adam" or key[1] == 0))
                for key, cfg in cells.items()}

    monkeypatch.setattr(Workspace, "run", fake_run)
    monkeypatch.setattr(CellResult, "history", lambda self: [])
    out = tmp_path / "opt"
    run_experiment("optimizers", make_options(out=str(out), smoke=True, progress=False, samples=2, executor="inline"))
    rows = {(r["optimizer"], r["sample"]): r for r in _csv(out / "results.csv")}
    assert rows[("lbfgs", "0")]["verdict"] == LEAKED and rows[("lbfgs", "0")]["reached"] == "False"
    # adam below the line: converged or not, no defense was applied, so nothing is "defended"
    assert rows[("adam", "0")]["verdict"] == INCONCLUSIVE and rows[("adam", "1")]["verdict"] == INCONCLUSIVE
    assert rows[("sgd", "1")]["verdict"] == LEAKED


@pytest.mark.parametrize("attacks, word", [("text-nope", "text attack"), ("nope", "attack")])
def test_experiment_attacks_names_checked_before_anything_runs(attacks, word, tmp_path, capsys):
    """--attacks text-NAME names a text attack (the defenses experiment's text rows): an unknown
    one is one error line, exit 2, nothing written."""
    from gradleak.cli import main
    out = tmp_path / "d"
    try:
        code = main(["experiment", "defenses", "--smoke", "--attacks", attacks, "--out", str(out)])
    except SystemExit as exc:
        code = exc.code
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1 and f"unknown {word} 'nope'" in err[0], err
    assert not out.exists()


def test_defenses_default_leaves_the_text_row_out_without_the_text_extra(tmp_path, monkeypatch):
    """Without gradleak[text] the default plans no text cell (they could only fail) and says why."""
    from gradleak.experiments import defense_tradeoff as dt

    monkeypatch.setattr(dt, "text_extra", lambda: False)
    planned = _plan("defenses", tmp_path, monkeypatch, smoke=True)
    assert {c["attack"] for c in planned.values()} == {"dlg", "idlg", "imprint", "trap", "cpa"}
    assert not any(c.get("modality") == "text" for c in planned.values())
    monkeypatch.setattr(dt, "text_extra", lambda: True)
    planned = _plan("defenses", tmp_path / "with", monkeypatch, smoke=True)
    assert any(c.get("modality") == "text" for c in planned.values())
