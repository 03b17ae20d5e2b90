"""GradInversion and Inverting Gradients against every threat model (fedsgd, fedavg, aggregate):
the batched simulation of G candidates equals G separate simulations, labels are restored from
the update without the truth, and both attacks lower their objective on real images."""

from __future__ import annotations

import pytest
import torch

from gradleak.attacks.labels import restore_labels
from gradleak.attacks.simulate import UpdateSimulator
from gradleak.config import make_config
from gradleak.pipeline import attack_update
from gradleak.pipeline import build_case as prepare

THREATS = {
    "fedavg": dict(threat="fedavg", local_steps=2, local_batch_size=1, local_lr=0.1, batch_size=2),
    "aggregate-fedsgd": dict(threat="aggregate", clients=2, batch_size=1),
    "aggregate-fedavg": dict(threat="aggregate", clients=2, inner="fedavg", local_steps=2, local_lr=0.1, batch_size=2),
}


def _case(threat: str, attack: str = "gradinversion", **extra):
    cfg = make_config(attack=attack, model="convnet", width=8, data="cifar10-samples", seed=3, **THREATS[threat],
                      **extra)
    return prepare(cfg)


@pytest.mark.parametrize("threat", sorted(THREATS))
def test_batched_simulation_equals_separate_simulations(threat):
    case = _case(threat, bn="exact", share_bn_statistics=True)
    # float64: the two paths sum in different orders, which float32 rounding through the unrolled
    # local steps turns into ~1e-4 relative differences; float64 checks that they compute the same
    sim = UpdateSimulator(case.model, case.update, dtype=torch.float64)
    labels = restore_labels(case.update, case.model)
    assert sorted(labels.tolist()) == sorted(case.truth.labels.tolist())  # no truth used to get them
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, case.update.meta.batch_size, *case.model.input_shape, generator=gen,
                    dtype=torch.float64, requires_grad=True)
    updates, stats = sim.batched(x, labels)
    assert len(stats) == len(sim.bn_names) and stats[0][0].shape[0] == 2
    for g in range(2):
        ref = sim(x[g], labels, create_graph=False)
        for a, b in zip(updates, ref, strict=True):
            assert torch.allclose(a[g], b, rtol=1e-9, atol=1e-12 * float(b.detach().abs().max()))
    # differentiable w.r.t. the candidates (the attack's double backward)
    (gx,) = torch.autograd.grad(sum(u.square().sum() for u in updates), x)
    assert bool(torch.isfinite(gx).all()) and float(gx.abs().sum()) > 0


def test_bn_statistics_of_the_true_batch_match_what_the_client_shares():
    """Under aggregate (FedSGD clients) the simulated shared BN statistics of the true images
    equal the shared ones: R_BN has its minimum at the truth under this threat model too."""
    case = _case("aggregate-fedsgd", bn="exact", share_bn_statistics=True)
    sim = UpdateSimulator(case.model, case.update)
    x = case.model.normalize(case.truth.images).unsqueeze(0)
    updates, stats = sim.batched(x, case.truth.labels)
    for name, (mean, var) in zip(sim.bn_names, stats, strict=True):
        assert torch.allclose(mean[0], case.update.bn_statistics[name][0], atol=1e-5)
        assert torch.allclose(var[0], case.update.bn_statistics[name][1], atol=1e-5)
    assert float(sim.gradient.layer_l2(updates)[0]) < 1e-3


@pytest.mark.parametrize("attack,threat", [("gradinversion", "fedavg"), ("ig", "fedavg"),
                                           ("gradinversion", "aggregate-fedavg")])
def test_attacks_run_against_fedavg_and_aggregate(attack, threat):
    extra = {"bn": "exact", "share_bn_statistics": True} if attack == "gradinversion" else {}
    case = _case(threat, attack=attack, **extra)
    flags = ({"seeds": 2, "bn": "exact", "group": "lazy"} if attack == "gradinversion" else {"restarts": 2})
    rec = attack_update(case.update, case.model, attack, iterations=40, seed=0, log_every=5, **flags)
    k = case.update.meta.batch_size
    assert rec.images.shape == (k, *case.model.input_shape) and rec.candidates.shape[:2] == (2, k)
    assert sorted(rec.labels.tolist()) == sorted(case.truth.labels.tolist())
    losses = [h["loss"] for h in rec.history]
    assert losses[-1] < 0.7 * losses[0]  # the simulated update moves towards the shared one


def test_ig_restarts_option_reaches_the_attack():
    """--restarts R for Inverting Gradients arrives as R batched restarts; other attacks refuse it."""

    from gradleak.attacks import resolve_attack
    from gradleak.errors import ConfigError

    ig = resolve_attack(make_config(attack="ig", restarts=3).model_dump(), bn_statistics_shared=False)
    assert ig.restarts == 3
    case = _case("fedavg", attack="ig")
    rec = attack_update(case.update, case.model, "ig", iterations=1, restarts=3)
    assert rec.extra["restarts"] == 3 and rec.candidates.shape[0] == 3
    with pytest.raises(ConfigError, match="restarts"):
        resolve_attack(make_config(attack="dlg", restarts=3).model_dump(), bn_statistics_shared=False)
