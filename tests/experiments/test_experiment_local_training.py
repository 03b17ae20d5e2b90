"""Issue 59, item 5: `gradleak experiment local-training`: its designs, its worst case per image, and a
real run of its --smoke grid (one client of 4 Fashion-MNIST photos, SGD momentum + weight decay, DLG)."""

from __future__ import annotations

import csv

import pytest

from gradleak.errors import ConfigError
from gradleak.experiments import local_training as lt
from gradleak.experiments import make_options, run_experiment
from gradleak.experiments.local_training import clients, worst_rows


def test_designs():
    assert len(clients("factorial")) == 54
    one = clients("one-factor")
    assert one[0] == lt.BASE and len(one) == len(set(one))
    assert not set(one) & set(lt.LEFT_OUT) and set(lt.CORNERS) <= set(one)
    assert set(lt.CONTROLS) <= set(one) and all(c.local_batch_size == c.local_data for c in lt.CONTROLS)
    varied = [c for c in one if c not in lt.CORNERS + lt.CONTROLS]
    assert len(varied) == 7   # the base; E 1, 5; K 16 (64 left out); plain SGD, Adam; crop-flip
    for c in varied[1:]:   # each differs from the base in exactly one factor
        assert sum(a != b for a, b in zip(c, lt.BASE, strict=True)) == 1


def test_worst_case_is_per_image():
    common = dict(epochs=1, local_data=2, optimizer="sgd", augment="none", local_batch_size=2, attacker="modelled", sample=0,
                  converged=False, zero_psnr=9.0, prior_psnr=10.0, ssim_by_label=None)
    rows = [{**common, "attack": "dlg", "image": 0, "psnr": 25.0, "psnr_by_label": 25.0, "ssim": 0.9, "verdict": "leaked"},
            {**common, "attack": "dlg", "image": 1, "psnr": 8.0, "psnr_by_label": 7.0, "ssim": 0.1,
             "verdict": "inconclusive"},
            {**common, "attack": "ig", "image": 0, "psnr": 12.0, "psnr_by_label": 12.0, "ssim": 0.3,
             "verdict": "inconclusive"},
            {**common, "attack": "ig", "image": 1, "psnr": 11.0, "psnr_by_label": 6.0, "ssim": 0.2,
             "verdict": "defended"}]
    w = {r["image"]: r for r in worst_rows(rows)}
    assert w[0]["psnr"] == 25.0 and w[0]["verdict"] == "leaked" and w[0]["leaked_by"] == "dlg"
    # image 1: the best of each pairing separately; one attack inconclusive -> not defended
    assert (w[1]["psnr"], w[1]["psnr_by_label"], w[1]["verdict"]) == (11.0, 7.0, "inconclusive")
    assert w[0]["batch_verdict"] == w[1]["batch_verdict"] == "leaked"


def test_refuses_attacks_that_do_not_apply(tmp_path):
    with pytest.raises(ConfigError, match="local-training runs dlg and ig"):
        run_experiment("local-training", make_options(out=str(tmp_path / "x"), attacks=["rgap"], progress=False))
    assert not (tmp_path / "x").exists()


def test_local_training_smoke(tmp_path):
    """--smoke, DLG only (40 iterations): one client of 4 Fashion-MNIST photos, one epoch in
    mini-batches of 2 (two steps), SGD momentum 0.9 + weight decay 5e-4. Measured: the modelled
    attacker 22.8 / 35.8 / 27.4 / 31.2 dB, the plain-SGD attacker 3.9-5.6 dB on the same update."""
    out = tmp_path / "lt"
    result, folder = run_experiment("local-training", make_options(out=str(out), smoke=True, attacks=["dlg"],
                                                                   progress=False))
    with (folder / "results.csv").open(newline="") as f:
        table = list(csv.DictReader(f))
    for col in ("epochs", "local_data", "optimizer", "augment", "attacker", "attack", "psnr_by_label",
                "psnr_oracle_pairing", "zero_psnr", "prior_psnr", "verdict", "batch_verdict", "client_model"):
        assert col in table[0], col
    assert (folder / "summary.csv").is_file() and "reconstructions.png" in result.figures
    assert {(r["attacker"], r["attack"]) for r in result.rows} == {
        ("modelled", "dlg"), ("plain-sgd", "dlg"), ("modelled", lt.WORST), ("plain-sgd", lt.WORST)}
    assert all(r["local_steps"] == 2 for r in result.rows)
    modelled = [r for r in result.rows if r["attack"] == lt.WORST and r["attacker"] == "modelled"]
    plain = [r for r in result.rows if r["attack"] == lt.WORST and r["attacker"] == "plain-sgd"]
    assert len(modelled) == len(plain) == 4
    assert sum(r["psnr"] for r in modelled) / 4 >= 25.0
    assert sum(r["verdict"] == "leaked" and r["psnr"] > r["prior_psnr"] + 10 for r in modelled) >= 3
    assert sum(r["psnr"] for r in plain) / 4 < 12.0        # plain SGD's model of a momentum client does worse
    assert all(r["verdict"] != "defended" for r in plain)
