"""The attacker's simulation of the announced FedAvg client (attacks/simulate.py) is the client's
own local training: on the same order and the same data it gives back the shared update, for
momentum, weight decay and Adam's moments, in both its graph and its vmapped (func) modes; its
derivatives w.r.t. the dummies are finite; it says when its model of the client is incomplete,
and refuses an unroll too large to hold."""

from __future__ import annotations

import pytest
import torch

from gradleak.attacks import simulate
from gradleak.attacks.simulate import UpdateSimulator
from gradleak.data import sample_batch
from gradleak.errors import ConfigError
from gradleak.fl.threats import ThreatModel, fedavg, local_training, share
from gradleak.models import build_model

K, B = 4, 2


@pytest.fixture(scope="module")
def case(cifar10):
    """In float64: Adam's first steps are about lr * sign(g), so in float32 the summation order of
    a mini-batch alone moves entries with g near 0 by up to lr (0.2% of the update's norm, measured
    on this case); in float64 client and attacker agree to 1e-15."""
    batch = sample_batch(cifar10, K, 0, image_size=32, channels=3)
    model = build_model("convnet", num_classes=10, width=8)
    model.module.double()
    return batch, model


THREATS = {
    "momentum+wd": dict(local_lr=0.05, local_momentum=0.9, local_weight_decay=5e-4),
    "nesterov": dict(local_lr=0.05, local_momentum=0.9, local_nesterov=True),
    "adam": dict(local_lr=1e-3, local_optimizer="adam", local_weight_decay=1e-3),
    "adamw": dict(local_lr=1e-3, local_optimizer="adamw", local_weight_decay=1e-2),
}


def _threat(epochs: int, b: int, **kw) -> ThreatModel:
    return ThreatModel("fedavg", local_steps=ThreatModel.epoch_steps(K, b, epochs), local_batch_size=b,
                       local_epochs=epochs, **kw)


def _close(got, want) -> None:  # noqa: ANN001
    assert len(want) > 0
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.detach(), w, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", list(THREATS))
def test_the_attackers_unroll_on_the_clients_order_is_the_clients_update(case, name):
    batch, model = case
    threat = _threat(2, B, **THREATS[name])
    update = fedavg(model, batch, threat, private_seed=4)
    _, _, order = local_training(model, batch, threat, private_seed=4)
    sim = UpdateSimulator(model, update, dtype=torch.float64)
    assert sim.client_model == "order unknown: lower bound"  # 2 epochs of 2 mini-batches
    sim.steps = order  # the client's private order, which only this test knows
    x = model.normalize(batch.images.double())
    with torch.enable_grad():
        _close(sim(x, batch.labels, create_graph=False), sim.target)
    got, _ = sim.batched(x[None], batch.labels)  # the vmapped path (GradInversion's candidates)
    _close([g[0] for g in got], sim.target)


@pytest.mark.parametrize("name", ["momentum+wd", "adam"])
def test_full_batch_epochs_are_modelled_exactly_without_the_order(case, name):
    """One mini-batch per epoch: the private shuffling cannot change the update, and the attacker's
    own order reproduces it (client_model "exact")."""
    batch, model = case
    threat = _threat(3, K, **THREATS[name])
    update = share(model, batch, threat, private_seed=9)
    sim = UpdateSimulator(model, update, dtype=torch.float64)
    assert sim.client_model == "exact" and len(sim.steps) == 3
    x = model.normalize(batch.images.double())
    with torch.enable_grad():
        _close(sim(x, batch.labels, create_graph=False), sim.target)


def test_the_unroll_is_differentiable_through_adam(case):
    """d distance / d dummies through three Adam steps: finite, nonzero (the sqrt of Adam's second
    moment has a safe derivative at 0)."""
    batch, model = case
    update = share(model, batch, _threat(3, K, **THREATS["adam"]), private_seed=0)
    sim = UpdateSimulator(model, update, dtype=torch.float64)
    x = (model.normalize(batch.images.double()) + 0.1 * torch.randn(batch.images.shape, dtype=torch.float64)).requires_grad_()
    with torch.enable_grad():
        d = sum(((a - b) ** 2).sum() for a, b in zip(sim(x, batch.labels), sim.target, strict=True))
        (gx,) = torch.autograd.grad(d, x)
    assert bool(torch.isfinite(gx).all()) and float(gx.abs().max()) > 0


def test_augmentation_is_a_lower_bound_and_plain_sgd_stays_exact(case):
    batch, model = case
    aug = share(model, batch, _threat(1, K, local_lr=0.05, local_augment="flip"), private_seed=0)
    assert UpdateSimulator(model, aug).client_model == "augmentation unknown: lower bound"
    both = share(model, batch, _threat(2, B, local_lr=0.05, local_augment="crop-flip"), private_seed=0)
    assert UpdateSimulator(model, both).client_model == "order unknown, augmentation unknown: lower bound"
    assert UpdateSimulator(model, share(model, batch, ThreatModel("fedsgd"))).client_model == "exact"


def test_a_too_large_unroll_is_refused_with_its_estimate(case, monkeypatch):
    batch, model = case
    update = share(model, batch, _threat(2, B, **THREATS["adam"]), private_seed=0)
    need = UpdateSimulator(model, update, dtype=torch.float64).unroll_bytes(1)
    assert 1e5 < need < 1e9  # a few MiB for 4 steps of a width-8 convnet on 2 photos of 32 px
    assert UpdateSimulator(model, update, dtype=torch.float64).unroll_bytes(8) == 8 * need
    monkeypatch.setattr(simulate, "MAX_UNROLL_BYTES", need // 2)
    with pytest.raises(ConfigError, match=r"unroll of 4 local steps .* GiB of autograd graph"):
        UpdateSimulator(model, update, dtype=torch.float64)
