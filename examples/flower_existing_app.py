"""Adding gradleak's leakage audit to an existing Flower app (flwr 1.41 message API).

The app below is an ordinary Flower federation: its own nn.Module, its own data, FedAvg. The
audit is the three marked lines in the ServerApp: describe the model to gradleak (ModelSpec),
create a LeakageAuditor, and wrap the strategy in AuditedStrategy. The clients are unchanged
(the optional "client-info" record only names them in the audit rows).

    FLWR_TELEMETRY_ENABLED=0 python examples/flower_existing_app.py    # writes audit-example/ (audit.csv, runs/)

Runs Flower's simulation engine (Ray) with 3 clients for 2 rounds; about a minute on 2 cores.
"""

import os

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402
from torch import nn  # noqa: E402

from gradleak.audit import AuditSettings, LeakageAuditor  # noqa: E402
from gradleak.audit.flower import AuditedStrategy  # noqa: E402
from gradleak.models import ModelSpec  # noqa: E402

CLIENTS, ROUNDS, EXAMPLES = 3, 2, 1


class Net(nn.Module):
    """The app's own model (twice differentiable: sigmoid, as gradient matching needs)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 5, stride=2, padding=2)
        self.fc = nn.Linear(8 * 14 * 14, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.sigmoid(self.conv(x)).flatten(1))


def load_data(partition: int, server_round: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The app's own data loading: here Fashion-MNIST images partition, partition + N, ..."""
    from gradleak.data import open_source

    src = open_source("fashion-mnist")
    gen = torch.Generator().manual_seed(1000 * partition + server_round)
    idx = (partition + CLIENTS * torch.randint(0, len(src) // CLIENTS, (EXAMPLES,), generator=gen)).tolist()
    return torch.stack([src.load(i, 28, 1) for i in idx]), torch.tensor([src.label(i) for i in idx])


client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    cfg = msg.content["config"]
    partition = int(context.node_config["partition-id"])
    x, y = load_data(partition, int(cfg["server-round"]))
    opt = torch.optim.SGD(model.parameters(), lr=float(cfg["lr"]))
    for _ in range(int(cfg["local-steps"])):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                               "metrics": MetricRecord({"train_loss": float(loss), "num-examples": len(y)}),
                               "client-info": ConfigRecord({"partition-id": partition})}),   # optional
                   reply_to=msg)


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    net = Net()
    strategy = FedAvg(fraction_evaluate=0.0, min_train_nodes=CLIENTS, min_available_nodes=CLIENTS)
    # --- the audit: three lines -----------------------------------------------------------------
    spec = ModelSpec(name="Net", module=Net(), input_shape=(1, 28, 28), num_classes=10, mean=(0.0,), std=(1.0,))
    auditor = LeakageAuditor(spec, AuditSettings(attack={"attack": "idlg", "iterations": 20}, out="audit-example"))
    strategy = AuditedStrategy(strategy, auditor)   # reads lr / local-steps / batch-size from the train config
    # ---------------------------------------------------------------------------------------------
    strategy.start(grid=grid, initial_arrays=ArrayRecord(net.state_dict()), num_rounds=ROUNDS,
                   train_config=ConfigRecord({"lr": 0.05, "local-steps": 1, "batch-size": EXAMPLES}))
    auditor.write_summary()


def run() -> str:
    """The simulation, on a Ray instance that stays on this machine; returns audit.csv's text.

    Flower's simulation engine uses the Ray instance already running in this process. A plain
    ray.init (what run_simulation does without one) listens on every interface and probes cloud
    metadata services; gradleak's local_ray binds every Ray server to 127.0.0.1 and probes
    nothing (gradleak.localray; tests/reliability/test_loopback.py traces it)."""
    from gradleak.localray import local_ray

    with local_ray(num_cpus=2):
        run_simulation(server_app=server, client_app=client, num_supernodes=CLIENTS,
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    with open("audit-example/audit.csv") as f:
        return f.read()


if __name__ == "__main__":
    print(run())
