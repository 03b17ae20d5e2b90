"""GradInversion's gradient loss (``distance``: l2, the paper's Eq. 3, or cosine, its Table 5
alternative) and the gradient-loss experiment that compares them.

Observed at the smoke setting (1 torch thread; convnet width 16, 4 CIFAR-10 photos, 100
iterations x 2 seeds, seed 0): L_grad alone, l2 / cosine: sign match 70.1 / 71.7 %, cosine
distance 0.31 / 0.29, 8 rows inconclusive (neither converges at 100 steps); the cpu preset, l2 /
cosine: sign match 75.8 / 66.7 %, cosine distance 0.22 / 0.43, PSNR 16.6 / 14.4 dB.
"""

from __future__ import annotations

import csv
import hashlib
import json

import pytest
import torch

from gradleak.attacks import Engine
from gradleak.attacks.configs import resolve_attack
from gradleak.attacks.gradinversion import layer_counts
from gradleak.attacks.objectives import cosine, layer_l2
from gradleak.data import open_source, sample_batch
from gradleak.errors import ConfigError
from gradleak.experiments import make_options, run_experiment
from gradleak.experiments.gradient_loss import gradient_fit
from gradleak.fl import fedsgd
from gradleak.models import build_model


@pytest.fixture(scope="module")
def case():
    spec = build_model("convnet", num_classes=10, width=8)
    batch = sample_batch(open_source("cifar10-samples"), 2, seed=0, image_size=32, channels=3)
    return spec, fedsgd(spec, batch, share_bn_statistics=True)


def _attack(case, **values):
    spec, update = case
    cfg = resolve_attack({"attack": "gradinversion", "iterations": 6, "seeds": 2, "warmup": 1, **values},
                         bn_statistics_shared=True, layers=layer_counts(spec.module))
    return cfg, Engine().run(cfg, update, spec)


# --------------------------------------------------------------------------- the metric
def test_gradient_fit_values():
    truth = [torch.tensor([1.0, -2.0, 0.0]), torch.tensor([[3.0, 0.0]])]
    same = gradient_fit(truth, truth)
    assert same == {"gradient_l2": 0.0, "gradient_l2_total": 0.0, "sign_match": 100.0,
                    "cosine_distance": pytest.approx(0.0, abs=1e-15), "relative_distance": 0.0}
    answer = [torch.tensor([1.0, 2.0, 0.0]), torch.tensor([[-3.0, 1.0]])]
    fit = gradient_fit(answer, truth)
    # signs: +/+ match, -/+ not, 0/0 match, -/+ not, +/0 not: 2 of 5
    assert fit["sign_match"] == pytest.approx(40.0)
    assert fit["gradient_l2"] == pytest.approx(4.0 + (36.0 + 1.0) ** 0.5)          # per tensor, summed (Eq. 3)
    assert fit["gradient_l2_total"] == pytest.approx((16.0 + 37.0) ** 0.5)
    assert fit["relative_distance"] == pytest.approx(53.0 / 14.0)
    assert fit["cosine_distance"] == pytest.approx(1 - (1 - 4 - 9) / (14 ** 0.5 * 15 ** 0.5))
    # the same quantities as the attacks' objectives compute
    assert fit["gradient_l2"] == pytest.approx(float(layer_l2(answer, truth)))
    assert fit["cosine_distance"] == pytest.approx(float(cosine(answer, truth)))
    # scale: the cosine does not see it, l2 does
    scaled = gradient_fit([2 * t for t in truth], truth)
    assert scaled["cosine_distance"] == pytest.approx(0.0, abs=1e-12) and scaled["sign_match"] == 100.0
    assert scaled["relative_distance"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        gradient_fit(truth[:1], truth)


# --------------------------------------------------------------------------- the flag
def test_distance_default_is_l2_and_cosine_changes_the_run(case):
    cfg, default = _attack(case)
    assert cfg.distance == "l2"
    _, l2 = _attack(case, distance="l2")
    assert torch.equal(default.images, l2.images) and default.extra["settings"]["distance"] == "l2"
    cfg_cos, cos = _attack(case, distance="cosine")
    assert cfg_cos.distance == "cosine" and cos.extra["settings"]["distance"] == "cosine"
    assert not torch.equal(default.images, cos.images)
    # the recorded distance stays Eq. 3's l2 whichever loss was optimised: on the cosine run's best
    # seed it equals the l2 of its candidates' gradients (not a cosine in [0, 2])
    assert cos.extra["gradient_distance"] > 2.0


def test_cosine_is_scale_free_and_l2_is_not(case, monkeypatch):
    """The cosine objective is that of attacks/objectives (all layers together): scaling the
    target update does not change it, while Eq. 3's l2 moves."""
    import gradleak.attacks.gradinversion as gi

    seen: dict[str, list[torch.Tensor]] = {"l2": [], "cosine": []}
    terms = gi._Candidates.terms

    def spy(self, images):
        out = terms(self, images)
        seen[self.cfg.distance].append(out["grad"].detach())
        return out
    monkeypatch.setattr(gi._Candidates, "terms", spy)
    for distance in ("l2", "cosine"):
        _attack(case, distance=distance, iterations=1, alpha_g=1.0)
    assert bool((seen["cosine"][0] >= 0).all()) and bool((seen["cosine"][0] <= 2).all())
    assert bool((seen["l2"][0] > 2).all())


def test_distance_is_a_gradinversion_flag_only(tmp_path, capsys):
    from gradleak.cli import main

    base = ["attack", "--model", "convnet", "--width", "8", "--batch-size", "2", "--iterations", "2", "--no-progress",
            "--threads", "1", "--no-paper-metrics"]
    assert main([*base, "--attack", "ig", "--distance", "cosine", "--out", str(tmp_path / "ig")]) == 2
    assert "option --distance does not apply to attack 'ig'" in capsys.readouterr().err
    assert main([*base, "--attack", "gradinversion", "--seeds", "1", "--distance", "cosine",
                 "--out", str(tmp_path / "gi")]) == 0
    assert json.loads((tmp_path / "gi" / "config.json").read_text())["attack"]["distance"] == "cosine"


def test_distance_leaves_the_identity_of_earlier_cells_alone():
    """Added after cell stores were written: unset (None), a cell's identity is the one it had
    before the field existed; cosine is another cell."""
    from gradleak.config import make_config
    from gradleak.sweep.spec import HASHED_FIELDS, cell_identity, changed_defaults

    for attack in ("gradinversion", "dlg", "ig"):
        config = make_config(attack=attack, iterations=5).model_dump(mode="json")
        assert config["distance"] is None
        before = {k: v for k, v in config.items() if k != "distance"}
        assert cell_identity(config) == cell_identity(before)
    # the hash of before, written out: the config without the later fields (every field not in
    # HASHED_FIELDS: --box, --distance, later attacks' flags), with its changed defaults
    legacy = {k: v for k, v in config.items() if k in HASHED_FIELDS}
    legacy["defaults"] = changed_defaults(config)
    text = json.dumps(legacy, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert cell_identity(config) == hashlib.sha256(text.encode()).hexdigest()[:16]
    gi = make_config(attack="gradinversion", iterations=5).model_dump(mode="json")
    assert cell_identity({**gi, "distance": "cosine"}) != cell_identity(gi)


# --------------------------------------------------------------------------- the experiment
def test_gradient_loss_smoke(tmp_path):
    out = tmp_path / "gl"
    result, folder = run_experiment("gradient-loss", make_options(out=str(out), smoke=True, progress=False,
                                                                  iterations=30, threads=1))
    rows = list(csv.DictReader((folder / "results.csv").open()))
    assert len(rows) == 2 * 2 * 4                                   # objectives x losses x images, nothing dropped
    assert {(r["objective"], r["distance"]) for r in rows} == {(o, d) for o in ("grad", "full")
                                                               for d in ("l2", "cosine")}
    for r in rows:
        assert 0.0 <= float(r["sign_match"]) <= 100.0 and 0.0 <= float(r["cosine_distance"]) <= 2.0
        assert float(r["gradient_l2"]) >= float(r["gradient_l2_total"]) > 0.0
        assert r["verdict"] in ("leaked", "inconclusive") and r["converged"] in ("True", "False")
    # the l2 cells leave the flag unset (the other experiments' cells); the cosine cells set it
    cells = list(csv.DictReader((folder / "cells" / "results.csv").open()))
    assert sorted(c["distance"] or "unset" for c in cells) == ["cosine", "cosine", "unset", "unset"]
    recorded = [json.loads(p.read_text())["attack"] for p in (folder / "cells" / "runs").glob("*/config.json")]
    assert sorted(c["distance"] for c in recorded) == ["cosine", "cosine", "l2", "l2"]   # resolved
    md = (folder / "results.md").read_text()
    assert "paper (ResNet-50, ImageNet)" in md and "5.965" in md and "3.835" in md
    summary = list(csv.DictReader((folder / "summary.csv").open()))
    assert len(summary) == 4 and all(int(s["images"]) == 4 for s in summary)
    for fig in result.figures:
        assert (folder / fig).stat().st_size > 1000
    # the full preset's answers stay near the pixel box: the fit of the returned answer is the
    # attack's own Eq. 3 distance of its final answer, up to the clamp
    for r in rows:
        if r["objective"] == "full":
            assert float(r["gradient_l2"]) == pytest.approx(float(r["gradient_distance"]), rel=0.1)
    with pytest.raises(ConfigError, match="attacks"):
        run_experiment("gradient-loss", make_options(out=str(tmp_path / "x"), smoke=True, attacks=["dlg"]))
