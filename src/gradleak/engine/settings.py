"""What one optimisation run is asked to do: its settings, its hooks, its learning-rate schedule
and what it returns."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..errors import ConfigError
from .state import StateHooks

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


@dataclass
class LoopHooks:
    """What an attack plugs into the loop, each optional.

    after_step(t): runs after step t under no_grad (box constraints, group consensus).
    noise_targets: the variables that get Langevin noise (None: all of them); noise(v): draws
    eta ~ N(0, I) shaped like v (None: one ``torch.randn`` from the loop's generator; GradInversion
    passes one generator per seed so that G seeds optimised together see the same noise as G
    separate runs). on_log(t): called every ``log_every`` steps and after the last one (None:
    the engine's log_every), to observe candidates, never to feed anything back.
    should_stop(history): ends the run early (e.g. a stalled trial that a restart should replace).
    state: the attack's own part of a snapshot (an AttackState or StateHooks: everything the
    remaining steps depend on that is not a variable, the optimizer, the generator or the global
    RNG).
    """

    after_step: Callable[[int], None] | None = None
    noise_targets: Sequence[torch.Tensor] | None = None
    noise: Callable[[torch.Tensor], torch.Tensor] | None = None
    on_log: Callable[[int], None] | None = None
    log_every: int | None = None
    should_stop: Callable[[list[dict[str, float]]], bool] | None = None
    state: StateHooks | None = None


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


def check_settings(settings: LoopSettings) -> None:
    if settings.iterations < 0:
        raise ConfigError("iterations must be >= 0")
    if settings.optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer: unknown {settings.optimizer!r}; known: {', '.join(OPTIMIZERS)}")
    if settings.lr <= 0 or not math.isfinite(settings.lr):
        raise ConfigError(f"lr must be a positive number, got {settings.lr}")


__all__ = ["LoopHooks", "LoopResult", "LoopSettings", "OPTIMIZERS", "Objective", "SCHEDULES", "check_settings",
           "learning_rate"]
