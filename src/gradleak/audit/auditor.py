"""The leakage auditor: what a curious server could reconstruct from each client's update.

Framework-agnostic core (the Flower wrapper in :mod:`gradleak.audit.flower` feeds it): for one
client in one round it takes the global weights the server sent, the weights the client sent
back and the public FedAvg hyper-parameters (local steps, local mini-batch size, learning
rate, number of examples), builds the :class:`~gradleak.fl.SharedUpdate` a gradleak attacker
receives (the weight difference W_S - W_0, ``meta.threat`` = the fedavg record), runs the chosen
attack, and logs one row per client per round to ``DIR/audit.csv``.

Ground truth is optional and kept apart: ``truth_fn(round, client) -> Batch | None`` is called
only after the attack returned, to score it (PSNR, SSIM, label accuracy). A real federation has
no ground truth; its rows carry the attack's own gradient distance and the reconstructions.
"""

from __future__ import annotations

import csv
import io
import json
import math
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

TruthFn = Callable[[int, str], "Batch | None"]

CSV_COLUMNS = ("round", "client", "node_id", "attack", "status", "verdict", "num_examples", "local_steps",
               "local_batch_size", "local_lr", "defenses", "psnr_mean", "ssim_mean", "mse_mean", "label_accuracy",
               "gradient_distance", "converged", "relative_gradient_distance", "noise_floor", "unmodelled_defenses",
               "labels_restored", "labels_true", "iterations", "attack_seconds", "update_norm", "reconstruction",
               "error")
# Saved pictures of batches up to this size put each image beside its reconstruction (one row
# per image); larger batches get the client's batch above the reconstructions.
PAIRS_UP_TO = 4
# Fields of the attack config the auditor takes (everything else describes a simulated client).
ATTACK_FIELDS = ("attack", *FLAT_FIELDS, "fallback", "seed", "device", "log_every")


@dataclass
class AuditSettings:
    """What the auditor runs and where it writes.

    attack:            gradleak AttackConfig fields of the attack (``attack``, ``iterations``,
                       ``lr``, ``seeds``, ...), validated exactly as ``gradleak attack`` does.
    out:               folder for audit.csv (and reconstructions/ with ``save_reconstructions``).
    local_steps, local_batch_size, local_lr: the public FedAvg hyper-parameters, used when the
                       round's train config does not carry them (see ``FedAvgKeys``).
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
    max_batch_size: int = 64
    every: int = 1
    save_reconstructions: bool = False
    defenses: tuple[str, ...] = ()

    def attack_config(self) -> AttackConfig:
        unknown = sorted(set(self.attack) - set(ATTACK_FIELDS))
        if unknown:
            raise ConfigError(f"audit attack settings: {unknown[0]!r} is not an attack setting "
                              f"(allowed: {', '.join(ATTACK_FIELDS)})")
        return make_config(**self.attack, progress=False, paper_metrics=False)


class LeakageAuditor:
    """Attack individual client updates and log leakage; thread-safe; see the module docstring."""

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
        ThreatModel(name="fedavg", local_steps=settings.local_steps, local_batch_size=settings.local_batch_size,
                    local_lr=settings.local_lr)    # validates the defaults
        self.out = Path(settings.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stopped: int | None = None      # stop(): the signal number it was given
        self._sessions: dict[int, Any] = {}   # the attacks running now: id -> their Session
        self.param_names = [n for n, p in model.module.named_parameters() if p.requires_grad]
        self.write_csv()

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

    def threat(self, train_config: Mapping[str, Any] | None, keys: "FedAvgKeys") -> ThreatModel:
        """The round's public FedAvg hyper-parameters: from the train config sent to the clients
        where it carries them, else the settings' defaults."""
        cfg = dict(train_config or {})
        s = self.settings
        steps = cfg.get(keys.local_steps, s.local_steps)
        b = cfg.get(keys.local_batch_size, s.local_batch_size)
        lr = cfg.get(keys.local_lr, s.local_lr)
        try:
            return ThreatModel(name="fedavg", local_steps=int(steps), local_batch_size=None if b in (None, 0) else int(b),
                               local_lr=float(lr))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"audit: FedAvg hyper-parameters in the train config are invalid: {exc}") from None

    def should_audit(self, server_round: int) -> bool:
        return (server_round - 1) % self.settings.every == 0

    # ------------------------------------------------------------------ stopping
    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop auditing (the federation is ending: Ctrl-C, SIGTERM, an error): every attack in
        progress ends after the step it is in, and :meth:`audit` then raises
        :class:`AuditStopped` (in whichever thread it runs); no row, file or picture is written
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
        """Attack one client's update of one round; append and return its row. Never raises for a
        failed attack (the row says why): an audit must not stop the federation."""
        from ..attacks.state import Session
        from ..metrics import evaluate
        from ..pipeline.image import ImageCase
        from ..pipeline.run import attack_case

        self._check_running()
        row: dict[str, Any] = {"round": server_round, "client": client, "node_id": node_id, "attack": self.cfg.attack,
                               "num_examples": num_examples, "local_steps": threat.local_steps,
                               "local_batch_size": threat.local_batch_size or num_examples,
                               "local_lr": threat.local_lr, "defenses": ";".join(self.settings.defenses)}
        if num_examples > self.settings.max_batch_size:
            row.update(status="skipped", error=f"{num_examples} examples > max_batch_size {self.settings.max_batch_size}")
            return self._add(row)
        try:
            update = self.shared_update(global_weights, client_weights, num_examples=num_examples, threat=threat,
                                        loss=loss)
            row["update_norm"] = math.sqrt(sum(float(d.double().pow(2).sum()) for d in update.gradients.values()))
            # the one pipeline, as the server sees it: the update and the model, no truth
            case = ImageCase(update=update, model=self.model, truth=None)
            t0 = time.perf_counter()
            # the in-memory session attack_case would make, kept so that stop() can end the attack
            session = Session(every=0, retries=self.cfg.divergence_retries)
            with self._lock:
                self._check_running()
                self._sessions[id(session)] = session
            try:
                result, _ = attack_case(self.cfg, case, session=session, device=self.device)
            finally:
                with self._lock:
                    self._sessions.pop(id(session), None)
            self._check_running()
            recon = result.reconstruction
            conv = result.metrics["convergence"]
            row.update(status="ok", attack=result.metrics.get("attack", self.cfg.attack),  # auto: the one it used
                       attack_seconds=round(time.perf_counter() - t0, 3), iterations=recon.iterations,
                       gradient_distance=result.metrics.get("gradient_distance"),
                       converged=result.metrics.get("converged"),
                       relative_gradient_distance=conv["relative_gradient_distance"],
                       noise_floor=conv.get("noise_floor", 0.0),
                       unmodelled_defenses=";".join(str(d) for d in conv.get("unmodelled_defenses") or ()),
                       labels_restored=" ".join(str(int(y)) for y in recon.labels))
            truth = self.truth_fn(server_round, client) if self.truth_fn is not None else None
            scores = None
            if truth is not None:   # scoring only, after the attack returned
                m = replace(case, truth=truth).metrics(self.cfg, recon, self.device)
                row.update(psnr_mean=m["psnr_mean"], ssim_mean=m["ssim_mean"], mse_mean=m["mse_mean"],
                           label_accuracy=m["label_accuracy"], labels_true=" ".join(str(int(y)) for y in truth.labels))
                scores = evaluate(recon, truth)
            if self.settings.save_reconstructions:
                self._check_running()
                row["reconstruction"] = self._save(server_round, client, recon, scores, truth)
        except AuditStopped:
            raise
        except KeyboardInterrupt:
            if self._stopped is not None:   # the attack's loop, ended by stop()
                raise AuditStopped("the audit was stopped") from None
            raise
        except GradleakError as exc:
            row.update(status="failed", error=f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - numerical trouble, a model that does not fit: logged
            row.update(status="failed", error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return self._add(row)

    def _save(self, server_round: int, client: str, recon: Any, scores: Any, truth: Batch | None) -> str:
        """DIR/reconstructions/round-RRR/client-C.png (the client's batch above the reconstruction
        paired with it, each image's PSNR and labels; without truth the reconstruction alone)
        and .safetensors (the reconstructed images and labels); returns the PNG's path in DIR."""
        from safetensors.torch import save_file

        from ..report import save_image_grid

        folder = self.out / "reconstructions" / f"round-{server_round:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        stem = "client-" + "".join(c if c.isalnum() or c in "-_" else "_" for c in str(client))
        save_file({"images": recon.images.contiguous(), "labels": recon.labels.contiguous()},
                  str(folder / f"{stem}.safetensors"))
        if truth is not None and scores is not None and len(scores.per_image) <= PAIRS_UP_TO:
            # each image beside its reconstruction, one row per image
            rows = [torch.stack([truth.images[i], scores.paired_images[i]]) for i in range(len(scores.per_image))]
            caps = [[f"original, label {s.label_true}", f"{s.psnr:.1f} dB, label {s.label_restored}"]
                    for s in scores.per_image]
            titles = [""] * len(rows)     # the captions say which is which
            save_image_grid(folder / f"{stem}.png", rows, titles, caps)
        elif truth is not None and scores is not None:
            caps_t = [f"label {s.label_true}" for s in scores.per_image]
            caps_r = [f"{s.psnr:.1f} dB / label {s.label_restored}" for s in scores.per_image]
            save_image_grid(folder / f"{stem}.png", [truth.images, scores.paired_images],
                            ["client's batch", "reconstruction"], [caps_t, caps_r])
        else:
            save_image_grid(folder / f"{stem}.png", [recon.images], ["reconstruction"],
                            [[f"label {int(y)}" for y in recon.labels]])
        return str((folder / f"{stem}.png").relative_to(self.out))

    # ------------------------------------------------------------------ the log
    def log_failure(self, server_round: int, client: str, error: str, node_id: int | str = "") -> dict[str, Any]:
        """A row for an update that could not be attacked (malformed reply, bad config)."""
        return self._add({"round": server_round, "client": client, "node_id": node_id, "attack": self.cfg.attack,
                          "status": "failed", "error": error})

    def _add(self, row: dict[str, Any]) -> dict[str, Any]:
        from ..report.risk import judge

        # the dashboard's verdict (gradleak.report.risk.judge, i.e. gradleak.outcome.judge): leaked /
        # defended / inconclusive / failed / skipped. The audit runs no positive control, so an
        # update it does not see leak is inconclusive, never defended
        row["verdict"] = judge(row.get("status", "failed"), row.get("psnr_mean"), row.get("converged"),
                               attack=row.get("attack"), noise_floor=row.get("noise_floor", 0.0),
                               unmodelled=[d for d in str(row.get("unmodelled_defenses") or "").split(";") if d],
                               defenses=_defense_list(row.get("defenses"))).label
        with self._lock:
            self._check_running()
            self.rows.append(row)
            self.write_csv()
        return row

    def write_csv(self) -> Path:
        """Rewrite DIR/audit.csv atomically: one row per audited client per round."""
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(CSV_COLUMNS), extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for row in self.rows:
            w.writerow({k: _csv(row.get(k)) for k in CSV_COLUMNS} | {"error": _error_cell(row.get("error"))})
        path = self.out / "audit.csv"
        atomic_write_bytes(path, buf.getvalue().encode("utf-8"))
        return path

    def write_summary(self, extra: Mapping[str, Any] | None = None, *, out: str | Path | None = None) -> Path:
        """DIR/audit.json: the settings, the attack config and every row. ``out``: the folder
        the settings name as the audit's (default: the one it writes to; a caller that renames
        a staging folder into place names the final one)."""
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in self.settings.__dict__.items()}
        if out is not None:
            settings["out"] = str(out)
        doc = {"attack_config": self.cfg.model_dump(mode="json"), "model": self.model.name,
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
    """Names of the FedAvg hyper-parameters in the train ConfigRecord the server sends (the
    ones the clients read); the auditor reads the same entries."""

    local_steps: str = "local-steps"
    local_batch_size: str = "batch-size"
    local_lr: str = "lr"


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


def _defense_list(value: object) -> list[str]:
    """A row's defenses, a list or audit.csv's ';'-joined text."""
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [d for d in str(value or "").split(";") if d]
