"""The FedAvg client's local training (fl.optim, fl.augment, fl.threats.local_training) is
torch.optim's: the client's weights and BatchNorm running statistics after E epochs equal a plain
torch.optim loop's on the same private order and augmentation draws; the record says what a server
announces and nothing private; old records load as plain SGD."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from gradleak.data import sample_batch
from gradleak.errors import ConfigError
from gradleak.fl import load_update, save_update
from gradleak.fl.augment import augment
from gradleak.fl.optim import LocalOptimizer
from gradleak.fl.threats import ThreatModel, augment_generator, fedavg, local_training
from gradleak.models import build_model

K, B, EPOCHS = 6, 2, 2


@pytest.fixture(scope="module")
def case(cifar10):
    batch = sample_batch(cifar10, K, 0, image_size=32, channels=3, allow_repeats=True)
    return batch, build_model("convnet", num_classes=10, width=8)  # BatchNorm layers


def _threat(**kw) -> ThreatModel:
    steps = ThreatModel.epoch_steps(K, B, EPOCHS)
    return ThreatModel("fedavg", local_steps=steps, local_batch_size=B, local_epochs=EPOCHS, **kw)


def _torch_optim(threat: ThreatModel, params) -> torch.optim.Optimizer:  # noqa: ANN001
    o = threat.optimizer
    if o.name == "sgd":
        return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, nesterov=o.nesterov, weight_decay=o.weight_decay)
    cls = torch.optim.Adam if o.name == "adam" else torch.optim.AdamW
    return cls(params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)


def _torch_loop(model, batch, threat: ThreatModel, steps, private_seed: int) -> torch.nn.Module:  # noqa: ANN001
    """A plain torchvision-reference-style training loop: module.train(), optimizer.zero_grad(),
    loss.backward(), optimizer.step(), on the client's own order and augmentation draws."""
    module = copy.deepcopy(model.module).train()
    opt = _torch_optim(threat, [p for p in module.parameters() if p.requires_grad])
    gen = augment_generator(private_seed)
    for idx in steps:
        x = batch.images[idx]
        if threat.local_augment != "none":
            x = augment(x, threat.local_augment, threat.local_crop_padding, gen)
        opt.zero_grad()
        F.cross_entropy(module(model.normalize(x)), batch.labels[idx]).backward()
        opt.step()
    return module


@pytest.mark.parametrize("kw", [
    dict(local_lr=0.05),
    dict(local_lr=0.05, local_momentum=0.9),
    dict(local_lr=0.05, local_momentum=0.9, local_weight_decay=5e-4),
    dict(local_lr=0.05, local_momentum=0.9, local_nesterov=True, local_weight_decay=1e-2),
    dict(local_lr=1e-3, local_optimizer="adam"),
    dict(local_lr=1e-3, local_optimizer="adam", local_weight_decay=1e-2, local_betas=(0.8, 0.99)),
    dict(local_lr=1e-3, local_optimizer="adamw", local_weight_decay=1e-2, local_eps=1e-6),
    dict(local_lr=0.05, local_momentum=0.9, local_augment="crop-flip"),
    dict(local_lr=0.05, local_augment="flip"),
], ids=lambda kw: ",".join(f"{k.removeprefix('local_')}={v}" for k, v in kw.items()))
def test_client_after_epochs_equals_a_torch_optim_loop(case, kw):
    batch, model = case
    threat = _threat(**kw)
    run, buffers, steps = local_training(model, batch, threat, private_seed=11)
    assert len(steps) == EPOCHS * K // B and all(sorted(torch.cat(steps[e * 3:(e + 1) * 3]).tolist()) == list(range(K))
                                                 for e in range(EPOCHS))  # every epoch sees every sample once
    ref = _torch_loop(model, batch, threat, steps, 11)
    moved = 0.0
    for n, p in ref.named_parameters():
        torch.testing.assert_close(run.params[n], p.detach(), rtol=1e-5, atol=1e-6)
        moved = max(moved, float((p.detach() - run.start[n]).abs().max()))
    assert moved > 1e-4  # the loop trained (the comparison is not of two untouched models)
    for n, b in ref.named_buffers():  # BatchNorm running statistics, num_batches_tracked, as torch updates them
        torch.testing.assert_close(buffers[n], b, rtol=1e-5, atol=1e-6)
    assert int(buffers[next(n for n in buffers if n.endswith("num_batches_tracked"))]) == len(steps)
    # the global model itself is untouched
    for n, p in model.module.named_parameters():
        torch.testing.assert_close(p.detach(), run.start[n])


def test_adam_differs_from_sgd_and_momentum_from_plain(case):
    """The optimizer matters (a guard against an optimizer silently ignored)."""
    batch, model = case
    plain = fedavg(model, batch, _threat(local_lr=0.05), private_seed=1).gradients
    mom = fedavg(model, batch, _threat(local_lr=0.05, local_momentum=0.9), private_seed=1).gradients
    adam = fedavg(model, batch, _threat(local_lr=0.05, local_optimizer="adam"), private_seed=1).gradients
    k = "fc.weight"
    assert (mom[k] - plain[k]).norm() > 0.1 * plain[k].norm()
    assert (adam[k] - plain[k]).norm() > 0.1 * plain[k].norm()


def test_record_says_what_is_announced_and_nothing_private(case, tmp_path):
    batch, model = case
    threat = _threat(local_lr=0.05, local_momentum=0.9, local_weight_decay=5e-4, local_augment="crop-flip")
    up = fedavg(model, batch, threat, private_seed=5)
    rec = up.meta.threat
    assert rec == {"name": "fedavg", "local_steps": 6, "local_batch_size": 2, "local_lr": 0.05, "local_epochs": 2,
                   "local_optimizer": "sgd", "local_weight_decay": 5e-4, "local_momentum": 0.9,
                   "local_nesterov": False, "local_augment": "crop-flip", "local_crop_padding": 4}
    assert up.meta.bn_buffers_shared is False
    save_update(up, tmp_path / "u.safetensors")
    loaded, _ = load_update(tmp_path / "u.safetensors")
    assert ThreatModel.from_record(loaded.meta.threat) == threat
    raw = (tmp_path / "u.safetensors").read_bytes()
    assert b"label" not in raw and b"order" not in raw and b"seed" not in raw
    adam = _threat(local_lr=1e-3, local_optimizer="adamw", local_weight_decay=0.01).record(K)
    assert adam["local_betas"] == [0.9, 0.999] and adam["local_eps"] == 1e-8 and "local_momentum" not in adam


def test_records_of_before_are_plain_sgd():
    t = ThreatModel.from_record({"name": "fedavg", "local_steps": 3, "local_batch_size": 2, "local_lr": 0.1})
    assert t.optimizer == LocalOptimizer("sgd", lr=0.1) and t.optimizer.is_plain_sgd
    assert t.local_epochs is None and t.local_augment == "none"
    assert t.record(4) == {"name": "fedavg", "local_steps": 3, "local_batch_size": 2, "local_lr": 0.1}


@pytest.mark.parametrize("rec, msg", [
    ({"local_optimizer": "rmsprop"}, "local_optimizer"),
    ({"local_momentum": 1.0}, "local_momentum"),
    ({"local_momentum": "0.9"}, "not a number"),
    ({"local_nesterov": True}, "nesterov"),
    ({"local_nesterov": 1, "local_momentum": 0.9}, "true or false"),
    ({"local_weight_decay": -1}, "weight_decay"),
    ({"local_optimizer": "adam", "local_betas": [0.9]}, "local_betas"),
    ({"local_optimizer": "adam", "local_betas": [0.9, 1.0]}, "local_betas"),
    ({"local_optimizer": "adam", "local_momentum": 0.9}, "apply to --local-optimizer sgd"),
    ({"local_augment": "rotate"}, "local_augment"),
    ({"local_epochs": 0}, "local_epochs"),
])
def test_bad_records_are_refused(rec, msg):
    with pytest.raises(ConfigError, match=msg):
        ThreatModel.from_record({"name": "fedavg", "local_steps": 2, "local_lr": 0.1, **rec})


def test_epochs_must_agree_with_the_steps():
    ThreatModel("fedavg", local_steps=6, local_batch_size=2, local_epochs=2).check_batch(6)
    with pytest.raises(ConfigError, match="are 6 steps, not local_steps 5"):
        ThreatModel("fedavg", local_steps=5, local_batch_size=2, local_epochs=2).check_batch(6)


def test_a_large_client_trains_epochs_over_256_samples():
    """K = 256 samples, 2 epochs in mini-batches of 32 on a small MLP-sized model: the schedule
    covers every sample once per epoch, privately shuffled."""
    t = ThreatModel("fedavg", local_steps=ThreatModel.epoch_steps(256, 32, 2), local_batch_size=32, local_epochs=2)
    t.check_batch(256)
    steps = t.local_schedule(256, 3)
    assert len(steps) == 16
    for e in range(2):
        assert sorted(torch.cat(steps[e * 8:(e + 1) * 8]).tolist()) == list(range(256))
    assert torch.cat(steps[:8]).tolist() != list(range(256))  # shuffled
    assert t.client_model(256) == "order unknown: lower bound"
    assert ThreatModel("fedavg", local_steps=2, local_epochs=2).client_model(256) == "exact"  # full-batch steps
