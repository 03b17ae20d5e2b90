"""The Flower audit: the auditor reads the clients' local training from the train config
(optimizer, momentum, weight decay, epochs, augmentation), its SharedUpdate equals gradleak's
fedavg threat model for a plain torch.optim client, the attack never sees the truth, and the
example federation (Flower's simulation engine) writes a standard run folder for every client
and round, indexed in audit.csv."""

import csv
import json
import math
import os

import pytest
import torch

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
# Ray's settings (loopback only, no probes) are gradleak.localray's, set by the code under test.

from gradleak.config import flat_config
from gradleak.audit import AuditSettings, FedAvgKeys, LeakageAuditor  # noqa: E402
from gradleak.audit.example import (FederationSettings, build_example_model, client_batch,  # noqa: E402
                                    local_training)
from gradleak.errors import ConfigError  # noqa: E402
from gradleak.fl.threats import ThreatModel, fedavg  # noqa: E402

SMALL = FederationSettings(rounds=2, clients=2, examples=2, local_steps=2, batch_size=1, lr=0.05)


def _client_round(s, partition=0, server_round=1, private_seed=0):
    """One example client's round as its ClientApp trains: the train config the server announces."""
    model = build_example_model(s)
    global_weights = {k: v.clone() for k, v in model.module.state_dict().items()}
    batch = client_batch(s, partition, server_round)
    local_training(model, batch, steps=s.steps, batch_size=s.batch_size or s.examples, lr=s.lr,
                   private_seed=private_seed, train=s.train_config())
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
    s = FederationSettings(clients=2, examples=2, local_steps=3, batch_size=2, lr=0.05, momentum=0.0,
                           weight_decay=0.0)  # full batch: order-free
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


LOCAL_TRAINING = {
    "default": {},   # the example's: SGD momentum 0.9, weight decay 5e-4, 2 epochs
    "nesterov": dict(nesterov=True, batch_size=2),
    "adam": dict(optimizer="adam", momentum=0.0, lr=1e-3, weight_decay=1e-3, betas=(0.8, 0.99)),
    "adamw": dict(optimizer="adamw", momentum=0.0, lr=1e-3, weight_decay=1e-2, eps=1e-6),
    "crop-flip": dict(augment="crop-flip", crop_padding=2, local_epochs=3),
}


@pytest.mark.parametrize("name", list(LOCAL_TRAINING))
def test_the_audit_reads_the_clients_local_training_from_the_train_config(name, tmp_path):
    """The example's ClientApp trains with torch.optim as its train config announces; the auditor
    reads the same entries (FedAvgKeys) into the threat record, which holds the optimizer and its
    constants, the epochs and the augmentation policy, and gradleak's client under that record
    (same private seed: same order and augmentation draws) gives the same weight difference."""
    s = FederationSettings(clients=2, examples=4, **{"batch_size": 1, "lr": 0.05, **LOCAL_TRAINING[name]})
    s.check()
    assert FederationSettings().train_config() == {   # the example app's announcement
        "lr": 0.01, "local-steps": 2, "local-epochs": 2, "batch-size": 1, "optimizer": "sgd", "momentum": 0.9,
        "nesterov": False, "weight-decay": 5e-4, "augment": "none"}
    g, c, batch = _client_round(s, private_seed=7)
    auditor = LeakageAuditor(build_example_model(s), AuditSettings(attack={"attack": "dlg", "iterations": 1},
                                                                   out=tmp_path))
    threat = auditor.threat(s.train_config(), FedAvgKeys(), 4)
    record = auditor.shared_update(g, c, num_examples=4, threat=threat).meta.threat
    want = {"name": "fedavg", "local_steps": s.steps, "local_batch_size": s.batch_size, "local_lr": s.lr,
            "local_epochs": s.local_epochs, "local_optimizer": s.optimizer, "local_weight_decay": s.weight_decay}
    want.update({"local_momentum": s.momentum, "local_nesterov": s.nesterov} if s.optimizer == "sgd" else
                {"local_betas": list(s.betas), "local_eps": s.eps})
    if s.augment != "none":
        want.update(local_augment=s.augment, local_crop_padding=s.crop_padding)
    assert record == want
    ref = fedavg(build_example_model(s), batch, threat, private_seed=7)
    up = auditor.shared_update(g, c, num_examples=4, threat=threat)
    for key in ref.gradients:
        torch.testing.assert_close(up.gradients[key], ref.gradients[key], rtol=1e-4, atol=1e-6)


def test_the_settings_name_lists_are_fl_s():
    from gradleak.audit import settings
    from gradleak.fl.augment import AUGMENTS
    from gradleak.fl.optim import OPTIMIZERS

    assert settings.OPTIMIZERS == OPTIMIZERS and settings.AUGMENTS == AUGMENTS


def test_auditor_scores_after_the_attack_and_logs_rows(tmp_path, monkeypatch):
    from gradleak.engine import Engine

    s = FederationSettings(clients=2, examples=1, local_steps=1, lr=0.05, weight_decay=0.0)
    g, c, batch = _client_round(s)
    events = []
    real = Engine.run

    def spy(self, config, update, model):
        events.append("attack")
        assert self.observer is None                 # nothing watches the attack with the truth
        return real(self, config, update, model)

    def truth(rnd, client):
        events.append("truth")
        return batch

    monkeypatch.setattr(Engine, "run", spy)
    auditor = LeakageAuditor(build_example_model(s), AuditSettings(attack={"attack": "idlg", "iterations": 5},
                                                                   out=tmp_path), truth_fn=truth)
    threat = ThreatModel(name="fedavg", local_steps=1, local_lr=0.05)
    row = auditor.audit(1, "0", g, c, num_examples=1, threat=threat)
    assert events == ["attack", "truth"]
    assert row["status"] == "ok" and math.isfinite(row["psnr_mean"]) and row["run"] == "runs/round-001-client-0"
    run = tmp_path / row["run"]   # a standard run folder, as `gradleak attack` writes it
    assert {"config.json", "metrics.json", "history.csv", "reconstruction.png", "reconstruction.safetensors",
            "report.html"} <= set(os.listdir(run))
    m = json.loads((run / "metrics.json").read_text())
    assert m["label_accuracy"] == 1.0 and m["psnr_mean"] == row["psnr_mean"] and m["data"] == batch.source
    assert m["audit"] == {"round": 1, "client": "0", "node_id": "", "update_norm": m["audit"]["update_norm"],
                          "attack_seconds": m["audit"]["attack_seconds"]} and m["audit"]["update_norm"] > 0
    config = flat_config(json.loads((run / "config.json").read_text()))
    assert (config["attack"], config["threat"], config["batch_size"], config["local_lr"]) == ("idlg", "fedavg", 1, 0.05)
    assert config["out"] == row["run"]
    skipped = auditor.audit(1, "1", g, c, num_examples=1000, threat=threat)      # too many examples to attack
    assert skipped["status"] == "skipped" and skipped["run"] is None and events == ["attack", "truth"]
    again = auditor.audit(1, "0", g, c, num_examples=1, threat=threat)          # the same client again: a new folder
    assert again["run"] == "runs/round-001-client-0-2" and (tmp_path / again["run"] / "metrics.json").is_file()
    rows = list(csv.DictReader(open(tmp_path / "audit.csv")))
    assert [(r["round"], r["client"], r["status"], r["run"]) for r in rows] == [
        ("1", "0", "ok", "runs/round-001-client-0"), ("1", "1", "skipped", ""), ("1", "0", "ok", "runs/round-001-client-0-2")]
    assert sorted(os.listdir(tmp_path / "runs")) == ["round-001-client-0", "round-001-client-0-2"]   # nothing staged left
    with pytest.raises(ConfigError, match="seeds"):
        LeakageAuditor(build_example_model(s), AuditSettings(attack={"attack": "dlg", "seeds": 2}, out=tmp_path))
    with pytest.raises(ConfigError, match="batch_size"):
        LeakageAuditor(build_example_model(s), AuditSettings(attack={"attack": "dlg", "batch_size": 2}, out=tmp_path))


BAD_FLAGS = [
    (["--image-size", "0"], "--image-size"), (["--image-size", "-3"], "--image-size"),
    (["--image-size", "100000"], "--image-size"),
    (["--rounds", "0"], "--rounds"), (["--rounds", "-1"], "--rounds"), (["--rounds", str(10**12)], "--rounds"),
    (["--rounds", "abc"], "--rounds"),
    (["--clients", "0"], "--clients"), (["--clients", "1"], "--clients"), (["--clients", "100000"], "--clients"),
    (["--clients", "1000", "--examples", "100"], "partitions of 60"),
    (["--examples", "0"], "--examples"), (["--examples", "100000"], "--examples"),
    (["--local-steps", "0"], "--local-steps"), (["--local-steps", "1000000"], "--local-steps"),
    (["--batch-size", "0"], "--batch-size"), (["--batch-size", "2"], "--batch-size"),
    (["--lr", "0"], "--lr"), (["--lr", "-0.1"], "--lr"), (["--lr", "nan"], "--lr"), (["--lr", "inf"], "--lr"),
    (["--model", "convnet", "--width", "0"], "--width"), (["--model", "convnet", "--width", "100000"], "--width"),
    (["--seed", "-1"], "--seed"), (["--seed", str(2**64)], "--seed"),
    (["--attack-seed", "-1"], "--attack-seed"), (["--attack-seed", str(2**64)], "--attack-seed"),
    (["--iterations", "-1"], "iterations"), (["--iterations", str(10**12)], "iterations"),
    (["--attack-lr", "0"], "--attack-lr"), (["--attack-lr", "inf"], "--attack-lr"),
    (["--attack-lr", "nan"], "--attack-lr"),
    (["--attack", "gradinversion", "--seeds", "0"], "seeds"), (["--attack", "ig", "--restarts", "0"], "restarts"),
    (["--attack", "nope"], "attack"), (["--model", "nope"], "model"), (["--defense", "gaussian:-1"], "gaussian"),
    (["--server", "nope"], "--server: unknown server 'nope'"), (["--server", "honest:3"], "--server"),
    (["--server", "trap:shrink=0.1,rate=0.1"], "--server"), (["--server", "imprint:bins=x"], "--server"),
    (["--attack", "trap"], "add --server trap"), (["--attack", "imprint", "--server", "trap"], "add --server imprint"),
    (["--server", "trap:rows=0"], "--server trap:rows=0: trap: rows must be between 1"),      # the model builder's range, before Ray
    # the clients' local training (issue 59): every flag out of range, or not applying, is one line
    (["--local-epochs", "0"], "--local-epochs"), (["--local-epochs", "100000"], "--local-epochs"),
    (["--local-epochs", "2", "--local-steps", "2"], "not both"),
    (["--local-epochs", "1000", "--examples", "20", "--batch-size", "1"], "20000 local steps"),
    (["--local-optimizer", "rmsprop"], "--local-optimizer"),
    (["--local-momentum", "1"], "--local-momentum"), (["--local-momentum", "-0.1"], "--local-momentum"),
    (["--local-momentum", "nan"], "--local-momentum"),
    (["--local-nesterov", "--local-momentum", "0"], "--local-nesterov needs a --local-momentum"),
    (["--local-optimizer", "adam", "--local-momentum", "0.9"], "apply to --local-optimizer sgd"),
    (["--local-weight-decay", "-1"], "--local-weight-decay"), (["--local-weight-decay", "2"], "--local-weight-decay"),
    (["--local-weight-decay", "inf"], "--local-weight-decay"),
    (["--local-betas", "0.9,0.99"], "--local-betas applies to --local-optimizer adam"),
    (["--local-optimizer", "adam", "--local-betas", "0.9,1"], "--local-betas"),
    (["--local-optimizer", "adam", "--local-betas", "x"], "--local-betas"),
    (["--local-optimizer", "adam", "--local-eps", "0"], "--local-eps"),
    (["--local-augment", "rotate"], "--local-augment"), (["--local-crop-padding", "99"], "--local-crop-padding"),
    (["--local-crop-padding", "-1"], "--local-crop-padding"),
]


@pytest.mark.parametrize("flags, named", BAD_FLAGS, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_audit_flower_refuses_bad_flags_before_anything_starts(flags, named, tmp_path, capsys, monkeypatch):
    """Zero, negative, absurd or unusable values: exit status 2 and one line naming the flag,
    before Ray starts and before the output folder exists."""
    import gradleak.localray
    from gradleak.cli import main

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started for settings that should have been refused")

    monkeypatch.setattr(gradleak.localray, "local_ray", no_ray)
    out = tmp_path / "audit"
    try:
        code = main(["audit-flower", "--out", str(out), *flags])
    except SystemExit as exc:   # argparse: not a number at all
        code = exc.code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("gradleak: error: "), captured.err[-2000:]
    assert named in lines[0] and captured.out == ""
    assert not out.exists()


@pytest.mark.timeout(240)
def test_flower_example_federation_audits_every_client_every_round(tmp_path, capsys):
    """Flower's own simulation engine, 2 clients x 2 rounds, FedAvg; one audit row per client per round.
    Ray runs as gradleak.localray starts it (loopback only; tests/reliability/test_loopback.py traces it) and
    the caller's environment is given back unchanged."""
    from gradleak.cli import main
    from gradleak.localray import ENVIRONMENT

    before = {key: os.environ.get(key) for key in ENVIRONMENT}
    out = tmp_path / "audit"
    code = main(["audit-flower", "--rounds", "2", "--clients", "2", "--attack", "idlg", "--iterations", "8",
                 "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    assert {key: os.environ.get(key) for key in ENVIRONMENT} == before
    from gradleak.audit import INDEX_COLUMNS

    rows = list(csv.DictReader(open(out / "audit.csv")))
    assert list(rows[0]) == list(INDEX_COLUMNS)
    assert sorted((r["round"], r["client"]) for r in rows) == [("1", "0"), ("1", "1"), ("2", "0"), ("2", "1")]
    for r in rows:
        assert r["status"] == "ok" and r["attack"] == "idlg" and r["run"] == f"runs/round-00{r['round']}-client-{r['client']}"
        m = json.loads((out / r["run"] / "metrics.json").read_text())
        assert math.isfinite(float(r["psnr_mean"])) and m["label_accuracy"] == 1.0   # iDLG label is exact
        # the example app's clients: SGD momentum 0.9, weight decay 5e-4, 2 epochs over their 1 image,
        # as the train config announces them, modelled exactly (one image: no order to know)
        assert m["threat"] == {"name": "fedavg", "local_steps": 2, "local_batch_size": 1, "local_lr": 0.01,
                               "local_epochs": 2, "local_optimizer": "sgd", "local_weight_decay": 5e-4,
                               "local_momentum": 0.9, "local_nesterov": False} and m["batch_size"] == 1
        assert m["client_model"] == "exact"
        assert m["verdict"] in ("leaked", "inconclusive") and (out / r["run"] / "reconstruction.png").is_file()
        assert (out / r["run"] / "report.html").is_file()
    assert len({r["node_id"] for r in rows}) == 2
    assert sorted(os.listdir(out)) == ["audit.csv", "audit.json", "runs"]
    assert len(json.loads((out / "audit.json").read_text())["rows"]) == 4


def test_the_attack_help_lists_every_image_attack(capsys):
    from gradleak.catalog import IMAGE_ATTACKS
    from gradleak.cli import main

    with pytest.raises(SystemExit):
        main(["audit-flower", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert " | ".join(IMAGE_ATTACKS) in text and {"cpa", "trap"} <= set(IMAGE_ATTACKS) and "--server" in text


def test_a_trap_server_dictates_the_model_of_the_server_the_clients_and_the_auditor(tmp_path):
    """--server trap: the global model the server sends carries the trap layer; a client builds the
    same architecture and loads the server's arrays into it (strictly, as the ClientApp does); the
    auditor, built on it, reads one-step FedAvg updates with the trap attack (exactly) and records
    the attack's refusal of two local steps as a failed row. No Flower here (the next test runs one)."""
    s = FederationSettings(clients=2, examples=4, local_steps=1, lr=0.01, server="trap")
    s.check()
    sent = build_example_model(s)
    state = {k: v.clone() for k, v in sent.module.state_dict().items()}
    assert {"trap.linear0.weight", "trap.linear2.weight"} <= set(state) and sent.kwargs["server"].startswith("trap:rows=")
    assert not any(k.startswith("trap.") for k in build_example_model(FederationSettings(clients=2)).module.state_dict())
    client = build_example_model(s)
    client.module.load_state_dict(state)     # strict: the client's model is the one the server sent
    batch = client_batch(s, 0, 1)
    local_training(client, batch, steps=1, batch_size=4, lr=0.01, private_seed=0)
    auditor = LeakageAuditor(build_example_model(s), AuditSettings(attack={"attack": "trap"}, out=tmp_path),
                             truth_fn=lambda rnd, c: batch)
    row = auditor.audit(1, "0", state, dict(client.module.state_dict()), num_examples=4,
                        threat=ThreatModel(name="fedavg", local_steps=1, local_lr=0.01))
    assert row["status"] == "ok" and row["verdict"] == "leaked" and row["psnr_mean"] >= 40, row
    assert row["server"] == sent.kwargs["server"]
    m = json.loads((tmp_path / row["run"] / "metrics.json").read_text())
    assert m["separated"] == 4 and m["update"]["model_kwargs"]["server"] == sent.kwargs["server"]
    refused = auditor.audit(1, "1", state, dict(client.module.state_dict()), num_examples=4,
                            threat=ThreatModel(name="fedavg", local_steps=2, local_lr=0.01))
    assert refused["status"] == "failed" and refused["run"] is None and "2 local steps" in refused["error"], refused
    rows = list(csv.DictReader(open(tmp_path / "audit.csv")))
    assert [(r["client"], r["server"], r["status"]) for r in rows] == [("0", row["server"], "ok"),
                                                                       ("1", row["server"], "failed")]


@pytest.mark.timeout(240)
def test_flower_example_federation_on_a_trap_server_leaks_every_batch(tmp_path, capsys):
    """`audit-flower --server trap --attack trap`: Flower's simulation, 2 clients x 1 round of 4 images;
    every client trains the trapped model the server sent, and the auditor reads each batch off its
    update exactly."""
    from gradleak.cli import main

    out = tmp_path / "audit"
    code = main(["audit-flower", "--server", "trap", "--attack", "trap", "--examples", "4", "--rounds", "1",
                 "--clients", "2", "--local-steps", "1", "--local-weight-decay", "0", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    rows = list(csv.DictReader(open(out / "audit.csv")))
    assert sorted(r["client"] for r in rows) == ["0", "1"]
    for r in rows:
        assert r["status"] == "ok" and r["attack"] == "trap" and r["server"].startswith("trap:rows=2000,shrink="), r
        assert r["verdict"] == "leaked" and float(r["psnr_mean"]) >= 40, r
        m = json.loads((out / r["run"] / "metrics.json").read_text())
        assert m["separated"] == 4 and m["label_accuracy"] == 1.0 and m["threat"]["local_steps"] == 1
    summary = json.loads((out / "audit.json").read_text())
    assert summary["federation"]["server"] == "trap" and summary["server"] == rows[0]["server"]


def test_auditor_runs_the_closed_form_chooser(tmp_path):
    """--attack auto in the audit: the example federation's LeNet on a one-step FedAvg update of
    one image is R-GAP's case (the attack rebuilds it in closed form); the row names the attack used."""
    s = FederationSettings(clients=2, examples=1, local_steps=1, lr=0.05, weight_decay=0.0)  # one momentum step: -lr * g
    g, c, batch = _client_round(s)
    auditor = LeakageAuditor(build_example_model(s), AuditSettings(attack={"attack": "auto", "fallback": "idlg",
                                                                           "iterations": 5}, out=tmp_path),
                             truth_fn=lambda rnd, client: batch)
    row = auditor.audit(1, "0", g, c, num_examples=1, threat=ThreatModel(name="fedavg", local_steps=1, local_lr=0.05))
    m = json.loads((tmp_path / row["run"] / "metrics.json").read_text())
    assert row["status"] == "ok" and row["attack"] == m["attack"] == "rgap" and m["converged"] is True, row
    assert row["psnr_mean"] >= 30 and m["label_accuracy"] == 1.0 and row["verdict"] == "leaked"


def test_the_existing_app_example_runs_flower_on_gradleaks_loopback_ray(tmp_path, monkeypatch):
    """examples/flower_existing_app.py (the README's "add the audit to your Flower app"): its
    simulation runs inside gradleak.localray.local_ray, so Ray stays on 127.0.0.1 (a plain
    ray.init, which run_simulation does without a running instance, listens on every interface).
    The federation itself is not run here (test_flower_example_federation_... runs one)."""
    import contextlib
    import importlib.util
    from pathlib import Path

    import gradleak.localray

    path = Path(__file__).resolve().parents[2] / "examples" / "flower_existing_app.py"
    spec = importlib.util.spec_from_file_location("gradleak_example_flower_existing_app", path)
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    inside = []

    @contextlib.contextmanager
    def fake_local_ray(num_cpus, **kwargs):
        inside.append(True)
        try:
            yield
        finally:
            inside.append(False)

    def fake_run_simulation(**kwargs):
        assert inside == [True], "run_simulation outside local_ray"
        assert "init_args" not in kwargs["backend_config"]   # nothing of its own for ray.init
        assert kwargs["num_supernodes"] == app.CLIENTS and kwargs["server_app"] is app.server
        (tmp_path / "audit-example").mkdir()
        (tmp_path / "audit-example" / "audit.csv").write_text("round,client\n")

    monkeypatch.setattr(gradleak.localray, "local_ray", fake_local_ray)
    monkeypatch.setattr(app, "run_simulation", fake_run_simulation)
    monkeypatch.chdir(tmp_path)
    assert app.run() == "round,client\n" and inside == [True, False]


@pytest.mark.parametrize("entry", [{"momentum": 1.5}, {"optimizer": "rmsprop"}, {"nesterov": "yes"},
                                   {"betas": [0.9]}, {"local-epochs": 0}, {"augment": "rotate"},
                                   {"weight-decay": "much"}])
def test_an_invalid_local_training_entry_is_one_line(entry, tmp_path):
    """A train config whose local training cannot be modelled: one ConfigError (a failed row in
    the federation, AuditedStrategy), before any attack."""
    s = FederationSettings(clients=2)
    auditor = LeakageAuditor(build_example_model(s), AuditSettings(attack={"attack": "dlg", "iterations": 1},
                                                                   out=tmp_path))
    with pytest.raises(ConfigError, match="local training in the train config is invalid"):
        auditor.threat({**s.train_config(), **entry}, FedAvgKeys(), 1)
