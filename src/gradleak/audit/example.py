"""A runnable example federation with the audit switched on: Fashion-MNIST split over N
clients, FedAvg, Flower's simulation engine (``flwr.simulation.run_simulation`` on Ray)."""

from __future__ import annotations

import os

# Flower sends no telemetry and checks for no update from gradleak, whatever the caller's
# environment says (Flower reads the telemetry switch once, when it is first imported; see
# _flower_offline for a process that imported it earlier). Ray's settings: gradleak.localray.
os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"

import contextlib  # noqa: E402
import functools  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import asdict  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ..data import Batch, open_source  # noqa: E402
from ..errors import ConfigError, GradleakError  # noqa: E402
from ..models import ModelSpec, build_model  # noqa: E402
from ..paths import one_line  # noqa: E402
from .auditor import AuditStopped  # noqa: E402
from .settings import FederationSettings  # noqa: E402,F401  (re-exported: the example's settings)


@functools.lru_cache(maxsize=4)
def _source(data: str, root: str | None):  # noqa: ANN202 - one decoded copy per process
    return open_source(data, root=root, split="train")


def build_example_model(s: FederationSettings) -> ModelSpec:
    """The federation's global model as the server sends it: ``--model`` (initialised with the
    federation's seed), behind the block of ``--server`` when the server is malicious
    (models.server.server_model; its kwargs record the canonical server text). The server, each
    client (which loads the server's arrays into it) and the auditor build the same one."""
    from ..models.server import server_model

    source = _source(s.data, s.data_root)
    victim = build_model(s.model, num_classes=source.num_classes, channels=source.native_channels,
                         image_size=s.image_size, seed=s.seed, width=s.width)
    try:
        return server_model(victim, s.server)
    except ConfigError as exc:   # a value out of the builder's range (trap:rows=0): name the flag
        raise ConfigError(f"audit-flower: --server {one_line(s.server, 80)}: {exc}") from None


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


def client_optimizer(params: Any, train: dict[str, Any]) -> torch.optim.Optimizer:
    """The torch.optim optimizer a train config announces (FederationSettings.train_config's keys)."""
    name, lr, wd = str(train.get("optimizer", "sgd")), float(train["lr"]), float(train.get("weight-decay", 0.0))
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=float(train.get("momentum", 0.0)),
                               nesterov=bool(train.get("nesterov", False)), weight_decay=wd)
    betas = tuple(float(b) for b in train.get("betas", (0.9, 0.999)))
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[name]
    return cls(params, lr=lr, betas=betas, eps=float(train.get("eps", 1e-8)), weight_decay=wd)  # type: ignore[arg-type]


def local_training(model: ModelSpec, batch: Batch, *, steps: int, batch_size: int, lr: float,
                   private_seed: int, train: dict[str, Any] | None = None) -> float:
    """Plain PyTorch FedAvg client: ``steps`` steps of a torch.optim optimizer (``train``: the
    train config's entries, client_optimizer; default plain SGD at ``lr``) over ``batch`` in
    mini-batches of ``batch_size``, reshuffled each epoch with a private generator, each
    mini-batch augmented privately (``train["augment"]``: fl.augment's flips and crops). Trains
    ``model`` in place; returns the mean loss."""
    from ..fl.augment import augment
    from ..fl.threats import augment_generator

    train = {**(train or {}), "lr": lr}
    module = model.module
    module.train()
    opt = client_optimizer(module.parameters(), train)
    gen = torch.Generator().manual_seed(private_seed)
    flips = augment_generator(private_seed)   # its own stream of augmentation draws, apart from the shuffling
    policy, padding = str(train.get("augment", "none")), int(train.get("crop-padding", 4))
    losses: list[float] = []
    order: list[int] = []
    while len(losses) < steps:
        if not order:
            order = torch.randperm(batch.size, generator=gen).tolist()
        idx, order = order[:batch_size], order[batch_size:]
        opt.zero_grad()
        x = model.normalize(augment(batch.images[idx], policy, padding, flips))
        loss = F.cross_entropy(module(x), batch.labels[idx])
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
        if "local-epochs" in cfg:   # epochs over the client's own examples
            steps = int(cfg["local-epochs"]) * -(-fs.examples // min(b, fs.examples))
        model = build_example_model(fs)
        model.module.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        start = {n: p.detach().clone() for n, p in model.module.named_parameters()}
        batch = client_batch(fs, partition, server_round)
        private_seed = int.from_bytes(os.urandom(4), "little")   # the client's own shuffling
        loss = local_training(model, batch, steps=steps, batch_size=b, lr=lr, private_seed=private_seed,
                              train=dict(cfg))
        if fs.defense:
            _defend(model, start, fs.defense, private_seed)
        content = RecordDict({"arrays": ArrayRecord(model.module.state_dict()),
                              "metrics": MetricRecord({"train_loss": loss, "num-examples": batch.size}),
                              "client-info": ConfigRecord({"partition-id": partition})})
        return Message(content=content, reply_to=msg)

    return app


class StoppableGrid:
    """The Grid Flower hands the ServerApp, whose wait for the clients' replies ends when ``stop``
    is set (raising :class:`AuditStopped`). Without it the ServerApp's thread, which the
    interpreter waits for at exit, would wait out the round's timeout (600 s) for replies that
    the stopped simulation never sends. Everything else is the grid's own."""

    def __init__(self, grid: Any, stop: threading.Event):
        self._grid = grid
        self._stop = stop

    def __getattr__(self, name: str) -> Any:
        if name in ("_grid", "_stop"):
            raise AttributeError(name)
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> list[Any]:
        """flwr's InMemoryGrid.send_and_receive (push, then pull until every reply is in or
        ``timeout`` seconds passed), checking ``stop`` between pulls."""
        if self._stop.is_set():
            raise AuditStopped("the audit was stopped")
        waiting = set(self._grid.push_messages(messages))
        end = None if timeout is None else time.monotonic() + timeout
        replies: list[Any] = []
        while waiting and (end is None or time.monotonic() < end):
            got = list(self._grid.pull_messages(waiting))
            replies.extend(got)
            waiting.difference_update(m.metadata.reply_to_message_id for m in got)
            if waiting and self._stop.wait(float(getattr(self._grid, "pull_interval", 0.1))):
                raise AuditStopped("the audit was stopped")
        return replies


def server_app(s: FederationSettings, auditor: Any, result: dict[str, Any],  # noqa: ANN201
               stop: threading.Event | None = None):
    """The ServerApp: FedAvg wrapped in the audit. ``stop``: set, it ends the app's waits
    (:class:`StoppableGrid`); ``result["server_thread"]`` is the thread the app runs in."""
    from flwr.app import ArrayRecord, ConfigRecord, Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg

    from .flower import AuditedStrategy

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        result["server_thread"] = threading.current_thread()
        if stop is not None:
            grid = StoppableGrid(grid, stop)
        torch.set_num_threads(1)
        model = build_example_model(s)
        strategy = AuditedStrategy(FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=s.clients,
                                          min_available_nodes=s.clients), auditor)
        train_config = ConfigRecord(s.train_config())   # the clients' local training, announced
        try:
            out = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.module.state_dict()),
                                 num_rounds=s.rounds, train_config=train_config, timeout=600)
            result["train_metrics"] = {int(r): dict(m) for r, m in out.train_metrics_clientapp.items()}
        except BaseException as exc:  # noqa: BLE001 - reported to the caller, the simulation ends
            result["error"] = one_line(f"{type(exc).__name__}: {exc}")
            raise

    return app


@contextlib.contextmanager
def _quiet_logs(verbose: bool) -> Iterator[None]:
    """Flower's and Ray's loggers at WARNING for the simulation (unless ``verbose``), restored after."""
    levels = {name: logging.getLogger(name).level for name in ("flwr", "ray")}
    if not verbose:
        for name in levels:
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def _check_every_update_audited(s: FederationSettings, rows: list[dict[str, Any]]) -> None:
    """GradleakError unless the audit holds a row for every round and client."""
    expected = {(r, str(c)) for r in range(1, s.rounds + 1) for c in range(s.clients)}
    seen = {(int(row["round"]), str(row["client"])) for row in rows}
    if not expected <= seen:
        missing = sorted(expected - seen)[:3]
        raise GradleakError(f"the federation ended without every client's update being audited "
                            f"(missing round/client {missing}); rerun with --verbose to see Flower's log")


def run_federation(s: FederationSettings, attack: dict[str, Any], out: str | Path, *,
                   recorded_out: str | Path | None = None) -> dict[str, Any]:
    """Run the example federation with the audit on; write DIR/runs/ (a run folder per attacked
    update), DIR/audit.csv (their index) and DIR/audit.json.
    Returns {"rows": [...], "train_metrics": {...}, "wall_seconds": ...}. ``recorded_out``: the
    folder audit.json names as the audit's (default ``out``; `gradleak audit-flower` writes into a
    staging folder renamed to --out when the audit is complete).

    Ray keeps no SIGINT/SIGTERM handler of its own (the caller's stay in charge: the CLI turns
    SIGTERM into an interrupt). When the simulation stops by an exception (Ctrl-C, SIGTERM, an
    error), the ServerApp's thread is stopped too: its attack in progress ends after the step
    it is in, its wait for replies at once, and the auditor writes nothing more."""
    from .auditor import AuditSettings, LeakageAuditor

    s.check()
    _check_partitions(s)
    out = Path(out)
    model = build_example_model(s)   # the auditor's copy of the architecture (public)
    try:
        from flwr.simulation import run_simulation
    except ImportError:
        raise ConfigError("the Flower audit needs flwr[simulation]: pip install 'gradleak[fl]'") from None
    from ..localray import local_ray

    settings = AuditSettings(attack=dict(attack), out=out, local_steps=s.steps, local_batch_size=s.batch_size,
                             local_lr=s.lr, max_batch_size=max(64, s.examples), defenses=tuple(s.defense),
                             data_root=s.data_root)
    auditor = LeakageAuditor(model, settings, truth_fn=lambda rnd, client: client_batch(s, int(client), rnd))
    result: dict[str, Any] = {}
    cpus = s.ray_cpus or max(1, min(s.clients, _available_cpus()))
    stop = threading.Event()
    t0 = time.perf_counter()
    # Flower's simulation engine uses the Ray instance running in this process (and shuts it
    # down at the end): gradleak's, on loopback only and probing nothing.
    with _quiet_logs(s.verbose), local_ray(cpus, verbose=s.verbose, keep_signals=True), _flower_offline():
        try:
            run_simulation(server_app=server_app(s, auditor, result, stop=stop), client_app=client_app(s),
                           num_supernodes=s.clients,
                           backend_config={"client_resources": {"num_cpus": s.client_cpus, "num_gpus": 0.0}},
                           verbose_logging=s.verbose)
        except BaseException:
            _stop_server(stop, auditor, result.get("server_thread"))
            raise
    result.pop("server_thread", None)
    result["wall_seconds"] = round(time.perf_counter() - t0, 1)
    auditor.write_summary({"federation": asdict(s), "train_metrics": result.get("train_metrics", {})},
                          out=recorded_out if recorded_out is not None else out)
    if "error" in result:
        raise GradleakError(f"the federation stopped: {result['error']}")
    _check_every_update_audited(s, auditor.rows)
    result["rows"] = auditor.rows
    return result


# How long a stopped audit waits for the ServerApp's thread (an attack step, a pull of replies).
STOP_WAIT_SECONDS = 30.0


def _stop_server(stop: threading.Event, auditor: Any, thread: threading.Thread | None) -> None:
    """Stop the ServerApp's thread (see run_federation) and wait for it (at most
    :data:`STOP_WAIT_SECONDS`): nothing of the audit runs, or writes, after this returns."""
    stop.set()
    auditor.stop()
    if thread is not None and thread is not threading.current_thread():
        thread.join(STOP_WAIT_SECONDS)


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _check_partitions(s: FederationSettings) -> None:
    """Every client's partition (the images whose index is p mod clients) holds ``examples``
    images; the smallest has len(source) // clients."""
    n = len(_source(s.data, s.data_root))
    if n // s.clients < s.examples:
        raise ConfigError(f"audit-flower: {s.clients} clients split the {n} images of {s.data} into partitions of "
                          f"{n // s.clients}, fewer than --examples {s.examples}")


@contextlib.contextmanager
def _flower_offline() -> Iterator[None]:
    """Flower's telemetry off for the block, also in a process that imported Flower before this
    module set FLWR_TELEMETRY_ENABLED=0 (Flower reads it once, at import)."""
    telemetry = sys.modules.get("flwr.supercore.telemetry")
    enabled = getattr(telemetry, "FLWR_TELEMETRY_ENABLED", None)
    if enabled is not None:
        telemetry.FLWR_TELEMETRY_ENABLED = "0"
    try:
        yield
    finally:
        if enabled is not None:
            telemetry.FLWR_TELEMETRY_ENABLED = enabled
