"""The guard's Flower client mod on real messages (flwr 1.41's Message API), without a simulation:
the mod around a plain PyTorch FedAvg train handler (LeNet, one Fashion-MNIST image, one SGD step)."""

import csv

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("flwr")

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from gradleak.data import batch_of, open_source  # noqa: E402
from gradleak.guard import GuardPolicy  # noqa: E402
from gradleak.guard.flower import GUARD_ERROR_CODE, GuardMod, guarded  # noqa: E402
from gradleak.models import build_model  # noqa: E402
from gradleak.models.server import server_model  # noqa: E402


@pytest.fixture(autouse=True)
def identity(monkeypatch):
    """Flower stamps messages with the process's task identity (set by its runtime)."""
    for name, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 7)):
        monkeypatch.setattr(TaskIdentity, name, value)


@pytest.fixture(scope="module")
def batch():
    source = open_source("fashion-mnist")
    return batch_of(source, [7], 28, 1)


def lenet(server="honest"):
    return server_model(build_model("lenet-dlg", num_classes=10, channels=1, image_size=28, seed=0), server)


def train_message(state, server_round=1):
    config = ConfigRecord({"server-round": server_round, "lr": 0.01, "local-steps": 1, "batch-size": 1})
    return Message(content=RecordDict({"arrays": ArrayRecord(state), "config": config}), dst_node_id=7,
                   message_type="train")


def context():
    return Context(run_id=1, node_id=7, node_config={"partition-id": 0}, state=RecordDict(), run_config={})


class Client:
    """A plain FedAvg client: one SGD step (lr 0.01) on its batch; counts its calls."""

    def __init__(self, batch, server="honest"):
        self.batch, self.server, self.calls = batch, server, 0

    def __call__(self, msg, ctx):
        self.calls += 1
        model = lenet(self.server)
        model.module.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        opt = torch.optim.SGD(model.module.parameters(), lr=0.01)
        loss = F.cross_entropy(model.module(model.normalize(self.batch.images)), self.batch.labels)
        loss.backward()
        opt.step()
        self.trained = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
        return Message(content=RecordDict({"arrays": ArrayRecord(model.module.state_dict()),
                                           "metrics": MetricRecord({"num-examples": 1, "train_loss": float(loss.detach())})}),
                       reply_to=msg)


def mod(batch, out, server="honest", **policy):
    p = GuardPolicy(**{"iterations": 50, "progress": False, "budget_seconds": 90.0, **policy})
    return GuardMod(p, model_fn=lambda m, c: lenet(server), batch_fn=lambda m, c: batch, arch="lenet-dlg", out=out)


def rows(out):
    with open(out / "guard.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_report_sends_the_trained_weights_unchanged_and_writes_a_row(batch, tmp_path):
    client = Client(batch)
    reply = mod(batch, tmp_path, action="report")(train_message(lenet().module.state_dict()), context(), client)
    assert not reply.has_error() and client.calls == 1
    sent = reply.content["arrays"].to_torch_state_dict()
    assert all(torch.equal(sent[k], client.trained[k]) for k in client.trained)
    assert reply.content["metrics"]["guard-remedied"] == 0
    [row] = rows(tmp_path)
    assert row["round"] == "1" and row["client"] == "0" and row["decision"] == "passed"
    assert row["verdict_before"] == "leaked" and float(row["seconds"]) > 0 and float(row["train_seconds"]) >= 0
    assert (tmp_path / row["run_before"] / "report.html").is_file()


def test_withhold_replies_with_an_error_that_strategies_leave_out(batch, tmp_path):
    reply = mod(batch, tmp_path, action="withhold")(train_message(lenet().module.state_dict()), context(), Client(batch))
    assert reply.has_error() and reply.error.code == GUARD_ERROR_CODE and "withheld" in reply.error.reason
    assert rows(tmp_path)[0]["decision"] == "withheld"


@pytest.mark.slow   # ~80 s: two checks per noise level, the portfolio each time
def test_noise_sends_the_noised_weights_and_records_the_noise(batch, tmp_path):
    client = Client(batch)
    reply = mod(batch, tmp_path, action="noise", schedule=(3.0, 10.0))(train_message(lenet().module.state_dict()),
                                                                      context(), client)
    [row] = rows(tmp_path)
    assert row["decision"] == "remedied" and row["verdict_after"] == "defended", row["reason"]
    sent = reply.content["arrays"].to_torch_state_dict()
    diff = torch.cat([(sent[k] - client.trained[k]).flatten() for k in client.trained])
    assert abs(float(diff.std()) / float(row["noise_sigma"]) - 1) < 0.05
    assert reply.content["metrics"]["guard-remedied"] == 1
    assert (tmp_path / row["run_after"] / "metrics.json").is_file()


@pytest.mark.parametrize("server", ["trap", "imprint"])
def test_a_malicious_model_is_refused_before_training(batch, tmp_path, server):
    client = Client(batch, server)
    reply = mod(batch, tmp_path, server=server, action="report")(
        train_message(lenet(server).module.state_dict()), context(), client)
    assert client.calls == 0 and reply.has_error() and "refused model" in reply.error.reason
    [row] = rows(tmp_path)
    assert row["decision"] == "refused model" and row["run_before"] == ""


def test_other_messages_pass_untouched_and_guarded_wraps_a_built_app(batch, tmp_path):
    from flwr.clientapp import ClientApp

    inner = ClientApp()
    seen = []

    @inner.evaluate()
    def evaluate(msg, ctx):
        seen.append(msg.metadata.message_type)
        return Message(content=RecordDict({"metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)

    app = guarded(inner, mod(batch, tmp_path, action="withhold"))
    msg = Message(content=RecordDict({"config": ConfigRecord({})}), dst_node_id=7, message_type="evaluate")
    reply = app(msg, context())
    assert seen == ["evaluate"] and not reply.has_error() and not (tmp_path / "guard.csv").exists()


def test_a_guard_that_fails_is_a_recorded_decision_and_never_blocks_the_round(batch, tmp_path):
    def broken(msg, ctx):
        raise OSError("the client's data went away")

    p = GuardPolicy(progress=False)
    for on_error, sent in (("withhold", False), ("send", True)):
        out = tmp_path / on_error
        guard = GuardMod(GuardPolicy(**{**p.to_dict(), "schedule": p.schedule, "on_error": on_error}),
                         model_fn=lambda m, c: lenet(), batch_fn=broken, arch="lenet-dlg", out=out)
        reply = guard(train_message(lenet().module.state_dict()), context(), Client(batch))
        assert reply.has_error() != sent
        [row] = rows(out)
        assert row["verdict_before"] == "failed" and "the client's data went away" in row["reason"]
        assert row["decision"] == ("passed" if sent else "withheld")
