"""The feature-extractor experiment (GradInversion Table 3): its pairs attack the same batches at
the same budget, the random-weights EfficientNet-Lite0 is the pretrained one's architecture
without its weights, the notes read a pair honestly, and the experiment runs end to end at a
smoke size (3 iterations: what is checked is the plumbing, not the PSNR)."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from gradleak.errors import ConfigError
from gradleak.experiments import make_options, run_experiment
from gradleak.experiments import feature_extractor as fe
from gradleak.experiments.common import VERDICTS
from gradleak.models import build_model


def test_random_efficientnet_is_the_pretrained_architecture_without_its_weights():
    rnd = build_model("efficientnet-lite0-random", num_classes=1000, image_size=64, seed=0)
    again = build_model("efficientnet-lite0-random", num_classes=1000, image_size=64, seed=0)
    other = build_model("efficientnet-lite0-random", num_classes=1000, image_size=64, seed=1)
    pre = build_model("efficientnet-lite0", num_classes=1000, image_size=64, seed=0)
    a, b, c, p = (dict(m.module.state_dict()) for m in (rnd, again, other, pre))
    assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in p.items()}
    assert all(torch.equal(a[k], b[k]) for k in a)  # seeded
    assert not torch.equal(a["_conv_stem.weight"], c["_conv_stem.weight"])
    assert not torch.equal(a["_conv_stem.weight"], p["_conv_stem.weight"])
    assert not torch.equal(a["_fc.weight"], p["_fc.weight"])
    assert (rnd.mean, rnd.std) == (pre.mean, pre.std) and rnd.classifier_name == "_fc"
    assert not any(isinstance(m, torch.nn.Dropout) for m in rnd.module.modules())


def test_pairs_share_batches_and_budget():
    plan = fe.plan_cells(make_options(out="unused"), checkpoint="/ckpt.safetensors")
    assert len(plan) == len(fe.PAIRS) * 2 * fe.SAMPLES[1]
    for pair in fe.PAIRS:
        for s in range(fe.SAMPLES[1]):
            w, st = plan[(pair.name, "weaker", s)], plan[(pair.name, "stronger", s)]
            differs = {k for k in w.keys() | st.keys() if w.get(k) != st.get(k)}
            assert differs and differs <= {"model", "width", "checkpoint"}, (pair.name, differs)
            assert w["seed"] == s and w["attack"] == "gradinversion" and w["share_bn_statistics"]
            assert (w["iterations"], w["seeds"], w["batch_size"]) == (fe.ITERATIONS[1], fe.SEEDS, fe.BATCH_SIZE)
    assert plan[("training", "stronger", 0)]["checkpoint"] == "/ckpt.safetensors"
    assert "checkpoint" not in plan[("training", "weaker", 0)]
    assert plan[("pretraining", "weaker", 0)]["model"] == "efficientnet-lite0-random"
    assert plan[("pretraining", "stronger", 0)]["image_size"] == 64
    smoke = fe.plan_cells(make_options(out="unused", smoke=True, iterations=7), checkpoint=None)
    assert ("training", "stronger", 0) not in smoke and {c["iterations"] for c in smoke.values()} == {7}


@pytest.mark.parametrize("flag", [dict(model="convnet"), dict(data="cifar10-samples"), dict(attacks=["ig"]),
                                  dict(width=8), dict(batch_sizes=[2, 4])])
def test_fixed_options_are_refused(flag, tmp_path):
    with pytest.raises(ConfigError):
        run_experiment("feature-extractor", make_options(out=str(tmp_path / "x"), smoke=True, **flag))
    assert not (tmp_path / "x").exists()


def _summary(pair, weaker, stronger, flat=5.0, non_converged=(1, 1)):
    return [{"pair": pair, "role": role, "network": f"{pair} {role}", "samples": 2, "psnr_mean": v, "psnr_std": 0.1,
             "fft2d_mean": 0.1, "flat_psnr_mean": flat, "non_converged": nc}
            for role, v, nc in (("weaker", weaker, non_converged[0]), ("stronger", stronger, non_converged[1]))]


def _rows(pair, weaker, stronger):
    return [{"pair": pair, "role": role, "sample": s, "psnr": v[s]}
            for role, v in (("weaker", weaker), ("stronger", stronger)) for s in range(len(v))]


def test_pair_notes_read_each_pair():
    rows = _rows("depth", [10, 12], [13, 11]) + _rows("training", [9, 9], [8, 8]) + _rows("pretraining", [3, 3], [4, 4])
    summary = (_summary("depth", 11.0, 12.0, non_converged=(0, 0)) + _summary("training", 9.0, 8.0)
               + _summary("pretraining", 3.0, 4.0))
    notes = {n.split(" ", 1)[0]: n for n in fe.pair_notes(rows, summary)}
    assert "+1.00 dB" in notes["depth"] and "in the mean, not on every batch" in notes["depth"]
    assert "comparison of converged runs" in notes["depth"] and "stronger higher on 1 of 2" in notes["depth"]
    assert "CONTRADICTS" in notes["training"] and "inconclusive, not evidence" in notes["training"]
    assert "equal budget only" in notes["training"]
    assert "neither network" in notes["pretraining"] and "agrees" not in notes["pretraining"]


def test_smoke_runs_every_pair_on_the_same_images(tmp_path):
    result, folder = run_experiment("feature-extractor", make_options(
        out=str(tmp_path / "fe"), smoke=True, iterations=3, threads=1, progress=False))
    with (folder / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(fe.PAIRS) * 2 * fe.BATCH_SIZE  # one sample, every image a row
    for pair in fe.PAIRS:
        sel = {role: [r for r in rows if r["pair"] == pair.name and r["role"] == role] for role in fe.ROLES}
        assert [r["name"] for r in sel["weaker"]] == [r["name"] for r in sel["stronger"]]
        assert [r["flat_psnr"] for r in sel["weaker"]] == [r["flat_psnr"] for r in sel["stronger"]]
        assert {r["model"] for r in sel["stronger"]} == {pair.stronger.model}
    assert all(r["verdict"] in VERDICTS and r["iterations"] == "3" for r in rows)
    summary = list(csv.DictReader((folder / "summary.csv").open()))
    assert len(summary) == len(fe.PAIRS) * 2
    setup = json.loads((folder / "experiment.json").read_text())["setup"]
    assert setup["training"]["test_accuracy"] > setup["training"]["test_accuracy_untrained"] + 0.2
    assert len([n for n in result.notes if n.startswith(tuple(p.name + " (" for p in fe.PAIRS))]) == len(fe.PAIRS)
    for fig in result.figures:
        assert (folder / fig).stat().st_size > 1000
    assert "reconstructions_pretraining.png" in result.figures
