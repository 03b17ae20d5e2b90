"""Attacks: from a SharedUpdate and the model to a Reconstruction (never seeing ground truth)."""

from __future__ import annotations

from typing import Callable

from ..errors import UnknownNameError
from ..fl.update import SharedUpdate
from ..models import ModelSpec
from . import configs  # noqa: F401  (registers each attack with the engine)
from .base import AttackSettings, Observer
from .configs import ImageAttackConfig, resolve_attack
from .engine import Engine
from .state import AttackState
from .dlg import dlg, idlg
from .gradinversion import GradInversionSettings, gradinversion
from .ig import inverting_gradients
from .labels import LABEL_METHODS, restore_labels
from .reconstruction import Reconstruction

AttackFn = Callable[[SharedUpdate, ModelSpec, AttackSettings, "Observer | None"], Reconstruction]
ATTACKS: dict[str, AttackFn] = {"dlg": dlg, "idlg": idlg, "gradinversion": gradinversion, "ig": inverting_gradients}


def attack_names() -> list[str]:
    return sorted(ATTACKS)


def run_attack(name: str, update: SharedUpdate, model: ModelSpec, settings: AttackSettings | None = None,
               observer: Observer | None = None) -> Reconstruction:
    """Run the named attack. Its inputs are the shared update and the model only."""
    try:
        fn = ATTACKS[name]
    except KeyError:
        raise UnknownNameError(f"unknown attack {name!r}; known: {', '.join(attack_names())}") from None
    return fn(update, model, settings or AttackSettings(), observer)


__all__ = ["ATTACKS", "AttackSettings", "AttackState", "Engine", "ImageAttackConfig", "resolve_attack", "GradInversionSettings", "LABEL_METHODS", "Observer", "Reconstruction",
           "attack_names", "restore_labels", "run_attack"]
