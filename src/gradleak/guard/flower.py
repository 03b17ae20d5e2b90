"""The guard as a Flower client mod (flwr >= 1.20 message API; tested with 1.41), as Flower's own
fixedclipping_mod and LocalDpMod: it wraps the ClientApp's train handler, so that every reply is
checked before it leaves. One added line: ``ClientApp(mods=[GuardMod(...)])``, or
``app = guarded(app, GuardMod(...))`` for an app already built.

Before training, the received model is screened (fl.inspect) and, suspicious, refused under the
policy's ``on_suspicious`` (the handler is not called). After training, the reply's weight
difference is checked with the client's own batch as truth (gradleak.guard.guard_update). A
withheld update or a refused model is an error reply (flwr Error, the reason in it): Flower's
strategies leave error replies out of the aggregate, and a reply without arrays would break it.
Each decision is a row of ``out/guard.csv``, appended under a file lock (clients are processes)."""

from __future__ import annotations

import csv
import fcntl
import io
import os
import time
from pathlib import Path
from typing import Any, Callable

from ..paths import one_line
from .check import FAILED, REFUSED, WITHHELD, GuardRecord, fedavg_update, guard_update, screen_model
from .policy import REFUSE, SEND, GuardPolicy

try:
    from flwr.app import ArrayRecord, Context, Error, Message, MetricRecord
except ImportError as exc:  # pragma: no cover - the fl extra is missing
    from ..errors import ConfigError

    raise ConfigError("the Flower guard needs flwr: pip install 'gradleak[fl]'") from exc

#: guard.csv: one row per client per round.
COLUMNS = ("round", "client", "decision", "verdict_before", "verdict_after", "attack", "noise_multiplier",
           "noise_sigma", "clip", "seconds", "train_seconds", "run_before", "run_after", "reason")
#: The Error code of a reply the guard withheld (its reason says why).
GUARD_ERROR_CODE = 600
#: The guard's run folders, in ``out``.
RUNS = "guard-runs"

ModelFn = Callable[[Message, Context], Any]        # -> models.ModelSpec: the client's architecture
BatchFn = Callable[[Message, Context], Any]        # -> data.Batch: the batch it trains on this round
ThreatFn = Callable[[Message, Context], Any]       # -> fl.threats.ThreatModel


def train_config_threat(msg: Message, context: Context) -> Any:  # noqa: ARG001 - a ThreatFn
    """The client's FedAvg training as the round's train config announces it (the example's keys:
    local-steps, batch-size, lr; and, where given, momentum, weight-decay, local-epochs)."""
    from ..fl.threats import ThreatModel

    cfg = msg.content.config_records.get("config") or {}
    b = cfg.get("batch-size")
    return ThreatModel(name="fedavg", local_steps=int(cfg.get("local-steps", 1)),
                       local_batch_size=None if b in (None, 0) else int(b), local_lr=float(cfg.get("lr", 0.01)),
                       local_momentum=float(cfg.get("momentum", 0.0)),
                       local_weight_decay=float(cfg.get("weight-decay", 0.0)),
                       local_epochs=int(cfg["local-epochs"]) if cfg.get("local-epochs") else None)


class GuardLog:
    """``out/guard.csv``, appended one row at a time under an exclusive lock (several client
    processes share it); the header is written by whoever finds the file empty."""

    def __init__(self, out: str | Path):
        self.out = Path(out)

    @property
    def path(self) -> Path:
        return self.out / "guard.csv"

    def add(self, row: dict[str, Any]) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
        w.writerow({k: _cell(row.get(k)) for k in COLUMNS})
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            head = "" if os.fstat(fd).st_size else ",".join(COLUMNS) + "\n"
            os.write(fd, (head + buf.getvalue()).encode("utf-8"))
        finally:
            os.close(fd)


class GuardMod:
    """The Flower client mod: (msg, context, call_next) -> reply, acting on train messages only.

    model_fn(msg, context): the client's model (models.ModelSpec of its own architecture; the
    received weights are loaded into it here). batch_fn(msg, context): the batch it trains on in
    this round (the truth). threat_fn: how it trains (default :func:`train_config_threat`).
    arch: the client's architecture name for fl.inspect (None: no screening). out: guard.csv and
    the run folders (None: neither). data_root: the folder of the batches' named source
    (guard_update's)."""

    def __init__(self, policy: GuardPolicy, *, model_fn: ModelFn, batch_fn: BatchFn, arch: str | None = None,
                 threat_fn: ThreatFn = train_config_threat, out: str | Path | None = None,
                 arrays_key: str = "arrays", num_examples_key: str = "num-examples",
                 data_root: str | Path | None = None):
        if not isinstance(policy, GuardPolicy):
            from ..errors import ConfigError

            raise ConfigError(f"GuardMod: policy must be a GuardPolicy (got {type(policy).__name__})")
        self.policy, self.model_fn, self.batch_fn, self.arch = policy, model_fn, batch_fn, arch
        self.threat_fn, self.arrays_key, self.num_examples_key = threat_fn, arrays_key, num_examples_key
        self.out = Path(out) if out is not None else None
        self.data_root = data_root
        self.log = GuardLog(self.out) if self.out is not None else None

    def __call__(self, msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
        if not str(msg.metadata.message_type).split(".")[0] == "train":
            return call_next(msg, context)
        t0 = time.monotonic()
        rnd = int((msg.content.config_records.get("config") or {}).get("server-round", 0))
        client = str(context.node_config.get("partition-id", msg.metadata.dst_node_id))
        name = f"round-{rnd:03d}-client-{''.join(c if c.isalnum() else '_' for c in client)[:60]}"
        received = msg.content.array_records[self.arrays_key].to_torch_state_dict()
        model = self.model_fn(msg, context)
        suspicious, why = False, ""
        if self.arch is not None:
            suspicious, why, _ = screen_model(received, self.arch, num_classes=model.num_classes,
                                              channels=model.input_shape[0], image_size=model.input_shape[1])
        if not suspicious:
            try:
                model.module.load_state_dict(received)
            except (RuntimeError, ValueError, KeyError) as exc:
                suspicious, why = True, one_line(f"the received model does not fit the client's model: {exc}", 300)
        if suspicious and self.policy.on_suspicious == REFUSE:
            record = GuardRecord(name=name, decision=REFUSED, reason=why, seconds=round(time.monotonic() - t0, 3))
            self._log(rnd, client, record, 0.0)
            return Message(error=Error(GUARD_ERROR_CODE, f"guard: {REFUSED}: {why}"), reply_to=msg)
        t_train = time.monotonic()
        reply = call_next(msg, context)
        train_seconds = time.monotonic() - t_train
        if reply.has_error():
            return reply
        try:
            record, sent = self._check(msg, context, reply, model, received, name)
        except Exception as exc:  # noqa: BLE001 - the guard never blocks the federation: a recorded decision
            why = one_line(f"{type(exc).__name__}: {exc}", 300)
            send = self.policy.on_error == SEND
            record = GuardRecord(name=name, decision="passed" if send else WITHHELD, verdict_before=FAILED,
                                 reason=f"the guard failed ({why}); on_error {self.policy.on_error}")
            sent = reply if send else None
        record.seconds = round(time.monotonic() - t0 - train_seconds, 3)
        self._log(rnd, client, record, train_seconds)
        if sent is None:
            return Message(error=Error(GUARD_ERROR_CODE, f"guard: {record.decision}: {record.reason}"), reply_to=msg)
        return sent

    def _check(self, msg: Message, context: Context, reply: Message, model: Any, received: dict[str, Any],
               name: str) -> tuple[GuardRecord, Message | None]:
        content = reply.content
        weights = content.array_records[self.arrays_key].to_torch_state_dict()
        metrics = next(iter(content.metric_records.values()))
        loss = next((float(metrics[k]) for k in ("train_loss", "train-loss", "loss") if k in metrics), float("nan"))
        update = fedavg_update(model, received, weights, threat=self.threat_fn(msg, context),
                               num_examples=int(metrics[self.num_examples_key]), loss=loss)
        batch = self.batch_fn(msg, context)
        result = guard_update(model, update, batch, self.policy, name=name, data_root=self.data_root,
                              out=self.out / RUNS if self.out is not None else None)
        if result.update is None:
            return result.record, None
        if result.update is not update:   # remedied: the noised difference on the received weights
            for n, d in result.update.gradients.items():
                weights[n] = (received[n].float() + d).to(weights[n].dtype)
            content[self.arrays_key] = ArrayRecord(weights)
        rec = result.record
        key = next(iter(content.metric_records))
        extra = {"guard-remedied": int(rec.decision == "remedied"), "guard-noise-sigma": float(rec.noise_sigma or 0.0),
                 "guard-seconds": float(rec.seconds)}
        content[key] = MetricRecord({**dict(metrics), **extra})
        return rec, reply

    def _log(self, rnd: int, client: str, record: GuardRecord, train_seconds: float) -> None:
        if self.log is None:
            return
        runs = [c.run for c in record.checks]
        self.log.add({"round": rnd, "client": client, **{k: getattr(record, k) for k in (
            "decision", "verdict_before", "verdict_after", "attack", "noise_multiplier", "noise_sigma", "clip",
            "seconds", "reason")}, "train_seconds": round(train_seconds, 3),
            "run_before": f"{RUNS}/{runs[0]}" if runs and runs[0] else "",
            "run_after": f"{RUNS}/{runs[-1]}" if len(runs) > 1 and runs[-1] else ""})


def guarded(app: Any, mod: Callable[..., Message]) -> Any:
    """``app`` (a flwr ClientApp already built) with ``mod`` around every message it handles: a
    new ClientApp whose handlers call ``app``."""
    from flwr.clientapp import ClientApp

    outer = ClientApp(mods=[mod])
    for kind in ("train", "evaluate", "query"):
        getattr(outer, kind)()(lambda msg, ctx: app(msg, ctx))
    return outer


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v) if v == v else ""
    return one_line(str(v), 2000) if isinstance(v, str) else str(v)


__all__ = ["COLUMNS", "GUARD_ERROR_CODE", "GuardLog", "GuardMod", "RUNS", "guarded", "train_config_threat"]
