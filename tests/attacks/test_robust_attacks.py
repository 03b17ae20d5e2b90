"""DLG / iDLG are robust on realistic cases and say when they did not converge (issue 17).

The photos are not from the project's sample sets: they are built at test time from the photos
scikit-image and scikit-learn ship (benchmarks/robustness.py ``build_photo_set``: center crop,
32x32 RGB, one ImageFolder class per photo). The suite checks a documented subset; the full
10-photo measurement is benchmarks/robustness.py, its numbers in benchmarks/robustness.json.

* iDLG at its defaults rebuilds single photos (LeNet, batch 1, 32 px) to >= 30 dB with the right
  label (here: the benchmark's lowest photo; every photo in the benchmark).
* DLG at its defaults rebuilds 2 photos from a FedAvg update (2 local steps of batch 1, labels
  not given) to >= 25 dB.
* A 2-iteration DLG run records a relative gradient distance above the DLG threshold, so its
  verdict is "not converged", with the plateau flag and the restarts used.
* On a trained checkpoint the defaults (the portfolio of starts) rebuild the image whenever a
  single start does (randn, zeros, rand alone), and from a start that fails they restart and find
  the leak. (Which start fails depends on the machine's floating point: "within 3 dB of the best
  single start" held on the machine the test was written on, not on an Intel Xeon measured on
  2026-11-25, where randn alone already leaks at 44.5 dB and the portfolio stops there; see the
  test.)
* iDLG on a 2-step FedAvg update with hard labels searches both label-to-step assignments.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from gradleak.attacks import Engine
from gradleak.attacks.configs import resolve_attack
from gradleak.attacks.dlg import RESTART_BELOW
from gradleak.attacks.verdict import CONVERGED_BELOW, verdict
from gradleak.data import batch_of, open_source
from gradleak.fl import fedsgd
from gradleak.fl.threats import ThreatModel, client_share
from gradleak.metrics import evaluate
from gradleak.models import build_model

# scikit-image and scikit-learn are in the test extra: the photos come from their wheels (no skip)

_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "robustness.py"


def _robustness():
    spec = importlib.util.spec_from_file_location("gradleak_bench_robustness", _BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    bench = _robustness()
    root = bench.build_photo_set(tmp_path_factory.mktemp("photos") / "set")
    return bench, open_source(str(root))


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def _run(attack: str, update, model, **given):  # noqa: ANN001
    cfg = resolve_attack({"attack": attack, "seed": 0, "init": "randn", **given}, bn_statistics_shared=False)
    return Engine().run(cfg, update, model)


def test_photo_set_is_an_image_folder_of_ten_or_more_classes(photos):
    bench, source = photos
    assert len(source) == len(bench.PHOTOS) >= 10 and source.num_classes == len(bench.PHOTOS)
    img = source.load(0, 32, 3)
    assert tuple(img.shape) == (3, 32, 32) and 0 <= float(img.min()) and float(img.max()) <= 1


@pytest.mark.parametrize("index", [5])
def test_idlg_defaults_rebuild_a_photo_it_was_never_tuned_on(photos, index):
    """hubble_deep_field: the lowest of the 10 photos in benchmarks/robustness.json (37.1 dB at
    300 steps; at 150 steps it is still at 26.5 dB, so the suite runs the full defaults, ~40 s on
    one thread). The benchmark runs every photo."""
    bench, source = photos
    rec, ev, wall = bench.idlg_photo(source, index)
    assert ev.label_accuracy == 1.0
    assert ev.psnr_mean >= 30, (bench.PHOTOS[index], ev.psnr_mean, rec.extra)
    assert rec.extra["relative_gradient_distance"] <= CONVERGED_BELOW["idlg"]
    assert verdict("idlg", rec.extra).converged and rec.extra["plateau"] is False


def test_two_iterations_do_not_converge_and_say_so(photos):
    _, source = photos
    model = build_model("lenet-dlg", num_classes=10, channels=3, image_size=32, seed=0)
    batch = batch_of(source, [3], 32, 3)
    rec = _run("dlg", fedsgd(model, batch), model, iterations=2)
    rel = rec.extra["relative_gradient_distance"]
    assert isinstance(rel, float) and rel > CONVERGED_BELOW["dlg"]
    assert isinstance(rec.extra["plateau"], bool) and isinstance(rec.extra["restarts_used"], int)
    assert rec.extra["restarts_used"] == 0  # a budget too short to judge a start: no restart
    v = verdict("dlg", rec.extra)
    assert not v.converged and "inconclusive" in v.reason


def test_relative_distance_is_the_final_answers(photos):
    """The recorded evidence is recomputed from the answer (images, labels) the run returns."""
    from gradleak.attacks.simulate import UpdateSimulator
    from gradleak.attacks.verdict import relative_distance

    _, source = photos
    model = build_model("lenet-dlg", num_classes=10, channels=3, image_size=32, seed=0)
    batch = batch_of(source, [5], 32, 3)
    update = fedsgd(model, batch)
    rec = _run("idlg", update, model, iterations=12)
    sim = UpdateSimulator(model, update, dtype=torch.float64)
    x = model.normalize(rec.images.double())
    # the answer's pixels are float32 in [0, 1]: allow that rounding
    again = relative_distance(sim(x, rec.labels, create_graph=False), sim.target)
    assert again == pytest.approx(rec.extra["relative_gradient_distance"], rel=1e-2, abs=1e-9)


@pytest.fixture(scope="module")
def trained_lenet(tmp_path_factory):
    from gradleak.training import TrainConfig, apply_checkpoint, train

    res = train(TrainConfig(model="lenet-dlg", train_subset=2000, test_subset=500, epochs=3.0, batch_size=32,
                            lr=0.01, checkpoints=(1.0,)), tmp_path_factory.mktemp("train"))
    assert res.final_accuracy >= 0.5
    model = build_model("lenet-dlg", num_classes=10, channels=1, image_size=32)
    apply_checkpoint(model, res.checkpoints[-1].path)
    return model


def test_defaults_on_a_trained_checkpoint_find_the_leak_a_single_start_finds(trained_lenet, monkeypatch):
    """On a trained checkpoint every start rebuilds the held-out image now that DLG's L-BFGS has a
    strong Wolfe line search (dlg.LBFGS_LINE_SEARCH; measured 85-92 dB from randn, zeros and rand
    at 60 steps). Without it a unit step lands in the sigmoids' saturation from some starts
    (which ones follows the CPU: zeros at 3.2 dB on one machine of this project's kind, randn at
    4.2 dB on another), and the portfolio of starts rescues such a start: it restarts from the
    failed one and rebuilds the image whenever any single start does."""
    import importlib

    dlg_module = importlib.import_module("gradleak.attacks.dlg")  # the module
    model = trained_lenet
    source = open_source("fashion-mnist", split="test")
    batch = batch_of(source, [0], 32, 1)
    update = fedsgd(model, batch)
    iterations = 60
    for init in ("randn", "zeros", "rand"):
        rec = _run("idlg", update, model, init=init, stall_restarts=0, iterations=iterations)
        assert evaluate(rec, batch).psnr_mean >= 30, (init, rec.extra)
    monkeypatch.setattr(dlg_module, "LBFGS_LINE_SEARCH", None)   # DLG's own code: no line search
    single = {}
    for init in ("randn", "zeros", "rand"):
        rec = _run("idlg", update, model, init=init, stall_restarts=0, iterations=iterations)
        single[init] = evaluate(rec, batch).psnr_mean
    failed = [init for init, psnr in single.items() if psnr < 20]
    assert failed and max(single.values()) >= 30, single  # the premise: one start fails, one leaks
    rec = _run("idlg", update, model, iterations=iterations)              # the defaults (randn first)
    default = evaluate(rec, batch).psnr_mean
    assert default >= 30 and rec.extra["relative_gradient_distance"] <= RESTART_BELOW, (default, single, rec.extra)
    # from the start that fails, the portfolio moves on and finds the leak
    rescued = _run("idlg", update, model, init=failed[0], iterations=iterations)
    psnr = evaluate(rescued, batch).psnr_mean
    assert rescued.extra["restarts_used"] >= 1 and rescued.extra["trial_inits"][0] == failed[0], rescued.extra
    assert psnr >= 30 and rescued.extra["relative_gradient_distance"] <= RESTART_BELOW, (psnr, single, rescued.extra)


def test_idlg_on_fedavg_tries_every_label_to_step_assignment(photos):
    _, source = photos
    model = build_model("lenet-dlg", num_classes=10, channels=3, image_size=32, seed=0)
    batch = batch_of(source, [1, 2], 32, 3)
    threat = ThreatModel(name="fedavg", local_steps=2, local_batch_size=1, local_lr=0.01)
    update = client_share(model, batch, threat, private_seed=17)
    rec = _run("idlg", update, model, iterations=3, stall_restarts=0)
    assert rec.extra["label_assignments"] == 2 and rec.extra["trials"] == 2
    assert sorted(rec.labels.tolist()) == sorted(batch.labels.tolist())


def test_dlg_defaults_rebuild_two_photos_from_a_fedavg_update(photos):
    """FedAvg, 2 local steps of batch 1 over 2 photos, local lr 0.01, labels not given (issue 17:
    5.9 dB before). Measured: see benchmarks/robustness.json (fedavg)."""
    bench, source = photos
    rec, ev, wall = bench.fedavg_pair(source, [0, 1], attack="dlg")
    assert ev.psnr_mean >= 25, (ev.psnr_mean, rec.extra)
    assert ev.label_accuracy == 1.0
    # the answer (2.1e-5) is within the portfolio's restart line but not the verdict's 1e-5: the
    # run is "not converged", and its row reads "leaked" (rebuilt), never "protected"
    rel = rec.extra["relative_gradient_distance"]
    assert rel <= RESTART_BELOW and rec.extra["restarts_used"] == 0
    assert verdict("dlg", rec.extra).converged is (rel <= CONVERGED_BELOW["dlg"])
