"""The leakage auditor: what a curious server could reconstruct from each client's update."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import signal
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from ..attacks.configs import FLAT_FIELDS
from ..config import AttackConfig, make_config
from ..data import Batch
from ..errors import ConfigError, GradleakError
from ..fl.threats import ThreatModel
from ..fl.update import SharedUpdate, UpdateMeta, atomic_write_bytes
from ..models import ModelSpec
from ..paths import one_line
from ..specs import member_flags

TruthFn = Callable[[int, str], "Batch | None"]

# audit.csv, the index: who (round, client, Flower node), the attack (auto: the one it used), what
# the server sent (its --server text as the model records it, every value resolved; "honest" for a
# model without a server's block), how it ended and its verdict (gradleak.report.risk.judge on the
# run's metrics), the headline numbers (psnr_mean empty without ground truth), the run folder
# (relative to DIR; empty when the update was not attacked) and the error of an update that was not
# attacked or failed.
INDEX_COLUMNS = ("round", "client", "node_id", "attack", "server", "status", "verdict", "psnr_mean",
                 "relative_gradient_distance", "run", "error")
# The run folders' folder in DIR.
RUNS = "runs"
# metrics.json's "data" when the server does not know the client's data (no ground truth).
UNKNOWN_DATA = "unknown (a client's update)"
# Fields of the attack config the auditor takes (everything else describes a simulated client).
ATTACK_FIELDS = ("attack", *FLAT_FIELDS, *member_flags(), "seed", "device", "log_every")


@dataclass
class AuditSettings:
    """What the auditor runs and where it writes.

    attack:            gradleak AttackConfig fields of the attack (``attack``, ``iterations``,
                       ``lr``, ``seeds``, ...), validated exactly as ``gradleak attack`` does.
    out:               folder for audit.csv, audit.json and runs/ (see the module's notes in docs/).
    local_steps, local_batch_size, local_lr, local_epochs, local_optimizer, ...: the clients'
                       public local training (fl.threats.ThreatModel's fields, torch.optim's
                       meanings), used where the round's train config does not carry them (see
                       ``FedAvgKeys``). ``local_epochs`` (when set) replaces ``local_steps``.
    data_root:         the folder of the clients' named data source (open_source's ``root``;
                       None: its default place), read to score against the truth: the IIP pool
                       and the source's own mean prior come from the truth's source.
    max_batch_size:    clients that trained on more examples are logged as skipped (an
                       optimisation-based attack on hundreds of images is pointless).
    every:             audit rounds 1, 1 + every, 1 + 2*every, ...
    defenses:          defense specs the clients are known to apply (recorded in the update's
                       public metadata and in the rows).
    """

    attack: dict[str, Any] = field(default_factory=lambda: {"attack": "dlg"})
    out: str | Path = "audit"
    local_steps: int = 1
    local_batch_size: int | None = None
    local_lr: float = 0.01
    local_epochs: int | None = None
    local_optimizer: str = "sgd"
    local_momentum: float = 0.0
    local_nesterov: bool = False
    local_weight_decay: float = 0.0
    local_betas: tuple[float, float] = (0.9, 0.999)
    local_eps: float = 1e-8
    local_augment: str = "none"
    local_crop_padding: int = 4
    data_root: str | Path | None = None
    max_batch_size: int = 64
    every: int = 1
    defenses: tuple[str, ...] = ()

    def attack_config(self) -> AttackConfig:
        unknown = sorted(set(self.attack) - set(ATTACK_FIELDS))
        if unknown:
            raise ConfigError(f"audit attack settings: {unknown[0]!r} is not an attack setting "
                              f"(allowed: {', '.join(ATTACK_FIELDS)})")
        return make_config(**self.attack, progress=False, paper_metrics=False)


class LeakageAuditor:
    """Attack individual client updates and log leakage; thread-safe; see the module's notes in docs/."""

    def __init__(self, model: ModelSpec, settings: AuditSettings, truth_fn: TruthFn | None = None):
        from ..attacks import resolve_attack
        from ..runtime import resolve_device

        self.model = model
        self.settings = settings
        self.truth_fn = truth_fn
        self.cfg = settings.attack_config()
        resolve_attack(self.cfg.model_dump(), bn_statistics_shared=True)  # the name; options the attack ignores
        self.device = resolve_device(self.cfg.device)
        if settings.every < 1 or settings.max_batch_size < 1:
            raise ConfigError("audit: every and max_batch_size must be >= 1")
        self.threat({}, FedAvgKeys(), settings.local_batch_size or 1)    # validates the defaults
        self.out = Path(settings.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict[str, Any]] = []
        self._claimed: set[str] = set()     # run folder names given out (being written or written)
        self._lock = threading.Lock()
        self._stopped: int | None = None      # stop(): the signal number it was given
        self._sessions: dict[int, Any] = {}   # the attacks running now: id -> their Session
        self.param_names = [n for n, p in model.module.named_parameters() if p.requires_grad]
        # what the server sent: models.server.server_model records a malicious server's block here
        self.server = str(model.kwargs.get("server") or "honest")
        self.write_index()

    # ------------------------------------------------------------------ the update
    def shared_update(self, global_weights: Mapping[str, torch.Tensor], client_weights: Mapping[str, torch.Tensor],
                      *, num_examples: int, threat: ThreatModel, loss: float = float("nan")) -> SharedUpdate:
        """The attacker's input: W_S - W_0 for every trainable parameter, the global weights
        the client started from, and the public fedavg record."""
        missing = [n for n in self.param_names if n not in client_weights or n not in global_weights]
        if missing:
            raise GradleakError(f"client weights lack parameter {missing[0]!r} of model {self.model.name}")
        gw = {k: torch.as_tensor(v).detach().float().cpu().clone() for k, v in global_weights.items()}
        delta = {n: torch.as_tensor(client_weights[n]).detach().float().cpu() - gw[n] for n in self.param_names}
        for n, d in delta.items():
            if d.shape != self.model.module.get_parameter(n).shape:
                raise GradleakError(f"parameter {n!r} has shape {list(d.shape)}, the model expects "
                                    f"{list(self.model.module.get_parameter(n).shape)}")
        m = self.model
        meta = UpdateMeta(model=m.name, num_classes=m.num_classes, input_shape=m.input_shape, mean=m.mean, std=m.std,
                          batch_size=int(num_examples), loss=float(loss), model_kwargs=dict(m.kwargs),
                          threat=threat.record(int(num_examples)), defenses=list(self.settings.defenses))
        return SharedUpdate(gradients=delta, global_weights=gw, meta=meta)

    def threat(self, train_config: Mapping[str, Any] | None, keys: "FedAvgKeys",
               num_examples: int | None = None) -> ThreatModel:
        """The round's public FedAvg client (its local training): from the train config sent to
        the clients where it carries each entry (``keys``), else the settings' defaults. With
        epochs announced, the steps are E x ceil(K / B) over the client's ``num_examples`` K."""
        cfg = dict(train_config or {})
        s = self.settings
        values = {field: cfg.get(getattr(keys, field), getattr(s, field)) for field in FedAvgKeys.__dataclass_fields__}
        b, epochs = values["local_batch_size"], values["local_epochs"]
        try:
            b = None if b in (None, 0) else int(b)
            if epochs is not None:
                epochs = int(epochs)
                k = int(num_examples if num_examples is not None else b or 1)
                values["local_steps"] = ThreatModel.epoch_steps(k, min(b or k, k), epochs)
            betas = values["local_betas"]
            return ThreatModel(name="fedavg", local_steps=int(values["local_steps"]), local_batch_size=b,
                               local_lr=float(values["local_lr"]), local_epochs=epochs,
                               local_optimizer=str(values["local_optimizer"]),
                               local_momentum=float(values["local_momentum"]),
                               local_nesterov=_flag(values["local_nesterov"]),
                               local_weight_decay=float(values["local_weight_decay"]),
                               local_betas=(float(betas[0]), float(betas[1])), local_eps=float(values["local_eps"]),
                               local_augment=str(values["local_augment"]),
                               local_crop_padding=int(values["local_crop_padding"]))
        except (TypeError, ValueError, IndexError, ConfigError) as exc:
            raise ConfigError(f"audit: the clients' local training in the train config is invalid: {exc}") from None

    def should_audit(self, server_round: int) -> bool:
        return (server_round - 1) % self.settings.every == 0

    # ------------------------------------------------------------------ stopping
    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop auditing (the federation is ending: Ctrl-C, SIGTERM, an error): every attack in
        progress ends after the step it is in, and :meth:`audit` then raises
        :class:`AuditStopped` (in whichever thread it runs); no row or run folder is started
        any more. Thread-safe; for a caller that discards the audit's folder next."""
        with self._lock:
            self._stopped = int(signum)
            for session in self._sessions.values():
                session.interrupted = int(signum)

    @property
    def stopped(self) -> bool:
        return self._stopped is not None

    def _check_running(self) -> None:
        if self._stopped is not None:
            raise AuditStopped("the audit was stopped")

    # ------------------------------------------------------------------ one client
    def audit(self, server_round: int, client: str, global_weights: Mapping[str, torch.Tensor],
              client_weights: Mapping[str, torch.Tensor], *, num_examples: int, threat: ThreatModel,
              loss: float = float("nan"), node_id: int | str = "") -> dict[str, Any]:
        """Attack one client's update of one round: write its run folder, append and return its
        index row. Never raises for a failed attack (the row says why): an audit must not stop
        the federation."""
        from ..engine import Session
        from ..pipeline.image import ImageCase
        from ..pipeline.run import attack_case

        self._check_running()
        row: dict[str, Any] = {"round": server_round, "client": client, "node_id": node_id, "attack": self.cfg.attack,
                               "server": self.server}
        if num_examples > self.settings.max_batch_size:
            row.update(status="skipped", error=f"{num_examples} examples > max_batch_size {self.settings.max_batch_size}")
            return self._add(row)
        try:
            update = self.shared_update(global_weights, client_weights, num_examples=num_examples, threat=threat,
                                        loss=loss)
            norm = math.sqrt(sum(float(d.double().pow(2).sum()) for d in update.gradients.values()))
            # the one pipeline, as the server sees it: the update and the model, no truth
            case = ImageCase(update=update, model=self.model, truth=None, data=UNKNOWN_DATA)
            t0 = time.perf_counter()
            # the in-memory session attack_case would make, kept so that stop() can end the attack
            session = Session(every=0, retries=self.cfg.divergence_retries)
            with self._lock:
                self._check_running()
                self._sessions[id(session)] = session
            try:
                result, attack = attack_case(self.cfg, case, session=session, device=self.device)
            finally:
                with self._lock:
                    self._sessions.pop(id(session), None)
            self._check_running()
            seconds = round(time.perf_counter() - t0, 3)
            truth = self.truth_fn(server_round, client) if self.truth_fn is not None else None
            if truth is not None:   # scoring only, after the attack returned
                case = replace(case, truth=truth, data=truth.source or UNKNOWN_DATA)
            metrics = self._metrics(case, result.metrics, result.reconstruction)
            metrics["audit"] = {"round": server_round, "client": client, "node_id": node_id, "update_norm": norm,
                                "attack_seconds": seconds}
            row["run"] = self._write_run(server_round, client, case, attack, result, metrics)
            row.update(status="ok", attack=metrics["attack"], psnr_mean=metrics.get("psnr_mean"),  # auto: the one used
                       relative_gradient_distance=metrics["convergence"]["relative_gradient_distance"])
        except AuditStopped:
            raise
        except KeyboardInterrupt:
            if self._stopped is not None:   # the attack's loop, ended by stop()
                raise AuditStopped("the audit was stopped") from None
            raise
        except GradleakError as exc:
            return self._add({**row, "status": "failed", "error": f"{type(exc).__name__}: {exc}"})
        except Exception as exc:  # noqa: BLE001 - numerical trouble, a model that does not fit: logged
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            return self._add({**row, "status": "failed", "error": error})
        return self._add(row, metrics)

    def _metrics(self, case: Any, attacked: Mapping[str, Any], recon: Any) -> dict[str, Any]:
        """The run's metrics: the attack's (judged from the attacker's side), then, with the
        client's true batch in ``case``, its scores against it, judged again (gradleak.outcome).
        The audit runs no positive control: what it does not see leak is never "defended"."""
        from ..outcome import evidence_from_metrics, judge

        metrics = dict(attacked)
        if case.truth is None:
            return metrics
        scored = case.metrics(self.scoring_config(case), recon, self.device)
        metrics.update({k: v for k, v in scored.items() if k != "attack"})   # "attack": the one auto used
        metrics.update(judge(evidence_from_metrics(metrics)).to_dict())
        return metrics

    def scoring_config(self, case: Any) -> AttackConfig:
        """The attack config the truth is scored with: its ``data`` the named source the client's
        batch comes from (the IIP pool and the source's own mean prior of the recognisability
        evidence are that source's, as the client's guard scores it), ``data_root`` the settings'.
        A truth from no named source: no source pool (``case`` gets the public decoys only), never
        the config's default source, whose photos are another data set."""
        from ..data import SOURCE_NAMES
        from ..metrics.recognisable import candidate_pool

        name = str(case.truth.source or "").strip().lower()
        if name in SOURCE_NAMES:
            root = None if self.settings.data_root is None else str(self.settings.data_root)
            return self.cfg.model_copy(update={"data": name, "data_root": root})
        if not case.iip_loaded:
            case.iip_images, case.iip_loaded = candidate_pool(None, case.truth.images), True
        return self.cfg

    def _write_run(self, server_round: int, client: str, case: Any, attack: Any, result: Any,
                   metrics: dict[str, Any]) -> str:
        """DIR/runs/round-RRR-client-C/ (a name not taken yet: -2, -3, ... when it is), written as
        `gradleak attack` writes its run folder; config.json records what the update stands for
        (model, batch size, FedAvg hyper-parameters), the data as metrics.json names them (the
        truth's source, else :data:`UNKNOWN_DATA`) and ``out`` as the folder's path in DIR.
        Returns that path."""
        from ..pipeline.image import update_file_values
        from ..pipeline.record import write_run
        from ..pipeline.run import recorded_config

        with self._lock:
            self._check_running()
            name = self._run_name(server_round, client)
        rel = f"{RUNS}/{name}"
        config = recorded_config(self.cfg, case, attack, Path(rel)).model_copy(
            update={**update_file_values(self.cfg, case.update.meta), "data": case.data})
        try:
            write_run(self.out / RUNS / name, config, case, result.reconstruction, metrics, result.history,
                      attack=attack)
        except BaseException:
            with self._lock:
                self._claimed.discard(name)
            raise
        return rel

    def _run_name(self, server_round: int, client: str) -> str:
        """A run folder name for this client and round, claimed (call with the lock held): the
        client's name with every character but ASCII letters, digits, "-" and "_" as "_"."""
        safe = "".join(c if (c.isascii() and c.isalnum()) or c in "-_" else "_" for c in str(client))[:100] or "_"
        base = f"round-{server_round:03d}-client-{safe}"
        name, n = base, 1
        while name in self._claimed or os.path.lexists(self.out / RUNS / name):
            n += 1
            name = f"{base}-{n}"
        self._claimed.add(name)
        return name

    # ------------------------------------------------------------------ the log
    def log_failure(self, server_round: int, client: str, error: str, node_id: int | str = "") -> dict[str, Any]:
        """A row for an update that could not be attacked (malformed reply, bad config)."""
        return self._add({"round": server_round, "client": client, "node_id": node_id, "attack": self.cfg.attack,
                          "server": self.server, "status": "failed", "error": error})

    def _add(self, row: dict[str, Any], metrics: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Judge the row (with ``metrics``: its run's), append it and rewrite the index."""
        from ..report.risk import judge

        # the dashboard's verdict (gradleak.report.risk.judge on the run's metrics, i.e.
        # gradleak.outcome.judge): leaked / defended / inconclusive / failed / skipped. The audit
        # runs no positive control, so an update it does not see leak is inconclusive, never defended
        status = row.get("status", "failed")
        row["verdict"] = judge(status, None, None, attack=row.get("attack"),
                               metrics=dict(metrics) if metrics is not None else None).label
        row = {k: row.get(k) for k in INDEX_COLUMNS}
        with self._lock:
            self._check_running()
            self.rows.append(row)
            self.write_index()
        return row

    def write_index(self) -> Path:
        """Rewrite DIR/audit.csv atomically: one row per audited update (:data:`INDEX_COLUMNS`)."""
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(INDEX_COLUMNS), lineterminator="\n")
        w.writeheader()
        for row in self.rows:
            w.writerow({k: _csv(row.get(k)) for k in INDEX_COLUMNS} | {"error": _error_cell(row.get("error"))})
        path = self.out / "audit.csv"
        atomic_write_bytes(path, buf.getvalue().encode("utf-8"))
        return path

    def write_summary(self, extra: Mapping[str, Any] | None = None, *, out: str | Path | None = None) -> Path:
        """DIR/audit.json: the settings, the attack config and every index row. ``out``: the folder
        the settings name as the audit's (default: the one it writes to; a caller that renames
        a staging folder into place names the final one)."""
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in self.settings.__dict__.items()}
        if out is not None:
            settings["out"] = str(out)
        doc = {"attack_config": self.cfg.model_dump(mode="json"), "model": self.model.name, "server": self.server,
               "settings": settings, "rows": self.rows, **dict(extra or {})}
        path = self.out / "audit.json"
        atomic_write_bytes(path, (json.dumps(doc, indent=2, default=str) + "\n").encode("utf-8"))
        return path


class AuditStopped(Exception):
    """:meth:`LeakageAuditor.stop` was called: the audit writes nothing more. An Exception (not a
    GradleakError: never logged as a failed row), so that the thread running the audit (Flower's
    ServerApp thread) ends quietly."""


@dataclass(frozen=True)
class FedAvgKeys:
    """Names of the clients' local-training settings in the train ConfigRecord the server sends
    (the ones the clients read); the auditor reads the same entries. Each field is the
    ThreatModel field it sets (fl.threats; torch.optim's meanings)."""

    local_steps: str = "local-steps"
    local_batch_size: str = "batch-size"
    local_lr: str = "lr"
    local_epochs: str = "local-epochs"      # when present, the steps are E x ceil(K / B)
    local_optimizer: str = "optimizer"      # sgd | adam | adamw
    local_momentum: str = "momentum"
    local_nesterov: str = "nesterov"
    local_weight_decay: str = "weight-decay"
    local_betas: str = "betas"              # two numbers
    local_eps: str = "eps"
    local_augment: str = "augment"          # none | flip | crop-flip
    local_crop_padding: str = "crop-padding"


def _flag(value: Any) -> bool:
    """A train config's true/false entry (a ConfigRecord holds bools, or 0/1 from some clients)."""
    if isinstance(value, bool) or value in (0, 1):
        return bool(value)
    raise ValueError(f"nesterov {value!r} is not true or false")


# A failed update's error in audit.csv: one line of at most this many characters (audit.csv is
# rewritten after every update; audit.json keeps the error whole).
CSV_ERROR_CHARS = 1000


def _error_cell(error: Any) -> str:
    return one_line(str(error), CSV_ERROR_CHARS) if error else ""


def _csv(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if not math.isfinite(v) else repr(v)
    return str(v)
