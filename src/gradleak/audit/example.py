"""A runnable example federation with the audit switched on: Fashion-MNIST split over N
clients, FedAvg, Flower's simulation engine (``flwr.simulation.run_simulation`` on Ray).

The clients are an ordinary Flower ClientApp with a plain PyTorch training loop: each round,
client p draws its batch of ``examples`` images from its partition (the images whose index is
p mod N), runs ``local_steps`` SGD steps of learning rate ``lr`` in mini-batches of
``batch_size`` (shuffled with its own private generator), optionally defends its weight
difference (update-level gradleak defenses: gaussian, pruning, quantisation), and replies with
its weights, ``num-examples`` and its partition id. The server sends those hyper-parameters in
the train config; the audit reads them there (the attacker knows them: FedAvg's public
hyper-parameters) and attacks each client's W_S - W_0.

Ground truth for scoring: the batch of client p in round r is a pure function of (seed, p, r),
so the auditor's ``truth_fn`` recomputes it with the same function the clients use; it is
called only after each attack returned.

    gradleak audit-flower --rounds 3 --clients 3 --attack idlg --out audit-run
"""

from __future__ import annotations

import os

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")

import functools  # noqa: E402
import logging  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ..data import Batch, open_source  # noqa: E402
from ..errors import ConfigError, GradleakError  # noqa: E402
from ..models import ModelSpec, build_model  # noqa: E402


@dataclass
class FederationSettings:
    """The example federation. Everything here is plain data (it travels to the client actors)."""

    rounds: int = 3
    clients: int = 3
    examples: int = 1            # images per client per round (the batch the attack faces)
    local_steps: int = 1
    batch_size: int | None = None   # local mini-batch size (default: all ``examples``)
    lr: float = 0.01
    model: str = "lenet-dlg"
    width: int | None = None
    image_size: int = 28
    data: str = "fashion-mnist"
    data_root: str | None = None
    seed: int = 0
    defense: list[str] = field(default_factory=list)
    client_cpus: float = 1.0
    ray_cpus: int | None = None     # CPUs of the local Ray instance (default: min(clients, available))
    verbose: bool = False

    def check(self) -> None:
        for name in ("rounds", "clients", "examples", "local_steps"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"audit-flower: --{name.replace('_', '-')} must be >= 1")
        if self.clients < 2:
            raise ConfigError("audit-flower: --clients must be >= 2 (FedAvg averages at least two clients)")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError("audit-flower: --batch-size must be >= 1")
        if not self.lr > 0:
            raise ConfigError("audit-flower: --lr must be > 0")
        if self.defense:
            from ..defenses import parse_defenses

            if any(d.client_side for d in parse_defenses(self.defense)):
                raise ConfigError("audit-flower: client-side defenses (dpsgd) act on FedSGD gradients; the example "
                                  "clients run FedAvg, so use update-level defenses (gaussian, prune, quantize)")


# ---------------------------------------------------------------- shared by clients and the truth oracle
@functools.lru_cache(maxsize=4)
def _source(data: str, root: str | None):  # noqa: ANN202 - one decoded copy per process
    return open_source(data, root=root, split="train")


def build_example_model(s: FederationSettings) -> ModelSpec:
    source = _source(s.data, s.data_root)
    return build_model(s.model, num_classes=source.num_classes, channels=source.native_channels,
                       image_size=s.image_size, seed=s.seed, width=s.width)


def client_batch(s: FederationSettings, partition: int, server_round: int) -> Batch:
    """Client ``partition``'s private batch in ``server_round``: ``examples`` images drawn from
    its partition (indices = partition mod clients) with a generator seeded by (seed, partition,
    round). Used by the clients to train and by the auditor's truth oracle to score."""
    source = _source(s.data, s.data_root)
    n = len(source)
    part = torch.arange(partition, n, s.clients)
    if len(part) < s.examples:
        raise GradleakError(f"partition {partition} has {len(part)} images, fewer than --examples {s.examples}")
    gen = torch.Generator().manual_seed(s.seed * 1_000_003 + partition * 7919 + server_round)
    chosen = part[torch.randperm(len(part), generator=gen)[: s.examples]].tolist()
    c = source.native_channels
    return Batch(images=torch.stack([source.load(i, s.image_size, c) for i in chosen]),
                 labels=torch.tensor([source.label(i) for i in chosen], dtype=torch.int64),
                 names=tuple(source.item_name(i) for i in chosen), source=source.name,
                 class_names=tuple(source.class_names))


def local_training(model: ModelSpec, batch: Batch, *, steps: int, batch_size: int, lr: float,
                   private_seed: int) -> float:
    """Plain PyTorch FedAvg client: ``steps`` SGD steps over ``batch`` in mini-batches of
    ``batch_size``, reshuffled each epoch with a private generator. Trains ``model`` in place;
    returns the mean loss."""
    module = model.module
    module.train()
    opt = torch.optim.SGD(module.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(private_seed)
    losses: list[float] = []
    order: list[int] = []
    x_all = model.normalize(batch.images)
    while len(losses) < steps:
        if not order:
            order = torch.randperm(batch.size, generator=gen).tolist()
        idx, order = order[:batch_size], order[batch_size:]
        opt.zero_grad()
        loss = F.cross_entropy(module(x_all[idx]), batch.labels[idx])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return sum(losses) / len(losses)


def _defend(model: ModelSpec, start: dict[str, torch.Tensor], defenses: list[str], seed: int) -> None:
    """Replace the client's weight difference by its defended version (update-level defenses)."""
    from ..defenses import apply_defenses
    from ..fl.update import SharedUpdate, UpdateMeta

    params = dict(model.module.named_parameters())
    delta = {n: (p.detach() - start[n]) for n, p in params.items()}
    meta = UpdateMeta(model=model.name, num_classes=model.num_classes, input_shape=model.input_shape,
                      mean=model.mean, std=model.std, batch_size=1, loss=0.0)
    defended = apply_defenses(SharedUpdate(gradients=delta, global_weights=start, meta=meta), defenses,
                              torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(start[n] + defended.gradients[n])


# ---------------------------------------------------------------- the Flower apps
def client_app(s: FederationSettings):  # noqa: ANN201 - flwr.clientapp.ClientApp
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()
    settings = asdict(s)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        torch.set_num_threads(1)
        fs = FederationSettings(**settings)
        partition = int(context.node_config["partition-id"])
        cfg = msg.content["config"]
        server_round = int(cfg["server-round"])
        steps, b, lr = int(cfg["local-steps"]), int(cfg["batch-size"]), float(cfg["lr"])
        model = build_example_model(fs)
        model.module.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        start = {n: p.detach().clone() for n, p in model.module.named_parameters()}
        batch = client_batch(fs, partition, server_round)
        private_seed = int.from_bytes(os.urandom(4), "little")   # the client's own shuffling
        loss = local_training(model, batch, steps=steps, batch_size=b, lr=lr, private_seed=private_seed)
        if fs.defense:
            _defend(model, start, fs.defense, private_seed)
        content = RecordDict({"arrays": ArrayRecord(model.module.state_dict()),
                              "metrics": MetricRecord({"train_loss": loss, "num-examples": batch.size}),
                              "client-info": ConfigRecord({"partition-id": partition})})
        return Message(content=content, reply_to=msg)

    return app


def server_app(s: FederationSettings, auditor: Any, result: dict[str, Any]):  # noqa: ANN201
    from flwr.app import ArrayRecord, ConfigRecord, Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg

    from .flower import AuditedStrategy

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        torch.set_num_threads(1)
        model = build_example_model(s)
        strategy = AuditedStrategy(FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=s.clients,
                                          min_available_nodes=s.clients), auditor)
        train_config = ConfigRecord({"lr": float(s.lr), "local-steps": int(s.local_steps),
                                     "batch-size": int(s.batch_size or s.examples)})
        try:
            out = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.module.state_dict()),
                                 num_rounds=s.rounds, train_config=train_config, timeout=600)
            result["train_metrics"] = {int(r): dict(m) for r, m in out.train_metrics_clientapp.items()}
        except BaseException as exc:  # noqa: BLE001 - reported to the caller, the simulation ends
            result["error"] = f"{type(exc).__name__}: {exc}"
            raise

    return app


def run_federation(s: FederationSettings, attack: dict[str, Any], out: str | Path, *,
                   save_reconstructions: bool = False) -> dict[str, Any]:
    """Run the example federation with the audit on; write DIR/audit.csv and DIR/audit.json.
    Returns {"rows": [...], "train_metrics": {...}, "wall_seconds": ...}."""
    from .auditor import AuditSettings, LeakageAuditor

    s.check()
    from flwr.simulation import run_simulation

    out = Path(out)
    model = build_example_model(s)   # the auditor's copy of the architecture (public)
    settings = AuditSettings(attack=dict(attack), out=out, local_steps=s.local_steps, local_batch_size=s.batch_size,
                             local_lr=s.lr, max_batch_size=max(64, s.examples), save_reconstructions=save_reconstructions,
                             defenses=tuple(s.defense))
    auditor = LeakageAuditor(model, settings, truth_fn=lambda rnd, client: client_batch(s, int(client), rnd))
    result: dict[str, Any] = {}
    levels = {name: logging.getLogger(name).level for name in ("flwr", "ray")}
    if not s.verbose:
        for name in levels:
            logging.getLogger(name).setLevel(logging.WARNING)
    cpus = s.ray_cpus or max(1, min(s.clients, _available_cpus()))
    t0 = time.perf_counter()
    try:
        run_simulation(server_app=server_app(s, auditor, result), client_app=client_app(s),
                       num_supernodes=s.clients,
                       backend_config={"client_resources": {"num_cpus": s.client_cpus, "num_gpus": 0.0},
                                       "init_args": {"num_cpus": cpus, "include_dashboard": False,
                                                     "log_to_driver": bool(s.verbose)}},
                       verbose_logging=s.verbose)
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        _shutdown_ray()
    result["wall_seconds"] = round(time.perf_counter() - t0, 1)
    auditor.write_summary({"federation": asdict(s), "train_metrics": result.get("train_metrics", {})})
    if "error" in result:
        raise GradleakError(f"the federation stopped: {result['error']}")
    expected = {(r, str(c)) for r in range(1, s.rounds + 1) for c in range(s.clients)}
    seen = {(int(row["round"]), str(row["client"])) for row in auditor.rows}
    if not expected <= seen:
        missing = sorted(expected - seen)[:3]
        raise GradleakError(f"the federation ended without every client's update being audited "
                            f"(missing round/client {missing}); rerun with --verbose to see Flower's log")
    result["rows"] = auditor.rows
    return result


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _shutdown_ray() -> None:
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except ImportError:
        pass
