"""Attacks: from a SharedUpdate and the model to a Reconstruction (never seeing ground truth)."""

from __future__ import annotations

import torch

from ..catalog import unknown
from ..fl.update import SharedUpdate
from ..models import ModelSpec
from . import auto, configs  # noqa: F401  (register each attack with the engine)
from .base import AttackSettings, Observer
from .auto import auto_portfolio
from .configs import CLOSED_FORM, IMAGE_ATTACK_CONFIGS, ImageAttackConfig, resolve_attack
from .engine import Engine
from .gradinversion import layer_counts
from .state import AttackState
# The attack modules under aliases: binding their functions here (``from .dlg import dlg``) would
# shadow the submodules of the same name, so that ``import gradleak.attacks.dlg as m`` gave the
# function dlg and a constant patched on it reached nothing.
from . import analytic as _analytic, dlg as _dlg, gradinversion as _gradinversion, ig as _ig, imprint as _imprint
from . import rgap as _rgap
from .gradinversion import GradInversionSettings
from .labels import LABEL_METHODS, restore_labels
from .reconstruction import Reconstruction

# The attack functions by name (for calling one directly with its own extra arguments).
ATTACKS = {"dlg": _dlg.dlg, "idlg": _dlg.idlg, "gradinversion": _gradinversion.gradinversion,
           "ig": _ig.inverting_gradients, "analytic": _analytic.analytic, "rgap": _rgap.rgap,
           "imprint": _imprint.imprint_attack}


def attack_names() -> list[str]:
    return sorted(IMAGE_ATTACK_CONFIGS)


def _has_batchnorm(model: ModelSpec) -> bool:
    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.module.modules())


def run_attack(name: str, update: SharedUpdate, model: ModelSpec, settings: AttackSettings | None = None,
               observer: Observer | None = None) -> Reconstruction:
    """Run the named attack. Its inputs are the shared update and the model only.

    The same path as a pipeline run: ``settings`` become the attack's typed config, resolved on
    this update (GradInversion's BN prior follows what the update carries), then Engine.run."""
    if name not in IMAGE_ATTACK_CONFIGS:
        raise unknown("attack", name, attack_names())
    s = settings or AttackSettings()
    shared = bool(update.meta.bn_statistics_shared) or not _has_batchnorm(model)
    if name in CLOSED_FORM:  # no optimisation: no constants
        config = resolve_attack({"attack": name, "seed": s.seed}, bn_statistics_shared=shared)
    else:
        values = {k: getattr(s, k) for k in ("iterations", "lr", "optimizer", "init", "dtype", "seed", "preset",
                                             "group", "bn", "labels")}
        values["attack"] = name
        values["restarts" if name == "ig" else "seeds"] = s.seeds
        portfolio = auto_portfolio(update) if name == "auto" else None
        config = resolve_attack(values, bn_statistics_shared=shared, portfolio=portfolio,
                                layers=layer_counts(model.module))
    return Engine(device=s.device, observer=observer, log_every=s.log_every, progress=s.progress).run(
        config, update, model)


__all__ = ["ATTACKS", "AttackSettings", "AttackState", "Engine", "GradInversionSettings", "ImageAttackConfig",
           "LABEL_METHODS", "Observer", "Reconstruction", "attack_names", "resolve_attack", "restore_labels",
           "run_attack"]
