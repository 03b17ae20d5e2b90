"""The guard: before an update leaves the client, the worst-case attacks run on it with the
client's own data as truth, judged by gradleak.outcome as on every surface, and the policy says
what is sent (:func:`guard_update`). Worst case first: the malicious-server checks on the received
model (fl.inspect), then ``auto`` (the closed forms that apply, then its optimisation portfolio at
the guard's budget). Each check writes a standard run folder (pipeline.record.write_run)."""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import torch

from ..data import SOURCE_NAMES, Batch
from ..errors import ConfigError, GradleakError
from ..fl import SharedUpdate
from ..models import ModelSpec
from ..outcome import DEFENDED, FAILED, LEAKED, PRESUMED_LEAKED, evidence_from_metrics, judge, needs_control
from ..paths import one_line
from .policy import NOISE, REFUSE, REPORT, SEND, GuardPolicy

PASSED, REMEDIED, WITHHELD, REFUSED = "passed", "remedied", "withheld", "refused model"
DECISIONS = (PASSED, REMEDIED, WITHHELD, REFUSED)
#: The verdicts the guard acts on: a rebuilt or recognisable input (with the client's truth the
#: judge never only presumes, but a caller's record may).
LEAKS = (LEAKED, PRESUMED_LEAKED)


class GuardBudgetSpent(GradleakError):
    """The guard's time budget ran out before a check finished (a failed check: policy.on_error)."""


@dataclass
class Check:
    """One attacked version of the update: the original ("before") or a noised one."""

    stage: str
    verdict: str
    reason: str = ""
    attack: str = ""
    psnr: float | None = None
    seconds: float = 0.0
    run: str = ""
    noise_multiplier: float | None = None
    noise_sigma: float | None = None
    error: str = ""


@dataclass
class GuardRecord:
    """What the guard decided for one update, and why (one row of guard.csv)."""

    name: str
    decision: str = PASSED
    verdict_before: str = ""
    verdict_after: str = ""
    attack: str = ""
    noise_multiplier: float | None = None
    noise_sigma: float | None = None
    clip: float | None = None
    seconds: float = 0.0
    reason: str = ""
    checks: list[Check] = field(default_factory=list)
    inspection: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GuardResult:
    """The update to send (None: send nothing) and the record of why."""

    update: SharedUpdate | None
    record: GuardRecord


# ------------------------------------------------------------------ the received model
def screen_model(state: Mapping[str, torch.Tensor], arch: str, *, num_classes: int, channels: int,
                 image_size: int | None = None, width: int | None = None) -> tuple[bool, str, dict[str, Any] | None]:
    """The malicious-server checks (fl.inspect) on a received model's ``state`` against the
    client's own architecture ``arch``: (suspicious, why, the inspection's record). A model that
    does not even hold ``arch``'s tensors is suspicious too (it is not the model the client runs)."""
    from ..fl.inspect import inspect_model

    try:
        found = inspect_model(state, arch, num_classes=num_classes, channels=channels, image_size=image_size,
                              width=width)
    except GradleakError as exc:
        return True, one_line(f"the received model is not model {arch}: {exc}", 300), None
    if not found.suspicious:
        return False, "", found.to_dict()
    why = "; ".join(f"{layer}: {f.check}: {f.reason}" for layer, f in found.findings[:3])
    return True, one_line(f"fl.inspect flags the received model ({why})", 400), found.to_dict()


# ------------------------------------------------------------------ the guard
def guard_update(model: ModelSpec, update: SharedUpdate, batch: Batch, policy: GuardPolicy, *,
                 out: str | Path | None = None, name: str = "update", arch: str | None = None,
                 data_root: str | Path | None = None) -> GuardResult:
    """Check ``update`` (a FedSGD gradient or a FedAvg weight difference W_S - W_0, its meta
    describing the client as fl.threats records it) computed by ``model`` from ``batch`` (the
    client's images [K, C, H, W] in [0, 1] and labels [K]: the truth), and apply ``policy``.

    ``arch``: the client's own architecture; given, the received model (``update.global_weights``)
    is screened first (:func:`screen_model`) and, suspicious, refused under ``on_suspicious``
    refuse (the update is then not sent). ``out``: run folders ``out/NAME-before``,
    ``out/NAME-noise-1``, ... Never raises for a failed check: the record says why and the
    policy's ``on_error`` decides. ``data_root``: the folder of the batch's named source
    (open_source's ``root``), whose other images are the recognisability evidence's IIP pool and
    source prior, as the server-side audit scores them. Bad arguments (not a GuardPolicy) are a
    ConfigError."""
    if not isinstance(policy, GuardPolicy):
        raise ConfigError(f"guard: policy must be a gradleak.guard.GuardPolicy (got {type(policy).__name__})")
    t0 = time.monotonic()
    record = GuardRecord(name=name)
    guard = _Guard(model, update, batch, policy, Path(out) if out is not None else None, name, t0, data_root)
    if arch is not None:
        suspicious, why, found = screen_model(update.global_weights, arch, num_classes=model.num_classes,
                                              channels=model.input_shape[0], image_size=model.input_shape[1])
        record.inspection = found
        if suspicious and policy.on_suspicious == REFUSE:
            return guard.finish(None, replace(record, decision=REFUSED, reason=why))
    before = guard.check("before", update)
    record.checks.append(before)
    record.verdict_before, record.attack = before.verdict, before.attack
    if before.verdict == FAILED:
        return guard.failed(record, before)
    if before.verdict not in LEAKS or policy.action == REPORT:
        record.reason = before.reason
        return guard.finish(update, record)
    if policy.action != NOISE:
        record.decision, record.reason = WITHHELD, f"the update leaks ({before.reason})"
        return guard.finish(None, record)
    return guard.remedy(record)


class _Guard:
    """One update's checks (the state :func:`guard_update` shares between them)."""

    def __init__(self, model: ModelSpec, update: SharedUpdate, batch: Batch, policy: GuardPolicy, out: Path | None,
                 name: str, t0: float, data_root: str | Path | None = None):
        from ..config import make_config

        self.model, self.update, self.batch, self.policy, self.out, self.name, self.t0 = \
            model, update, batch, policy, out, name, t0
        # Scored as the audit scores it (audit.auditor.LeakageAuditor.scoring_config): the batch's
        # named source is the IIP pool's and the source prior's; no named source, no source pool
        source = str(batch.source or "").strip().lower()
        self.source = source if source in SOURCE_NAMES else None
        where = {"data": source, "data_root": None if data_root is None else str(data_root)} if self.source else {}
        self.cfg = make_config(**policy.attack_flags(), **where, progress=False, paper_metrics=False,
                               checkpoint_every=0)
        from ..runtime import resolve_device

        self.device = resolve_device(policy.device)
        self.base_case: Any = None
        self.controls: dict[str, str] = {}   # attack -> its verdict on the update as it is (the positive control)

    # -- time
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def remaining(self) -> float:
        return self.policy.budget_seconds - self.elapsed()

    def say(self, what: str) -> None:
        if self.policy.progress:
            print(f"guard {self.name}: {what} ({self.elapsed():.1f} s of {self.policy.budget_seconds:g} s)",
                  file=sys.stderr, flush=True)

    # -- one check
    def case(self, update: SharedUpdate) -> Any:
        from ..pipeline.image import ImageCase

        base = self.base_case
        case = ImageCase(update=update, model=self.model, truth=self.batch, data=self.batch.source or "client batch",
                         iip_images=base.iip_images if base is not None else None,
                         iip_loaded=base.iip_loaded if base is not None else False)
        if base is None:
            if self.source is not None:
                case.load_iip_pool(self.cfg)
            else:
                from ..metrics.recognisable import candidate_pool

                case.iip_images, case.iip_loaded = candidate_pool(None, self.batch.images), True
            self.base_case = case
        return case

    def attack(self, cfg: Any, case: Any) -> tuple[Any, Any]:
        """attack_case within what is left of the budget: past it the attack stops after the
        step it is in (its session is interrupted) and GuardBudgetSpent is raised."""
        from ..engine import Interrupted, Session
        from ..pipeline.run import attack_case

        left = self.remaining()
        if left <= 0:
            raise GuardBudgetSpent(f"the guard's budget of {self.policy.budget_seconds:g} s is spent")
        session = Session(every=0, retries=cfg.divergence_retries)
        timer = threading.Timer(left, lambda: setattr(session, "interrupted", int(signal.SIGTERM)))
        timer.daemon = True
        timer.start()
        try:
            return attack_case(cfg, case, session=session, device=self.device)
        except Interrupted:
            raise GuardBudgetSpent(f"the guard's budget of {self.policy.budget_seconds:g} s ran out during "
                                   f"{cfg.attack}") from None
        finally:
            timer.cancel()

    def check(self, stage: str, update: SharedUpdate, *, z: float | None = None, sigma: float | None = None) -> Check:
        """Attack ``update`` with the client's truth, judge it (with the positive control where
        only that is missing for "defended"), write its run folder. Never raises a GradleakError
        or a numerical error: a failed check is a Check with verdict "failed"."""
        t = time.monotonic()
        self.say(f"{stage}: {self.cfg.attack}" + (f" on the update noised at z = {z:g}" if z is not None else ""))
        try:
            case = self.case(update)
            result, attack = self.attack(self.cfg, case)
            metrics = result.metrics
            if stage == "before":
                self.controls.update(_verdicts(metrics))
            elif needs_control(evidence_from_metrics(metrics)):
                self.add_control(metrics)
            run = self.write(stage, case, attack, result, metrics)
        except (GradleakError, RuntimeError, ValueError) as exc:
            return Check(stage, FAILED, reason=one_line(f"{type(exc).__name__}: {exc}", 400),
                         seconds=round(time.monotonic() - t, 3), noise_multiplier=z, noise_sigma=sigma,
                         error=type(exc).__name__)
        return Check(stage, str(metrics["verdict"]), reason=str(metrics.get("verdict_reason") or ""),
                     attack=_deciding(metrics), psnr=_finite(metrics.get("psnr_mean")),
                     seconds=round(time.monotonic() - t, 3), run=run, noise_multiplier=z, noise_sigma=sigma)

    def add_control(self, metrics: dict[str, Any]) -> None:
        """The positive control (outcome.py: "defended" needs the same attack to leak without the
        defense): the update as it is, which the guard attacked first; an attack the first check
        did not run is run on it now. Recorded as pipeline.run.with_control records it."""
        name = str(metrics.get("attack") or self.cfg.attack)
        if name not in self.controls:
            self.say(f"control: {name} on the update as it is")
            result, _ = self.attack(self.cfg.model_copy(update={"attack": name}), self.case(self.update))
            self.controls[name] = str(result.metrics["verdict"])
        metrics["control"] = {"verdict": self.controls[name], "attack": name,
                              "verdict_reason": "the guard's check of the update before the noise"}
        metrics.update(judge(evidence_from_metrics(metrics)).to_dict())

    def write(self, stage: str, case: Any, attack: Any, result: Any, metrics: dict[str, Any]) -> str:
        """The check's run folder (out/NAME-STAGE, as `gradleak attack` writes one); "" without out."""
        if self.out is None:
            return ""
        from ..pipeline.image import update_file_values
        from ..pipeline.record import write_run
        from ..pipeline.run import recorded_config

        folder = self.out / f"{self.name}-{stage}"
        n = 1
        while os.path.lexists(folder):
            n += 1
            folder = self.out / f"{self.name}-{stage}-{n}"
        self.out.mkdir(parents=True, exist_ok=True)
        metrics["guard"] = {"name": self.name, "stage": stage, "policy": self.policy.to_dict()}
        config = recorded_config(self.cfg, case, attack, folder).model_copy(
            update={**update_file_values(self.cfg, case.update.meta), "data": case.data})
        write_run(folder, config, case, result.reconstruction, metrics, result.history,
                  attack=attack)
        return folder.name

    # -- decisions
    def finish(self, update: SharedUpdate | None, record: GuardRecord) -> GuardResult:
        record.seconds = round(self.elapsed(), 3)
        if record.decision == PASSED and update is None:
            record.decision = WITHHELD
        self.say(f"{record.decision} (verdict {record.verdict_before or 'n/a'}"
                 + (f" -> {record.verdict_after}" if record.verdict_after else "") + ")")
        return GuardResult(update, record)

    def failed(self, record: GuardRecord, check: Check) -> GuardResult:
        send = self.policy.on_error == SEND
        record.decision = PASSED if send else WITHHELD
        record.reason = f"the check failed ({check.reason}); on_error {self.policy.on_error}"
        return self.finish(self.update if send else None, record)

    def remedy(self, record: GuardRecord) -> GuardResult:
        """The noise policy: each level of the schedule until the noised update is no leak as the
        server receives it (the noise unannounced) and defended with the noise announced."""
        p = self.policy
        gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") & (2**63 - 1))
        record.clip = p.clip
        for i, z in enumerate(p.schedule, start=1):
            longest = max(c.seconds for c in record.checks)
            if longest > self.remaining():   # a check the budget cannot cover is not started
                return self.failed(record, Check(f"noise-{i}", FAILED, reason=(
                    f"GuardBudgetSpent: {self.remaining():.0f} s of the budget left, less than the longest check "
                    f"so far ({longest:.0f} s)")))
            sent, checked, sigma = noised(self.update, z, p.clip, gen)
            # As the server receives it (the noise not announced): the attacks run as on any update
            # (auto's closed forms do not stop early on the noise floor); a leak there is a leak
            seen = self.check(f"noise-{i}-as-sent", sent.replace(meta=replace(sent.meta, defenses=list(
                self.update.meta.defenses))), z=z, sigma=sigma)
            record.checks.append(seen)
            record.verdict_after, record.noise_multiplier, record.noise_sigma = seen.verdict, z, sigma
            if seen.verdict == FAILED:
                return self.failed(record, seen)
            if seen.verdict in LEAKS:
                continue
            # Announced (the defense's evidence: decoy or truth-start test, positive control)
            check = self.check(f"noise-{i}", checked, z=z, sigma=sigma)
            record.checks.append(check)
            record.verdict_after = check.verdict
            if check.verdict == DEFENDED:
                record.decision, record.attack = REMEDIED, check.attack or record.attack
                record.reason = f"noise z = {z:g} (sigma {sigma:.3g}): {check.reason}"
                return self.finish(sent, record)
            if check.verdict == FAILED:
                return self.failed(record, check)
        record.decision = WITHHELD
        record.reason = (f"no noise level of the schedule (up to z = {p.schedule[-1]:g}) gave a defended update; "
                         f"last verdict {record.verdict_after}: {record.checks[-1].reason}")
        return self.finish(None, record)


def noised(update: SharedUpdate, z: float, clip: float | None,
           generator: torch.Generator) -> tuple[SharedUpdate, SharedUpdate, float]:
    """(sent, checked, sigma): the update clipped to L2 norm ``clip`` (scale a = min(1, clip /
    ||u||); None: a = 1) plus N(0, sigma^2) per entry, sigma = z x min(||u||, clip) / sqrt(entries)
    (Flower's fixed clipping, then Gaussian noise). ``checked`` is the same update seen through the
    public scale a (u + n / a, recorded as gaussian:sigma/a), which is what the check attacks: a
    server that knows the bound knows a, so the check must not credit the scaling."""
    from ..defenses import apply_defenses

    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in update.gradients.values()))
    entries = sum(g.numel() for g in update.gradients.values())
    if norm == 0 or entries == 0:
        raise GradleakError("the update is zero: there is nothing to noise (and nothing leaks)")
    a = min(1.0, clip / norm) if clip is not None else 1.0
    sigma = z * min(norm, clip if clip is not None else norm) / math.sqrt(entries)
    checked = apply_defenses(update, [f"gaussian:{sigma / a!r}"], generator)
    if a == 1.0:
        return checked, checked, sigma
    meta = replace(checked.meta, defenses=[*update.meta.defenses, f"gaussian:{sigma!r}"])
    sent = checked.replace(gradients={k: g * a for k, g in checked.gradients.items()}, meta=meta)
    return sent, checked, sigma


def fedavg_update(model: ModelSpec, global_weights: Mapping[str, Any], client_weights: Mapping[str, Any], *,
                  threat: Any, num_examples: int, loss: float = float("nan")) -> SharedUpdate:
    """The FedAvg update W_S - W_0 of ``model``'s trainable parameters, as the server receives it
    (``threat``: the client's fl.threats.ThreatModel, recorded in the public meta)."""
    from ..fl import UpdateMeta

    names = [n for n, p in model.module.named_parameters() if p.requires_grad]
    missing = [n for n in names if n not in client_weights or n not in global_weights]
    if missing:
        raise GradleakError(f"the weights lack parameter {missing[0]!r} of model {model.name}")
    gw = {k: torch.as_tensor(v).detach().float().cpu().clone() for k, v in global_weights.items()}
    delta = {n: torch.as_tensor(client_weights[n]).detach().float().cpu() - gw[n] for n in names}
    meta = UpdateMeta(model=model.name, num_classes=model.num_classes, input_shape=model.input_shape,
                      mean=model.mean, std=model.std, batch_size=int(num_examples), loss=float(loss),
                      model_kwargs=dict(model.kwargs), threat=threat.record(int(num_examples)))
    return SharedUpdate(gradients=delta, global_weights=gw, meta=meta)


def _verdicts(metrics: Mapping[str, Any]) -> dict[str, str]:
    """Each attack's verdict in one check's metrics: auto's members (scored against the truth)
    and the kept answer's."""
    out = {}
    auto = metrics.get("auto") if isinstance(metrics.get("auto"), Mapping) else {}
    for t in auto.get("tried") or []:
        if isinstance(t, Mapping) and t.get("applies") and isinstance(t.get("verdict"), str):
            out[str(t["attack"])] = t["verdict"]
    kept = str(metrics.get("attack") or "")
    if kept and kept not in out:
        own = judge(evidence_from_metrics({k: v for k, v in metrics.items() if k != "auto"}))
        out[kept] = own.verdict
    return out


def _deciding(metrics: Mapping[str, Any]) -> str:
    """The attack that decided the verdict: the first of auto's that leaked when one did, else the kept one."""
    if metrics.get("verdict") == LEAKED:
        auto = metrics.get("auto") if isinstance(metrics.get("auto"), Mapping) else {}
        kept = str(metrics.get("attack") or "")
        own = _verdicts(metrics).get(kept)
        if own != LEAKED:
            for t in auto.get("tried") or []:
                if isinstance(t, Mapping) and t.get("verdict") == LEAKED:
                    return str(t.get("attack"))
    return str(metrics.get("attack") or "")


def _finite(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


__all__ = ["Check", "DECISIONS", "GuardBudgetSpent", "GuardRecord", "GuardResult", "LEAKS", "PASSED", "REFUSED",
           "REMEDIED", "WITHHELD", "fedavg_update", "guard_update", "noised", "screen_model"]
