"""Threat models on the client side, and the attacker's simulation of them."""

import pytest
import torch

from gradleak.attacks.simulate import UpdateSimulator, label_evidence
from gradleak.data import sample_batch
from gradleak.errors import ConfigError
from gradleak.fl import fedsgd, load_update, save_update
from gradleak.fl.threats import ThreatModel, fedavg, share
from gradleak.models import build_model


@pytest.fixture(scope="module")
def case(cifar10):
    batch = sample_batch(cifar10, 4, 0, image_size=32, channels=3)
    return batch, build_model("convnet", num_classes=10, width=8)


def test_one_full_batch_fedavg_step_is_minus_lr_times_the_gradient(case):
    batch, model = case
    g = fedsgd(model, batch)
    u = fedavg(model, batch, ThreatModel("fedavg", local_steps=1, local_lr=0.05), private_seed=3)
    for k in g.gradients:
        torch.testing.assert_close(u.gradients[k], -0.05 * g.gradients[k], rtol=1e-5, atol=1e-7)
    assert u.meta.threat == {"name": "fedavg", "local_steps": 1, "local_batch_size": 4, "local_lr": 0.05}


def test_fedavg_hides_the_step_order_but_not_the_hyper_parameters(case, tmp_path):
    batch, model = case
    t = ThreatModel("fedavg", local_steps=4, local_batch_size=1, local_lr=0.1)
    a = fedavg(model, batch, t, private_seed=1)
    b = fedavg(model, batch, t, private_seed=2)
    assert any(not torch.allclose(a.gradients[k], b.gradients[k]) for k in a.gradients)  # order matters
    save_update(a, tmp_path / "u.safetensors")
    loaded, _ = load_update(tmp_path / "u.safetensors")
    assert loaded.meta.threat == {"name": "fedavg", "local_steps": 4, "local_batch_size": 1, "local_lr": 0.1}


def test_aggregate_of_fedsgd_clients_is_their_mean(case):
    batch, model = case
    t = ThreatModel("aggregate", clients=2)
    agg = share(model, batch, t)
    g1 = fedsgd(model, sample_batch_slice(batch, 0, 2))
    g2 = fedsgd(model, sample_batch_slice(batch, 2, 4))
    for k in agg.gradients:
        torch.testing.assert_close(agg.gradients[k], (g1.gradients[k] + g2.gradients[k]) / 2)
    assert agg.meta.batch_size == 4 and agg.meta.threat["clients"] == 2


def sample_batch_slice(batch, a, b):
    from gradleak.data import Batch

    return Batch(images=batch.images[a:b], labels=batch.labels[a:b])


@pytest.mark.parametrize("threat", [ThreatModel("fedsgd"), ThreatModel("fedavg", local_steps=2, local_lr=0.1),
                                    ThreatModel("aggregate", clients=2),
                                    ThreatModel("aggregate", clients=2, inner="fedavg", local_steps=2)])
def test_the_attacker_simulation_reproduces_the_update_on_the_true_data(case, threat):
    """With the true images and labels, the attacker's simulation gives back the shared update
    (full-batch local steps, so the client's private shuffling cannot change the result)."""
    batch, model = case
    update = share(model, batch, threat, private_seed=0)
    sim = UpdateSimulator(model, update)
    order = torch.arange(4)  # full-batch local steps: the private shuffling permutes within a step only
    x = model.normalize(batch.images[order])
    with torch.enable_grad():
        out = sim(x, batch.labels[order], create_graph=False)
    assert len(sim.target) > 0
    for got, want in zip(out, sim.target, strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=1e-4, atol=1e-6)


def test_label_evidence_flips_the_sign_for_fedavg(case):
    batch, model = case
    u = fedavg(model, batch, ThreatModel("fedavg", local_steps=1, local_lr=0.1), private_seed=0)
    g = fedsgd(model, batch)
    ev = label_evidence(u, model.classifier_name)
    torch.testing.assert_close(ev, 0.1 * g.gradients["fc.weight"], rtol=1e-4, atol=1e-7)


def test_bad_threat_values():
    with pytest.raises(ConfigError):
        ThreatModel("carrier-pigeon")
    with pytest.raises(ConfigError):
        ThreatModel("fedavg", local_lr=-1)
    with pytest.raises(ConfigError):
        ThreatModel("aggregate", clients=0)
