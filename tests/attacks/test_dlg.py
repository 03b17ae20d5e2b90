"""DLG and iDLG reconstruct real photos; labels are restored exactly; the file path equals memory."""

import torch

from gradleak.attacks.labels import fc_weight_gradient, idlg_label
from gradleak.data import sample_batch
from gradleak.fl import fedsgd, load_update, save_update
from gradleak.metrics import evaluate
from gradleak.models import build_model
from gradleak.pipeline import attack_update


def _case(cifar10, seed=0):
    batch = sample_batch(cifar10, 1, seed, image_size=32, channels=3)
    model = build_model("lenet-dlg", num_classes=10)
    return batch, model, fedsgd(model, batch)


def test_dlg_reconstructs_a_real_cifar10_photo(cifar10):
    batch, model, update = _case(cifar10)
    rec = attack_update(update, model, "dlg", iterations=180)
    ev = evaluate(rec, batch)
    # Declared threshold: MSE <= 1e-4 on [0,1] pixels (PSNR >= 40 dB) within 180 L-BFGS steps.
    assert ev.mse_mean <= 1e-4, ev.to_dict()
    assert ev.psnr_mean >= 40
    assert ev.label_accuracy == 1.0  # soft label's argmax


def test_idlg_reconstructs_a_real_cifar10_photo(cifar10):
    batch, model, update = _case(cifar10, seed=3)
    rec = attack_update(update, model, "idlg", iterations=130)
    ev = evaluate(rec, batch)
    assert rec.label_method == "idlg"
    assert ev.mse_mean <= 1e-4, ev.to_dict()
    assert ev.label_accuracy == 1.0


def test_idlg_restores_the_label_of_every_cifar10_sample(cifar10):
    model = build_model("lenet-dlg", num_classes=10)
    restored, true = [], []
    for i in range(len(cifar10)):
        from gradleak.data import Batch

        img = cifar10.load(i, 32, 3)
        batch = Batch(images=img[None], labels=torch.tensor([cifar10.label(i)]))
        update = fedsgd(model, batch)
        restored.append(idlg_label(fc_weight_gradient(update.gradients, model.classifier_name)))
        true.append(cifar10.label(i))
    assert len(true) == 20
    assert restored == true


def test_attack_is_deterministic_and_file_round_trip_is_exact(cifar10, tmp_path):
    batch, model, update = _case(cifar10, seed=1)
    path = tmp_path / "u.safetensors"
    save_update(update, path)
    loaded, model2 = load_update(path)
    assert loaded.meta == update.meta
    for k in update.gradients:
        assert torch.equal(loaded.gradients[k], update.gradients[k])
    settings = dict(iterations=15, seed=5)
    a = attack_update(update, model, "idlg", **settings)
    b = attack_update(loaded, model2, "idlg", **settings)
    assert torch.equal(a.images, b.images)
    assert [h["loss"] for h in a.history] == [h["loss"] for h in b.history]


def test_attack_does_not_touch_the_model(cifar10):
    batch, model, update = _case(cifar10)
    before = {k: v.clone() for k, v in model.module.state_dict().items()}
    attack_update(update, model, "dlg", iterations=2)
    assert all(torch.equal(before[k], v) for k, v in model.module.state_dict().items())
    assert all(p.grad is None for p in model.module.parameters())


def _settle_run(update, model, iterations, stop):
    from gradleak.attacks import Engine
    from gradleak.attacks.configs import resolve_attack

    cfg = resolve_attack({"attack": "idlg", "seed": 0, "iterations": iterations, "stop": stop},
                         bn_statistics_shared=True)
    return Engine().run(cfg, update, model)


def test_settled_rule_needs_the_verdict_line_and_a_plateau():
    from gradleak.attacks.dlg import SETTLE_PATIENCE, _settled

    flat_low = [{"loss": 1e-9}] * (SETTLE_PATIENCE + 2)
    assert _settled(flat_low, 1e-5)
    assert not _settled(flat_low[:SETTLE_PATIENCE], 1e-5)            # too short to judge
    flat_high = [{"loss": 1e-3}] * (SETTLE_PATIENCE + 2)
    assert not _settled(flat_high, 1e-5)                               # a stalled start is not settled
    falling = [{"loss": 1e-6 * 0.9 ** i} for i in range(SETTLE_PATIENCE + 5)]
    assert not _settled(falling, 1e-5)                                 # still falling 10 % a step
    assert not _settled([{"loss": float("nan")}] * (SETTLE_PATIENCE + 2), 1e-5)


def test_default_idlg_meets_the_papers_mse_with_one_start(cifar10):
    batch, model, update = _case(cifar10, seed=3)
    rec = _settle_run(update, model, 300, "settled")
    ev = evaluate(rec, batch)
    # Declared: the default iDLG run ends below the DLG paper's MSE 3.3e-6 (the mark for the
    # default job) with one start, within its 300-step budget. (With the strong Wolfe line search
    # the objective keeps falling fast on this photo, so the settle rule, tested below, does not
    # cut the run short here.)
    assert rec.iterations <= 300 and rec.extra["trials"] == 1, rec.iterations
    assert ev.mse_mean <= 3.3e-6, ev.to_dict()


def test_stop_budget_runs_every_step(cifar10, monkeypatch):
    import importlib

    dlg_module = importlib.import_module("gradleak.attacks.dlg")  # the module
    batch, model, update = _case(cifar10, seed=3)
    # a rule that fires at the first step below the verdict line, so both runs stay short
    monkeypatch.setattr(dlg_module, "SETTLE_PATIENCE", 1)
    monkeypatch.setattr(dlg_module, "SETTLE_PROGRESS", 1.0)
    settled = _settle_run(update, model, 90, "settled")
    budget = _settle_run(update, model, 90, "budget")
    assert settled.iterations < 90 <= budget.iterations
    # it stopped on the trial's objective at or below the verdict line (the clamped answer the
    # verdict reads may sit above it at that step)
    norm2 = sum(float(g.double().pow(2).sum()) for g in update.gradients.values())
    assert min(h["loss"] for h in settled.history) / norm2 <= 1e-5


def test_stop_is_checked():
    import pytest

    from gradleak.attacks.configs import resolve_attack
    from gradleak.errors import ConfigError

    with pytest.raises(ConfigError):
        resolve_attack({"attack": "dlg", "seed": 0, "stop": "never"}, bn_statistics_shared=True)
    with pytest.raises(ConfigError, match="--stop"):
        resolve_attack({"attack": "ig", "seed": 0, "stop": "budget"}, bn_statistics_shared=True)
