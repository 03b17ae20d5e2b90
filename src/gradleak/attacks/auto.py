"""The closed-form attacks on the engine, and the chooser ``--attack auto``.

``auto`` is what an auditor runs first: the worst case. It tries the closed-form attacks that
apply to the model and the threat, in the order of configs.CLOSED_FORM:

1. imprint: the model carries a malicious server's imprint block (attacks/imprint.py);
2. analytic: the first layer is fully connected and sees the image (attacks/analytic.py);
3. rgap: a chain of layers with invertible activations, batch 1 (attacks/rgap.py);

and keeps the first whose answer explains the update (the convergence verdict, verdict.py, with
the defenses' noise floor). When none applies or none converges, it runs its fallback, an
optimisation attack (GradInversion for batches and aggregates, iDLG for one image), and keeps
whichever answer explains the update best by the attacker's own objective (a converged fallback
first; the imprint answer before an optimisation that did not converge, since the inputs it
separated are read off the update). ``extra["auto"]``
records every attack tried, why the others did not apply, and which was used.

A member that refuses the update (any typed GradleakError: its check, a cost over its stated
bound such as R-GAP's ``MAX_SOLVE_BYTES``, or an error while it runs, e.g. the analytic attack on
a zero bias gradient, imprint on NaN/Inf) is recorded as not applicable with the error's one-line
reason, and the next member is tried; only the fallback's own error ends the run, and only when
no closed-form answer is left to keep.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ..defenses.floor import noise_floor
from ..errors import GradleakError
from ..fl.threats import ThreatModel
from ..fl.update import SharedUpdate
from ..models import ModelSpec
from ..paths import one_line
from .analytic import analytic, check_analytic
from .configs import CLOSED_FORM, AnalyticConfig, AutoConfig, ImprintConfig, RGAPConfig
from .engine import Engine, register_attack
from .imprint import check_imprint, imprint_attack
from .reconstruction import Reconstruction
from .rgap import check_rgap, rgap
from .state import StateFileError
from .verdict import verdict


def auto_fallback(update: SharedUpdate) -> str:
    """The optimisation attack ``auto`` falls back to: GradInversion (batch recovery) for a batch
    or an aggregate of clients, iDLG for one image."""
    threat = ThreatModel.from_record(update.meta.threat)
    return "gradinversion" if update.meta.batch_size > 1 or threat.clients > 1 else "idlg"


@register_attack(AnalyticConfig)
def _analytic(cfg: AnalyticConfig, update: SharedUpdate, model: ModelSpec, engine: Engine) -> Reconstruction:
    return analytic(update, model, device=engine.device)


@register_attack(RGAPConfig)
def _rgap(cfg: RGAPConfig, update: SharedUpdate, model: ModelSpec, engine: Engine) -> Reconstruction:
    return rgap(update, model, device=engine.device)


@register_attack(ImprintConfig)
def _imprint(cfg: ImprintConfig, update: SharedUpdate, model: ModelSpec, engine: Engine) -> Reconstruction:
    return imprint_attack(update, model)


CHECKS: dict[str, Callable[[SharedUpdate, ModelSpec], Any]] = {
    "imprint": check_imprint, "analytic": check_analytic, "rgap": check_rgap}
CONFIGS = {"imprint": ImprintConfig, "analytic": AnalyticConfig, "rgap": RGAPConfig}


def _score(rec: Reconstruction) -> float:
    rel = rec.extra.get("relative_gradient_distance")
    return float(rel) if isinstance(rel, (int, float)) and math.isfinite(rel) else math.inf


@register_attack(AutoConfig)
def _auto(cfg: AutoConfig, update: SharedUpdate, model: ModelSpec, engine: Engine) -> Reconstruction:
    floor = noise_floor(update)
    tried: list[dict[str, Any]] = []
    spent = 0.0
    best: tuple[str, Reconstruction] | None = None
    for name in CLOSED_FORM:
        try:
            CHECKS[name](update, model)  # the typed refusals, a cost over its bound (rgap) included
        except GradleakError as exc:
            tried.append({"attack": name, "applies": False, "why": one_line(str(exc))})
            continue
        try:
            rec = engine.run(CONFIGS[name](seed=cfg.seed), update, model)
        except StateFileError:
            raise
        except GradleakError as exc:  # the member refused this update at run time: the next one
            tried.append({"attack": name, "applies": False, "why": one_line(str(exc)), "error": type(exc).__name__})
            continue
        spent += rec.wall_seconds
        conv = verdict(name, rec.extra, floor)
        tried.append({"attack": name, "applies": True, "converged": conv.converged,
                      "relative_gradient_distance": conv.relative_gradient_distance,
                      "seconds": round(rec.wall_seconds, 3)})
        # the imprint answer first (the inputs it separated are read off the update), else the
        # answer that explains the update best
        if best is None or (best[0] != "imprint" and (name == "imprint" or _score(rec) < _score(best[1]))):
            best = (name, rec)
        if conv.converged:
            return _chosen(name, rec, tried, f"{name} applies and its answer explains the update", spent)
    fallback = cfg.fallback.attack
    try:
        rec = engine.run(cfg.fallback, update, model)
    except StateFileError:
        raise
    except GradleakError as exc:
        if best is None:
            raise  # nothing else to report: the fallback's own error
        tried.append({"attack": fallback, "applies": False, "why": one_line(str(exc)), "error": type(exc).__name__})
        return _chosen(best[0], best[1], tried, f"{fallback} failed; {best[0]} is kept (no attack converged)", spent)
    spent += rec.wall_seconds
    conv = verdict(fallback, rec.extra, floor)
    tried.append({"attack": fallback, "applies": True, "converged": conv.converged,
                  "relative_gradient_distance": conv.relative_gradient_distance, "seconds": round(rec.wall_seconds, 3)})
    if conv.converged:
        return _chosen(fallback, rec, tried, f"no closed-form attack explained the update; {fallback} did", spent)
    if best is not None and (best[0] == "imprint" or _score(best[1]) < _score(rec)):
        # the imprint block reads single inputs off the update: whatever it separated is the
        # worst case, even when a collision keeps it from claiming every input
        return _chosen(best[0], best[1], tried, f"no attack converged; {best[0]} is kept ("
                       + ("it reads the separated inputs off the update" if best[0] == "imprint" else
                          "it explains the update best") + ")", spent)
    why = ("no closed-form attack applies" if best is None else "no closed-form attack explained the update")
    return _chosen(fallback, rec, tried, f"{why}: fell back to optimisation ({fallback})", spent)


def _chosen(name: str, rec: Reconstruction, tried: list[dict[str, Any]], why: str, spent: float) -> Reconstruction:
    rec.wall_seconds = spent  # the chooser's whole cost: every attack it ran
    rec.extra["attack_used"] = name
    rec.extra["auto"] = {"used": name, "why": why, "tried": tried}
    return rec


__all__ = ["CHECKS", "auto_fallback"]
