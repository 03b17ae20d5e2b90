"""The one optimisation loop every image attack shares.

It minimises ``objective()`` over ``variables`` with L-BFGS, Adam or SGD, an optional learning-rate
schedule (cosine with warm-up, or Inverting Gradients' step decay), signed gradients, Langevin
noise (GradInversion Sec. 3.5) and a hook after each step (box constraints, group consensus).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..errors import ConfigError

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


def optimise(variables: Sequence[torch.Tensor], objective: Objective, settings: LoopSettings, *,
             generator: torch.Generator | None = None,
             after_step: Callable[[int], None] | None = None,
             noise_targets: Sequence[torch.Tensor] | None = None,
             noise: Callable[[torch.Tensor], torch.Tensor] | None = None,
             on_log: Callable[[int], None] | None = None, log_every: int = 0,
             should_stop: Callable[[list[dict[str, float]]], bool] | None = None) -> LoopResult:
    """Minimise ``objective()`` w.r.t. ``variables`` (leaf tensors with requires_grad).

    ``after_step(t)`` runs after step t under no_grad. ``noise_targets`` get Langevin noise
    (default: all variables); ``noise(v)`` draws eta ~ N(0, I) shaped like v (default: one
    ``torch.randn`` from ``generator``; GradInversion passes one generator per seed so that G
    seeds optimised together see the same noise as G separate runs). ``on_log(t)`` is called
    every ``log_every`` steps and after the last one (used to observe candidates, never to feed
    anything back). ``should_stop(history)`` ends the run early (e.g. a stalled trial that a
    restart should replace).
    """
    if settings.iterations < 0:
        raise ConfigError("iterations must be >= 0")
    if settings.optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer: unknown {settings.optimizer!r}; known: {', '.join(OPTIMIZERS)}")
    if settings.lr <= 0 or not math.isfinite(settings.lr):
        raise ConfigError(f"lr must be a positive number, got {settings.lr}")
    variables = list(variables)
    if settings.optimizer == "lbfgs":
        opt: torch.optim.Optimizer = torch.optim.LBFGS(
            variables, lr=settings.lr, max_iter=settings.lbfgs_max_iter,
            history_size=settings.lbfgs_history, line_search_fn=settings.lbfgs_line_search,
            tolerance_grad=settings.lbfgs_tolerance_grad, tolerance_change=settings.lbfgs_tolerance_change)
    elif settings.optimizer == "adam":
        opt = torch.optim.Adam(variables, lr=settings.lr)
    else:
        opt = torch.optim.SGD(variables, lr=settings.lr, momentum=0.9)
    noisy = list(noise_targets) if noise_targets is not None else variables

    def closure() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = objective()
        grads = torch.autograd.grad(loss, variables)
        for v, g in zip(variables, grads):
            v.grad = g.sign() if settings.signed else g
        return loss.detach()

    result = LoopResult()
    start = time.perf_counter()
    with _progress(settings) as bar:
        task = bar.add_task(settings.description, total=settings.iterations, loss=float("nan"))
        for t in range(settings.iterations):
            lr_t = learning_rate(settings, t)
            for group in opt.param_groups:
                group["lr"] = lr_t
            loss = opt.step(closure)
            value = float(loss)
            if settings.langevin > 0:
                with torch.no_grad():
                    for v in noisy:
                        if noise is not None:
                            eta = noise(v)
                        else:
                            eta = torch.randn(v.shape, generator=generator, dtype=v.dtype, device="cpu").to(v.device)
                        v.add_(eta, alpha=lr_t * settings.langevin)
            if after_step is not None:
                with torch.no_grad():
                    after_step(t)
            result.history.append({"iteration": t + 1, "loss": value})
            result.final_loss = value
            result.iterations = t + 1
            bar.update(task, advance=1, loss=value)
            if on_log is not None and log_every > 0 and ((t + 1) % log_every == 0 or t + 1 == settings.iterations):
                with torch.no_grad():
                    on_log(t + 1)
            if not math.isfinite(value):
                break  # diverged: keep what we have; the caller reports it
            if should_stop is not None and should_stop(result.history):
                break
    result.wall_seconds = time.perf_counter() - start
    return result
