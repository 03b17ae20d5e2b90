"""The one optimisation loop every image attack shares.

It minimises ``objective()`` over ``variables`` with L-BFGS, Adam or SGD, an optional learning-rate
schedule (cosine with warm-up, or Inverting Gradients' step decay), signed gradients, Langevin
noise (GradInversion Sec. 3.5) and a hook after each step (box constraints, group consensus).
It also makes every attack resumable and recovers from divergence, once for all attacks: see
``optimise`` and state.py.
"""

from __future__ import annotations

import math
import time
import logging
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..errors import ConfigError
from ..optim import SGD, Adam
from ..runtime import tune_allocator
from .lbfgs import CompactLBFGS
from .state import SNAPSHOT_EVERY, Interrupted, Session, Snapshot, StateFileError, StateHooks, pack, unpack

_log = logging.getLogger("gradleak")

Objective = Callable[[], torch.Tensor]
OPTIMIZERS = ("lbfgs", "adam", "sgd")
SCHEDULES = ("constant", "cosine", "step")


@dataclass
class LoopSettings:
    iterations: int
    lr: float
    optimizer: str = "adam"
    schedule: str = "constant"
    warmup: int = 0
    signed: bool = False          # Inverting Gradients: Adam on sign(grad)
    langevin: float = 0.0         # alpha_n: x += lr(t) * alpha_n * N(0, I) after each step
    lbfgs_max_iter: int = 20      # function evaluations per L-BFGS step (torch's default, DLG's)
    lbfgs_history: int = 100
    lbfgs_line_search: str | None = None
    lbfgs_tolerance_grad: float = 1e-7      # torch's defaults; float64 runs lower them
    lbfgs_tolerance_change: float = 1e-9
    progress: bool = False
    description: str = "attack"


@dataclass
class LoopResult:
    history: list[dict[str, float]] = field(default_factory=list)
    iterations: int = 0
    wall_seconds: float = 0.0
    final_loss: float = float("nan")
    recoveries: list[dict[str, Any]] = field(default_factory=list)   # divergences recovered from
    diverged: dict[str, Any] | None = None   # set when the retries ran out (the variables are the last good state)


def learning_rate(settings: LoopSettings, step: int) -> float:
    """lambda(t) for step t (0-based)."""
    base, total = settings.lr, max(1, settings.iterations)
    if settings.schedule == "constant":
        factor = 1.0
    elif settings.schedule == "cosine":
        # GradInversion: linear warm-up, then cosine decay to 0 over the remaining steps.
        if step < settings.warmup:
            factor = (step + 1) / settings.warmup
        else:
            t = (step - settings.warmup) / max(1, total - settings.warmup)
            factor = 0.5 * (1 + math.cos(math.pi * t))
    elif settings.schedule == "step":
        # Inverting Gradients' MultiStepLR: x0.1 at 3/8, 5/8 and 7/8 of the iterations.
        factor = 0.1 ** sum(step >= m for m in (3 * total // 8, 5 * total // 8, 7 * total // 8))
    else:
        raise ConfigError(f"schedule: unknown {settings.schedule!r}; known: {', '.join(SCHEDULES)}")
    return base * factor


def _progress(settings: LoopSettings):  # noqa: ANN202
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]:.3e}"), TimeElapsedColumn(), TimeRemainingColumn(),
                    transient=False, disable=not settings.progress)


# The optimiser's own state grows with the variables: L-BFGS keeps lbfgs_history pairs (s, y) of
# their size (2 m n values, allocated at its first step), Adam two moments, SGD one momentum. The
# variables' size comes from the update's metadata (K images, K x classes soft labels): a batch of
# 4096 32 px images, which the update file's bounds allow, would make DLG's L-BFGS (m = 100, float64)
# allocate 20 GiB. Above MAX_OPTIMIZER_BYTES the run is refused (ConfigError) before anything is
# allocated; DLG's L-BFGS at float64 then takes up to 2.7 M values (873 images of 32 px).
MAX_OPTIMIZER_BYTES = 4 * 2**30


def optimizer_bytes(values: int, itemsize: int, settings: LoopSettings) -> int:
    """The optimiser state's memory for ``values`` variables of ``itemsize`` bytes."""
    copies = {"lbfgs": 2 * settings.lbfgs_history, "adam": 2, "sgd": 1}.get(settings.optimizer, 2)
    return copies * values * itemsize


def check_optimizer_memory(values: int, itemsize: int, settings: LoopSettings) -> None:
    """ConfigError when the optimiser's state for ``values`` variables is over MAX_OPTIMIZER_BYTES."""
    need = optimizer_bytes(values, itemsize, settings)
    if need > MAX_OPTIMIZER_BYTES:
        extra = (f"{2 * settings.lbfgs_history} x {values} values of L-BFGS history" if settings.optimizer == "lbfgs"
                 else f"the state of {values} values")
        raise ConfigError(f"{settings.description}: the optimiser would need {need / 2**30:.3g} GiB ({extra}), more "
                          f"than the bound of {MAX_OPTIMIZER_BYTES / 2**30:.3g} GiB; attack a smaller batch"
                          + (" or use --optimizer adam" if settings.optimizer == "lbfgs" else ""))


def _make_optimizer(variables: list[torch.Tensor], settings: LoopSettings) -> torch.optim.Optimizer:
    if variables:
        check_optimizer_memory(sum(v.numel() for v in variables), max(v.element_size() for v in variables), settings)
    if settings.optimizer == "lbfgs":
        # torch's L-BFGS algorithm with the compact (matrix) form of its direction (lbfgs.py)
        return CompactLBFGS(
            variables, lr=settings.lr, max_iter=settings.lbfgs_max_iter,
            history_size=settings.lbfgs_history, line_search_fn=settings.lbfgs_line_search,
            tolerance_grad=settings.lbfgs_tolerance_grad, tolerance_change=settings.lbfgs_tolerance_change)
    if settings.optimizer == "adam":  # torch's Adam and SGD without the torch._dynamo import (optim.py)
        return Adam(variables, lr=settings.lr)
    return SGD(variables, lr=settings.lr, momentum=0.9)


def _all_finite(variables: Sequence[torch.Tensor]) -> bool:
    with torch.no_grad():
        return bool(torch.stack([torch.isfinite(v).all() for v in variables]).all())


class _Run:
    """The loop's own state (what a snapshot's "loop" section holds) and snapshot/restore."""

    def __init__(self, variables: list[torch.Tensor], opt: torch.optim.Optimizer, settings: LoopSettings,
                 generator: torch.Generator | None, hooks: StateHooks | None, session: Session, phase: str):
        self.variables, self.opt, self.settings, self.generator = variables, opt, settings, generator
        self.hooks, self.session, self.phase = hooks, session, phase
        self.result = LoopResult()
        self.lr_scale = 1.0
        self.retries_used = 0

    def snapshot(self) -> Snapshot:
        tensors: dict[str, torch.Tensor] = {}
        r = self.result
        with torch.no_grad():
            loop = {
                "variables": list(self.variables),
                "optimizer": self.opt.state_dict()["state"],
                "generator": self.generator.get_state() if self.generator is not None else None,
                "rng": torch.get_rng_state(),
                "history_loss": torch.tensor([h["loss"] for h in r.history], dtype=torch.float64),
                "iterations": r.iterations, "final_loss": r.final_loss, "wall_seconds": r.wall_seconds,
                "lr_scale": self.lr_scale, "retries_used": self.retries_used,
                "recoveries": [dict(e) for e in r.recoveries],
                "optimizer_name": self.settings.optimizer, "total": self.settings.iterations,
            }
            tree = {"loop": pack(loop, tensors, "loop"),
                    "attack": pack(self.hooks.get_state(), tensors, "attack") if self.hooks is not None else None,
                    "providers": {name: pack(h.get_state(), tensors, f"providers/{name}")
                                  for name, h in self.session.providers.items()},
                    "session": pack(self.session.record(), tensors, "session")}
        return Snapshot(phase=self.phase, step=r.iterations, tree=tree, tensors=tensors)

    def restore(self, snap: Snapshot, *, from_disk: bool) -> None:
        """Put ``snap`` back. From disk every part is checked against this run first and any
        mismatch is a StateFileError; in memory (divergence) the session record is kept."""
        tree = snap.tree
        if not isinstance(tree, dict) or not isinstance(tree.get("loop"), dict):
            raise StateFileError("the saved state has no loop section")
        loop = unpack(tree["loop"], snap.tensors, clone=True)
        if from_disk:
            self._check(loop)
        with torch.no_grad():
            for v, saved in zip(self.variables, loop["variables"], strict=True):
                v.copy_(saved.to(v.device))
            state = {int(k): v for k, v in loop["optimizer"].items()}
            self.opt.load_state_dict({"state": state, "param_groups": self.opt.state_dict()["param_groups"]})
            if self.generator is not None:
                self.generator.set_state(loop["generator"])
            torch.set_rng_state(loop["rng"])
        r = self.result
        losses = loop["history_loss"].tolist()
        r.history = [{"iteration": i + 1, "loss": float(v)} for i, v in enumerate(losses)]
        r.iterations, r.final_loss = int(loop["iterations"]), float(loop["final_loss"])
        r.wall_seconds = float(loop["wall_seconds"])
        r.recoveries = list(loop["recoveries"])
        self.lr_scale, self.retries_used = float(loop["lr_scale"]), int(loop["retries_used"])
        attack = unpack(tree.get("attack"), snap.tensors, clone=True)
        if self.hooks is not None:
            if not isinstance(attack, dict):
                raise StateFileError("the saved state lacks the attack's own state")
            with torch.no_grad():
                self.hooks.set_state(attack)
        providers = tree.get("providers") or {}
        if not isinstance(providers, dict):
            raise StateFileError("the saved state's providers section is malformed")
        for name, h in self.session.providers.items():
            if name in providers:
                h.set_state(unpack(providers[name], snap.tensors, clone=True))
        if from_disk:
            self.session.restore_record(unpack(tree.get("session"), snap.tensors, clone=True))

    def _check(self, loop: dict[str, Any]) -> None:
        """Everything a saved loop section must satisfy before any of it is used (the first
        misfit is reported)."""
        need = ("variables", "optimizer", "generator", "rng", "history_loss", "iterations", "final_loss",
                "wall_seconds", "lr_scale", "retries_used", "recoveries", "optimizer_name", "total")
        missing = [k for k in need if k not in loop]
        if missing:
            _unfit(f"missing {', '.join(missing)}")
        if loop["optimizer_name"] != self.settings.optimizer or loop["total"] != self.settings.iterations:
            _unfit(f"saved for {loop['optimizer_name']!r} x {loop['total']} steps, this run is "
                   f"{self.settings.optimizer!r} x {self.settings.iterations}")
        self._check_variables(loop["variables"])
        self._check_optimizer(loop["optimizer"])
        self._check_generators(loop["generator"], loop["rng"])
        self._check_progress(loop)

    def _check_variables(self, saved: Any) -> None:
        if not isinstance(saved, list) or len(saved) != len(self.variables):
            _unfit("wrong number of optimised variables")
        for i, (v, s) in enumerate(zip(self.variables, saved, strict=True)):
            if not isinstance(s, torch.Tensor) or s.shape != v.shape or s.dtype != v.dtype:
                got = f"{list(s.shape)} {s.dtype}" if isinstance(s, torch.Tensor) else type(s).__name__
                _unfit(f"variable {i} is {got}, expected {list(v.shape)} {v.dtype}")

    def _check_optimizer(self, opt_state: Any) -> None:
        """The optimizer's per-parameter state: known parameters, tensors of the shapes its
        algorithm keeps, plain numbers otherwise."""
        numel = sum(v.numel() for v in self.variables)
        if not isinstance(opt_state, dict):
            _unfit("optimizer state is not a mapping")
        for k, st in opt_state.items():
            if not (isinstance(k, (int, str)) and str(k).isdigit() and int(k) < len(self.variables)) \
                    or not isinstance(st, dict):
                _unfit(f"optimizer state for an unknown parameter {k!r}")
            shape = self.variables[int(k)].shape
            for name, value in st.items():
                self._check_optimizer_value(value, f"{k}.{name}", shape, numel)

    def _check_optimizer_value(self, value: Any, where: str, shape: torch.Size, numel: int) -> None:
        if isinstance(value, torch.Tensor):
            m = self.settings.lbfgs_history
            ok = value.ndim == 0 or value.shape == shape or (value.ndim == 1 and value.numel() == numel) \
                or value.shape == (m, numel) \
                or (value.ndim == 2 and value.shape[0] == value.shape[1] <= m)  # L-BFGS history (lbfgs.py)
            if not ok or not (value.is_floating_point() or value.dtype in (torch.int64, torch.int32)):
                _unfit(f"optimizer tensor {where} has shape {list(value.shape)} {value.dtype}")
        elif isinstance(value, (list, tuple)):
            for j, item in enumerate(value):
                self._check_optimizer_value(item, f"{where}[{j}]", shape, numel)
        elif not (value is None or isinstance(value, (int, float))):
            _unfit(f"optimizer value {where} is a {type(value).__name__}")

    def _check_generators(self, generator: Any, rng: Any) -> None:
        gen_size = torch.Generator().get_state().numel()
        for name, g in (("generator", generator), ("rng", rng)):
            if name == "generator" and (g is None) != (self.generator is None):
                _unfit("generator present in one of state and run only")
            if g is not None and (not isinstance(g, torch.Tensor) or g.dtype != torch.uint8 or g.shape != (gen_size,)):
                _unfit(f"{name} state is not a CPU generator state")

    def _check_progress(self, loop: dict[str, Any]) -> None:
        """The steps taken, their losses, and the divergence record."""
        hist = loop["history_loss"]
        if not isinstance(hist, torch.Tensor) or hist.dtype != torch.float64 or hist.ndim != 1:
            _unfit("history is not a float64 vector")
        it = loop["iterations"]
        if not (isinstance(it, int) and 0 <= it <= self.settings.iterations and hist.numel() == it):
            _unfit(f"step {it!r} does not fit {self.settings.iterations} iterations and {hist.numel()} history entries")
        for key in ("final_loss", "wall_seconds", "lr_scale"):
            if not isinstance(loop[key], (int, float)) or isinstance(loop[key], bool):
                _unfit(f"{key} is not a number")
        if not (0 < loop["lr_scale"] <= 1) or not isinstance(loop["retries_used"], int) \
                or not isinstance(loop["recoveries"], list):
            _unfit("divergence record is malformed")

    def interrupt(self, t: int, start: float) -> typing.NoReturn:
        """SIGINT/SIGTERM arrived: save the state after the last finished step (step ``t``) and stop."""
        session = self.session
        self.result.wall_seconds = time.perf_counter() - start
        if session.directory is not None:
            session.save(self.snapshot())
        raise Interrupted(session.interrupted, session.scope + self.phase, t, session.directory, session.resume_hint)

    def recover(self, good: Snapshot, t: int, value: float) -> Snapshot | None:
        """Step ``t`` left a non-finite loss (``value``) or variable: go back to ``good``. While
        retries remain, with the learning rate scaled by the session's backoff, and return the
        snapshot to go on from; else set ``diverged`` and return None."""
        session, phase, result = self.session, self.phase, self.result
        event = {"phase": phase, "iteration": t + 1, "loss": value if math.isfinite(value) else None,
                 "restored_to": good.step}
        used, scale = self.retries_used, self.lr_scale
        self.restore(good, from_disk=False)
        if used < session.retries:
            self.retries_used, self.lr_scale = used + 1, scale * session.backoff
            event["lr_scale"] = self.lr_scale
            result.recoveries.append(event)
            session.recoveries.append(dict(event))
            _log.warning("gradleak: non-finite %s at iteration %d%s; restarting from iteration %d with "
                         "lr x%g (retry %d of %d)", "loss" if event["loss"] is None else "candidates",
                         t + 1, "" if phase == "main" else f" of {phase}", good.step, self.lr_scale,
                         self.retries_used, session.retries)
            return self.snapshot()  # same state, new lr scale and retry count
        self.retries_used, self.lr_scale = used, scale
        event.update(retries=used, message=(
            f"non-finite {'loss' if event['loss'] is None else 'candidates'} at iteration {t + 1}"
            f"{'' if phase == 'main' else ' of ' + phase} after {used} restart(s) with the learning rate "
            f"x{session.backoff:g} each; kept the last good state (iteration {good.step})"))
        result.diverged = event
        session.diverged = dict(event)
        return None

    def resume_pending(self) -> None:
        """Restore the session's pending state of this phase, if any (a StateFileError when it
        does not fit this run)."""
        session = self.session
        pending = session.take_pending(self.phase)
        if pending is None:
            return
        where = f"saved state {session.directory}: " if session.directory is not None else ""
        try:
            self.restore(pending, from_disk=True)
        except StateFileError as exc:
            raise StateFileError(f"{where}{exc}") from None
        except (RuntimeError, ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as exc:
            raise StateFileError(f"{where}it does not fit this run: {exc}") from None
        session.resumed_at.append({"phase": self.phase, "iteration": self.result.iterations})


def _unfit(what: str) -> typing.NoReturn:
    raise StateFileError(f"the saved state does not fit this run: {what}")


def _check_settings(settings: LoopSettings) -> None:
    if settings.iterations < 0:
        raise ConfigError("iterations must be >= 0")
    if settings.optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer: unknown {settings.optimizer!r}; known: {', '.join(OPTIMIZERS)}")
    if settings.lr <= 0 or not math.isfinite(settings.lr):
        raise ConfigError(f"lr must be a positive number, got {settings.lr}")


def _closure(opt: torch.optim.Optimizer, objective: Objective, variables: list[torch.Tensor],
             signed: bool) -> Objective:
    """The optimizer's closure: the objective and its gradient (its sign for signed steps)."""
    def closure() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = objective()
        grads = torch.autograd.grad(loss, variables)
        for v, g in zip(variables, grads, strict=True):
            v.grad = g.sign() if signed else g
        return loss.detach()
    return closure


def _langevin(noisy: list[torch.Tensor], noise: Callable[[torch.Tensor], torch.Tensor] | None,
              generator: torch.Generator | None, lr_t: float, alpha_n: float) -> None:
    """GradInversion Sec. 3.5: v += lr(t) * alpha_n * eta, eta ~ N(0, I), for each noisy variable."""
    with torch.no_grad():
        for v in noisy:
            if noise is not None:
                eta = noise(v)
            else:
                eta = torch.randn(v.shape, generator=generator, dtype=v.dtype, device="cpu").to(v.device)
            v.add_(eta, alpha=lr_t * alpha_n)


def _log_due(done: int, log_every: int, total: int) -> bool:
    """Whether on_log runs after ``done`` steps: every ``log_every`` steps and after the last."""
    return log_every > 0 and (done % log_every == 0 or done == total)


def optimise(variables: Sequence[torch.Tensor], objective: Objective, settings: LoopSettings, *,
             generator: torch.Generator | None = None,
             after_step: Callable[[int], None] | None = None,
             noise_targets: Sequence[torch.Tensor] | None = None,
             noise: Callable[[torch.Tensor], torch.Tensor] | None = None,
             on_log: Callable[[int], None] | None = None, log_every: int = 0,
             should_stop: Callable[[list[dict[str, float]]], bool] | None = None,
             state: StateHooks | None = None, phase: str = "main", session: Session | None = None) -> LoopResult:
    """Minimise ``objective()`` w.r.t. ``variables`` (leaf tensors with requires_grad).

    ``after_step(t)`` runs after step t under no_grad. ``noise_targets`` get Langevin noise
    (default: all variables); ``noise(v)`` draws eta ~ N(0, I) shaped like v (default: one
    ``torch.randn`` from ``generator``; GradInversion passes one generator per seed so that G
    seeds optimised together see the same noise as G separate runs). ``on_log(t)`` is called
    every ``log_every`` steps and after the last one (used to observe candidates, never to feed
    anything back). ``should_stop(history)`` ends the run early (e.g. a stalled trial that a
    restart should replace).

    Resumable state (state.py): ``state`` is the attack's own part of a snapshot (everything the
    remaining steps depend on that is not a variable, the optimizer, ``generator`` or the global
    RNG); ``phase`` names this call when an attack calls ``optimise`` several times (unique per
    run). ``session`` (the engine's, engine.py; None: a private in-memory one, so divergence
    recovery still works and nothing is written): the loop saves a checkpoint every ``session.every`` steps, and
    after the step in progress when SIGINT/SIGTERM arrives (then raises Interrupted); a pending
    state of this phase is restored before the first step.

    Divergence: a non-finite loss or variable after a step is caught at once; the loop goes back
    to its last good snapshot (taken every SNAPSHOT_EVERY steps and at every checkpoint; all
    variables, i.e. every seed of a batched attack together) and continues with the learning
    rate times ``session.backoff``, at most ``session.retries`` times per phase. After that it
    stops at the last good state with ``result.diverged`` (and ``session.diverged``) set.
    """
    _check_settings(settings)
    variables = list(variables)
    tune_allocator()  # once per process: the step's large temporaries reuse heap pages (runtime.py)
    opt = _make_optimizer(variables, settings)
    noisy = list(noise_targets) if noise_targets is not None else variables
    session = session if session is not None else Session()
    run = _Run(variables, opt, settings, generator, state, session, phase)
    result = run.result
    closure = _closure(opt, objective, variables, settings.signed)
    run.resume_pending()
    good = run.snapshot()
    every = max(0, int(session.every))
    start = time.perf_counter() - result.wall_seconds
    with _progress(settings) as bar:
        task = bar.add_task(settings.description, total=settings.iterations, completed=result.iterations,
                            loss=result.final_loss)
        t = result.iterations
        while t < settings.iterations:
            if session.interrupted is not None:
                run.interrupt(t, start)
            lr_t = learning_rate(settings, t) * run.lr_scale
            for group in opt.param_groups:
                group["lr"] = lr_t
            loss = opt.step(closure)
            value = float(loss)
            if settings.langevin > 0:
                _langevin(noisy, noise, generator, lr_t, settings.langevin)
            if after_step is not None:
                with torch.no_grad():
                    after_step(t)
            if not (math.isfinite(value) and _all_finite(variables)):
                recovered = run.recover(good, t, value)
                if recovered is None:
                    break
                good = recovered
                t = result.iterations
                bar.update(task, completed=t)
                continue
            result.history.append({"iteration": t + 1, "loss": value})
            result.final_loss = value
            result.iterations = t + 1
            bar.update(task, completed=t + 1, loss=value)
            if on_log is not None and _log_due(t + 1, log_every, settings.iterations):
                with torch.no_grad():
                    on_log(t + 1)
            t += 1
            if should_stop is not None and should_stop(result.history):
                break
            checkpoint = every > 0 and t % every == 0 and t < settings.iterations
            if checkpoint or t % SNAPSHOT_EVERY == 0:
                result.wall_seconds = time.perf_counter() - start
                good = run.snapshot()
                if checkpoint:
                    session.save(good)
    result.wall_seconds = time.perf_counter() - start
    return result
