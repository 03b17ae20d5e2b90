"""The engine: every run service an attack uses, behind small hooks.

An attack computes an objective and its answer; the engine owns the rest::

    core.py         Engine: what the pipeline hands an attack (device, session, observer, shard)
    loop.py         optimise(): the one optimisation loop (L-BFGS, Adam, SGD; Langevin noise)
    settings.py     LoopSettings, LoopHooks (the attack's hooks), LoopResult, the schedules
    optimizers.py   the optimisers and the memory bound on their state
    lbfgs.py        L-BFGS in compact form (torch's algorithm, step for step)
    session.py      checkpoint and divergence settings, the resume point, SIGINT/SIGTERM
    checkpoints.py  the state folder on disk (safetensors + manifest, atomic, checked)
    state.py        what a snapshot holds (AttackState, StateHooks) and how it is packed
    loop_state.py   the loop's part of a snapshot, checked before it is restored
    guard.py        the divergence guard (back to the last good state, smaller steps)
    progress.py     the progress bar and the observer's schedule
    precision.py    IEEE float32 on CUDA while an attack runs
    shard.py        GradInversion's seeds spread over processes

The engine sits below the attacks and imports none of them: :meth:`Engine.run` finds an attack's
``run`` through its config's spec (by module name).
"""

from __future__ import annotations

from .core import ATTACK_RUNNERS, Engine
from .progress import Observer
from .session import Interrupted, Session
from .settings import LoopHooks, LoopResult, LoopSettings, Objective
from .shard import SeedShard
from .state import AttackState, StateFileError, StateHooks

__all__ = ["ATTACK_RUNNERS", "AttackState", "Engine", "Interrupted", "LoopHooks", "LoopResult", "LoopSettings",
           "Objective", "Observer", "SeedShard", "Session", "StateFileError", "StateHooks"]
