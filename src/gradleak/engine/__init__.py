"""The engine: every run service an attack uses, behind small hooks."""

from __future__ import annotations

from .core import ATTACK_RUNNERS, Engine, StartBatch
from .progress import Observer
from .session import Interrupted, Session
from .settings import LoopHooks, LoopResult, LoopSettings, Objective
from .shard import SeedShard
from .state import AttackState, StateFileError, StateHooks

__all__ = ["ATTACK_RUNNERS", "AttackState", "Engine", "Interrupted", "LoopHooks", "LoopResult", "LoopSettings",
           "Objective", "Observer", "SeedShard", "Session", "StartBatch", "StateFileError", "StateHooks"]
