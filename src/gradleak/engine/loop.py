"""The one optimisation loop every attack shares."""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import torch

from ..runtime import tune_allocator
from .guard import SNAPSHOT_EVERY, all_finite, recover
from .loop_state import LoopState
from .optimizers import make_optimizer
from .progress import log_due, progress_bar
from .session import Session
from .state import Snapshot
from .settings import LoopHooks, LoopResult, LoopSettings, Objective, check_settings, learning_rate


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


def _step(opt: torch.optim.Optimizer, closure: Objective, settings: LoopSettings, hooks: LoopHooks,
          noisy: list[torch.Tensor], generator: torch.Generator | None, lr_t: float, t: int) -> float:
    """Step t at learning rate lr_t, then its Langevin noise and the attack's after_step: the loss."""
    for group in opt.param_groups:
        group["lr"] = lr_t
    loss = opt.step(closure)
    value = float(loss)
    if settings.langevin > 0:
        _langevin(noisy, hooks.noise, generator, lr_t, settings.langevin)
    if hooks.after_step is not None:
        with torch.no_grad():
            hooks.after_step(t)
    return value


def _record(result: LoopResult, bar: Any, task: Any, settings: LoopSettings, hooks: LoopHooks, t: int,
            value: float) -> None:
    """Step t's finite loss goes to the progress bar and the history; the attack's on_log runs
    when a log is due."""
    bar.update(task, completed=t + 1, loss=value)
    result.history.append({"iteration": t + 1, "loss": value})
    result.final_loss = value
    result.iterations = t + 1
    if hooks.on_log is not None and log_due(t + 1, hooks.log_every or 0, settings.iterations):
        with torch.no_grad():
            hooks.on_log(t + 1)


def _snapshot_due(run: LoopState, session: Session, good: Snapshot, t: int, every: int, start: float) -> Snapshot:
    """After t steps: a new good snapshot every SNAPSHOT_EVERY steps and at each checkpoint
    (every ``every`` steps but the last, then saved); else ``good`` as it was."""
    checkpoint = every > 0 and t % every == 0 and t < run.settings.iterations
    if checkpoint or t % SNAPSHOT_EVERY == 0:
        run.result.wall_seconds = time.perf_counter() - start
        good = run.snapshot()
        if checkpoint:
            session.save(good)
    return good


def optimise(variables: Sequence[torch.Tensor], objective: Objective, settings: LoopSettings,
             hooks: LoopHooks | None = None, *, generator: torch.Generator | None = None, phase: str = "main",
             session: Session | None = None) -> LoopResult:
    """Minimise ``objective()`` w.r.t. ``variables`` (leaf tensors with requires_grad), calling the
    attack's ``hooks`` (settings.LoopHooks) on the way; ``generator`` draws the Langevin noise.

    Resumable state (session.py, loop_state.py): ``hooks.state`` is the attack's own part of a
    snapshot; ``phase`` names this call when an attack calls ``optimise`` several times (unique
    per run). ``session`` (the engine's, core.py; None: a private in-memory one, so divergence
    recovery still works and nothing is written): the loop saves a checkpoint every
    ``session.every`` steps, and after the step in progress when SIGINT/SIGTERM arrives (then
    raises Interrupted; also when it came during the last step); a pending state of this phase is
    restored before the first step.

    Divergence (guard.py): a non-finite loss or variable after a step is caught at once; the loop
    goes back to its last good snapshot and continues with a smaller learning rate, a bounded
    number of times; then it stops at the last good state with ``result.diverged`` (and
    ``session.diverged``) set.
    """
    check_settings(settings)
    hooks = hooks if hooks is not None else LoopHooks()
    variables = list(variables)
    tune_allocator()  # once per process: the step's large temporaries reuse heap pages (runtime.py)
    opt = make_optimizer(variables, settings)
    noisy = list(hooks.noise_targets) if hooks.noise_targets is not None else variables
    session = session if session is not None else Session()
    run = LoopState(variables, opt, settings, generator, hooks.state, session, phase)
    result = run.result
    closure = _closure(opt, objective, variables, settings.signed)
    run.resume_pending()
    good = run.snapshot()
    every = max(0, int(session.every))
    start = time.perf_counter() - result.wall_seconds
    with session.stepping_block(), progress_bar(settings) as bar:
        task = bar.add_task(settings.description, total=settings.iterations, completed=result.iterations,
                            loss=result.final_loss)
        t = result.iterations
        while t < settings.iterations:
            if session.interrupted is not None:
                run.interrupt(t, start)
            value = _step(opt, closure, settings, hooks, noisy, generator, learning_rate(settings, t) * run.lr_scale, t)
            if not (math.isfinite(value) and all_finite(variables)):
                recovered = recover(run, good, t, value)
                if recovered is None:
                    break
                good = recovered
                t = result.iterations
                bar.update(task, completed=t)
                continue
            _record(result, bar, task, settings, hooks, t, value)
            t += 1
            if hooks.should_stop is not None and hooks.should_stop(result.history):
                break
            good = _snapshot_due(run, session, good, t, every, start)
    if session.interrupted is not None:
        # the signal came during the last step (or the one that stopped the loop): the state is
        # saved there, and a resumed run goes on from it
        run.interrupt(result.iterations, start)
    result.wall_seconds = time.perf_counter() - start
    return result


__all__ = ["optimise"]
