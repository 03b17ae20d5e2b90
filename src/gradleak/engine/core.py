"""The engine: the run services an attack is given, passed to it explicitly (never found through
a global). An attack computes an objective and its answer; the engine does the rest."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch

from ..errors import UnknownNameError
from ..fl.update import SharedUpdate
from ..runtime import resolve_device
from .loop import optimise
from .precision import ieee_float32
from .progress import Observer
from .session import Session
from .settings import LoopHooks, LoopResult, LoopSettings, Objective
from .shard import SeedShard
from .state import StateHooks


@dataclass(frozen=True)
class StartBatch:
    """A batch every optimisation start begins from instead of the attack's own init: images
    [K, C, H, W] in [0, 1] pixels, labels [K] (int64). The evaluation's truth-start test
    (pipeline/truth_start.py) gives one; an attack never builds it."""

    images: torch.Tensor
    labels: torch.Tensor


@dataclass
class Engine:
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    session: Session = field(default_factory=Session)
    observer: Observer | None = None
    shard: SeedShard | None = None
    log_every: int = 10
    progress: bool = False
    #: where optimisation attacks start (attacks/base.start_images); None: their own init
    start: StartBatch | None = None

    def __post_init__(self) -> None:
        self.device = resolve_device(self.device)

    # -- what attacks call
    def optimise(self, variables: Sequence[torch.Tensor], objective: Objective, settings: LoopSettings,
                 hooks: LoopHooks | None = None, *, generator: torch.Generator | None = None,
                 phase: str = "main") -> LoopResult:
        """loop.optimise under this engine's session (checkpoints, divergence, signals); the
        attack's ``on_log`` hook runs every ``log_every`` steps of this engine unless it says
        otherwise."""
        hooks = hooks if hooks is not None else LoopHooks()
        if hooks.log_every is None:
            hooks = replace(hooks, log_every=self.log_every)
        return optimise(variables, objective, settings, hooks, generator=generator, phase=phase,
                        session=self.session)

    def resume_phase(self) -> str | None:
        """The phase a resumed run restarts in (attacks with several phases skip to it), or None."""
        return self.session.pending_phase()

    def provide(self, name: str, get_state: Callable[[], dict[str, Any]],
                set_state: Callable[[dict[str, Any]], None]) -> None:
        """A run-level part of every snapshot (e.g. the observer's points)."""
        self.session.provide(name, StateHooks(get_state, set_state))

    # -- what the pipeline calls
    def run(self, config: Any, update: SharedUpdate, model: Any) -> Any:
        """Run the attack ``config`` (a typed attack config) on the update and the model."""
        fn = ATTACK_RUNNERS.get(type(config))
        spec = getattr(type(config), "spec", None)
        if fn is None and spec is not None:
            # spec.module names a file of gradleak's own attack packages (specs.attack_specs), never a
            # name read from a run's input: the config's class was derived from that spec
            fn = importlib.import_module(spec.module).run
        if fn is None:
            raise UnknownNameError(f"no attack is registered for {type(config).__name__}")
        with ieee_float32(self.device):
            recon = fn(config, update, model, self)
        if spec is not None and spec.optimisation:
            no_step_evidence(recon)
        return recon


NO_STEP = "took no step"


def no_step_evidence(recon: Any) -> None:
    """An optimisation attack that took no step answers with its starting point: whatever
    gradient distance that start scores (a random batch can score under the priors' 0.4 line)
    is no evidence that the attack converged. Its distance is kept as ``start_relative_distance``
    and none is recorded as the answer's, so that every verdict (attacks/verdict.py) calls it
    "not converged"."""
    extra = getattr(recon, "extra", None)
    if getattr(recon, "iterations", None) != 0 or not isinstance(extra, dict):
        return
    rel = extra.get("relative_gradient_distance")
    if rel is not None:
        extra["start_relative_distance"] = rel
    extra["relative_gradient_distance"] = None
    extra["stop_reason"] = NO_STEP


AttackRunner = Callable[[Any, SharedUpdate, Any, Engine], Any]
# A runner in place of a config type's spec module: fn(config, update, model, engine).
ATTACK_RUNNERS: dict[type, AttackRunner] = {}


__all__ = ["ATTACK_RUNNERS", "NO_STEP", "Engine", "StartBatch", "no_step_evidence"]
