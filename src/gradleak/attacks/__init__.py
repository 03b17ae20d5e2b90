"""Attacks: from a SharedUpdate and the model to a Reconstruction (never seeing ground truth).
One attack, one module, declared in its ``SPEC`` (gradleak/specs.py); the pipeline is the way in."""

from __future__ import annotations

from ..engine import AttackState, Engine, Observer
from .configs import CLOSED_FORM, CONFIGS, IMAGE_ATTACK_CONFIGS, ImageAttackConfig, resolve_attack
from .labels import LABEL_METHODS, restore_labels
from .reconstruction import Reconstruction


def attack_names() -> list[str]:
    return sorted(IMAGE_ATTACK_CONFIGS)


__all__ = ["AttackState", "CLOSED_FORM", "CONFIGS", "Engine", "ImageAttackConfig", "LABEL_METHODS", "Observer",
           "Reconstruction", "attack_names", "resolve_attack", "restore_labels"]
