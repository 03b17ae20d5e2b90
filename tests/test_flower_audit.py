"""The Flower audit: the auditor's SharedUpdate equals gradleak's fedavg threat model for a plain
PyTorch client, the attack never sees the truth, and the example federation (Flower's
simulation engine) logs leakage for every client and round."""

import csv
import math
import os

import pytest
import torch

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from gradleak.audit import AuditSettings, FedAvgKeys, LeakageAuditor  # noqa: E402
from gradleak.audit.example import (FederationSettings, build_example_model, client_batch,  # noqa: E402
                                    local_training)
from gradleak.errors import ConfigError  # noqa: E402
from gradleak.fl.threats import ThreatModel, fedavg  # noqa: E402

SMALL = FederationSettings(rounds=2, clients=2, examples=2, local_steps=2, batch_size=1, lr=0.05)


def _client_round(s, partition=0, server_round=1):
    model = build_example_model(s)
    global_weights = {k: v.clone() for k, v in model.module.state_dict().items()}
    batch = client_batch(s, partition, server_round)
    local_training(model, batch, steps=s.local_steps, batch_size=s.batch_size, lr=s.lr, private_seed=0)
    return global_weights, {k: v.clone() for k, v in model.module.state_dict().items()}, batch


def test_client_batches_are_partitioned_and_reproducible():
    a, b = client_batch(SMALL, 0, 1), client_batch(SMALL, 0, 1)
    assert torch.equal(a.images, b.images) and a.images.shape == (2, 1, 28, 28)
    assert all(int(n.split("[")[1].rstrip("]")) % 2 == 0 for n in a.names)       # partition 0: even indices
    assert all(int(n.split("[")[1].rstrip("]")) % 2 == 1 for n in client_batch(SMALL, 1, 1).names)
    assert not torch.equal(a.images, client_batch(SMALL, 0, 2).images)           # a new batch each round


def test_flower_client_update_is_gradleaks_fedavg_update(tmp_path):
    """A plain torch.optim.SGD client (the example's ClientApp) produces exactly the weight
    difference gradleak's fedavg threat model describes, so the attacker's simulation is right."""
    s = FederationSettings(clients=2, examples=2, local_steps=3, batch_size=2, lr=0.05)  # full batch: order-free
    g, c, batch = _client_round(s)
    auditor = LeakageAuditor(build_example_model(s), AuditSettings(attack={"attack": "dlg", "iterations": 1},
                                                                   out=tmp_path))
    threat = auditor.threat({"local-steps": 3, "batch-size": 2, "lr": 0.05}, FedAvgKeys())
    assert (threat.local_steps, threat.local_batch_size, threat.local_lr) == (3, 2, 0.05)
    up = auditor.shared_update(g, c, num_examples=2, threat=threat)
    assert up.meta.threat == {"name": "fedavg", "local_steps": 3, "local_batch_size": 2, "local_lr": 0.05}
    model = build_example_model(s)
    ref = fedavg(model, batch, ThreatModel(name="fedavg", local_steps=3, local_batch_size=2, local_lr=0.05),
                 private_seed=0)
    assert set(up.gradients) == set(ref.gradients)
    for name in ref.gradients:
        torch.testing.assert_close(up.gradients[name], ref.gradients[name], rtol=1e-5, atol=1e-6)


def test_auditor_scores_after_the_attack_and_logs_rows(tmp_path, monkeypatch):
    import gradleak.attacks as attacks

    s = FederationSettings(clients=2, examples=1, local_steps=1, lr=0.05)
    g, c, batch = _client_round(s)
    events = []
    real = attacks.run_attack

    def spy(name, update, model, settings=None, observer=None):
        events.append("attack")
        assert observer is None                      # nothing watches the attack with the truth
        return real(name, update, model, settings, observer)

    def truth(rnd, client):
        events.append("truth")
        return batch

    monkeypatch.setattr(attacks, "run_attack", spy)
    auditor = LeakageAuditor(build_example_model(s), AuditSettings(attack={"attack": "idlg", "iterations": 5},
                                                                   out=tmp_path, save_reconstructions=True),
                             truth_fn=truth)
    threat = ThreatModel(name="fedavg", local_steps=1, local_lr=0.05)
    row = auditor.audit(1, "0", g, c, num_examples=1, threat=threat)
    assert events == ["attack", "truth"]
    assert row["status"] == "ok" and row["label_accuracy"] == 1.0 and math.isfinite(row["psnr_mean"])
    assert (tmp_path / row["reconstruction"]).is_file()
    skipped = auditor.audit(1, "1", g, c, num_examples=1000, threat=threat)      # too many examples to attack
    assert skipped["status"] == "skipped" and events == ["attack", "truth"]
    rows = list(csv.DictReader(open(tmp_path / "audit.csv")))
    assert [(r["round"], r["client"], r["status"]) for r in rows] == [("1", "0", "ok"), ("1", "1", "skipped")]
    with pytest.raises(ConfigError, match="seeds"):
        LeakageAuditor(build_example_model(s), AuditSettings(attack={"attack": "dlg", "seeds": 2}, out=tmp_path))
    with pytest.raises(ConfigError, match="batch_size"):
        LeakageAuditor(build_example_model(s), AuditSettings(attack={"attack": "dlg", "batch_size": 2}, out=tmp_path))


@pytest.mark.timeout(240)
def test_flower_example_federation_audits_every_client_every_round(tmp_path, capsys):
    """Flower's own simulation engine, 2 clients x 2 rounds, FedAvg; one audit row per client per round."""
    from gradleak.cli import main

    out = tmp_path / "audit"
    code = main(["audit-flower", "--rounds", "2", "--clients", "2", "--attack", "idlg", "--iterations", "8",
                 "--out", str(out), "--save-reconstructions"])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    rows = list(csv.DictReader(open(out / "audit.csv")))
    assert {"round", "client", "attack", "psnr_mean", "label_accuracy"} <= set(rows[0])
    assert sorted((r["round"], r["client"]) for r in rows) == [("1", "0"), ("1", "1"), ("2", "0"), ("2", "1")]
    for r in rows:
        assert r["status"] == "ok" and r["attack"] == "idlg", r
        assert math.isfinite(float(r["psnr_mean"])) and float(r["label_accuracy"]) == 1.0   # iDLG label is exact
        assert r["local_steps"] == "1" and r["num_examples"] == "1" and float(r["local_lr"]) == 0.01
        assert (out / r["reconstruction"]).is_file()
    assert len({r["node_id"] for r in rows}) == 2
    assert (out / "audit.json").is_file()
