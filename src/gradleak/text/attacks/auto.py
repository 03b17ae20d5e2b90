"""The text chooser ``--modality text --attack auto``: the worst case first, as the image chooser
(attacks/auto.py) does for images."""

from __future__ import annotations

# The chooser's declaration (gradleak/specs.py reads it without importing this module).
SPEC = {
    "name": "auto",
    "modality": "text",
    "summary": "the worst case first: dager's exact recovery where it applies, then dlg and lamp, keeping the best answer",
    "kind": "chooser",
    "converged_below": None,   # each attack it runs is judged on the text line
    "needs": "whatever the attacks it runs need; it skips those that do not apply",
    "flags": {},
}

import math
from typing import Any

from ...attacks.verdict import Convergence, converged_below, verdict
from ...defenses.floor import noise_floor
from ...engine import Engine, StateFileError
from ...errors import GradleakError
from ...fl.update import SharedUpdate
from ...paths import one_line
from ..configs import resolve_text_attack, text_config_class
from ..leak import TextReconstruction
from ..simulate import matched_tensors
from ..models import TextModel

# the typed config of this attack, derived from its SPEC (text/configs.py)
TextAutoConfig = text_config_class(SPEC["name"])

__all__ = ["EXACT_FIRST", "PORTFOLIO", "SPEC", "run"]

EXACT_FIRST = "dager"
PORTFOLIO = ("dlg", "lamp")
FAMILY = "text"   # the text attacks' one convergence line (outcome.py)


def _score(rec: TextReconstruction) -> float:
    rel = rec.extra.get("relative_gradient_distance")
    return float(rel) if isinstance(rel, (int, float)) and math.isfinite(rel) else math.inf


def _tried_entry(name: str, rec: TextReconstruction, conv: Convergence) -> dict[str, Any]:
    """What the record says of one member that ran: its convergence, distance, cost, and dager's
    verified sentences or an optimiser's iterations."""
    entry: dict[str, Any] = {"attack": name, "applies": True, "converged": conv.converged,
                             "relative_gradient_distance": conv.relative_gradient_distance,
                             "seconds": round(rec.wall_seconds, 3)}
    if name == EXACT_FIRST:
        entry["verified"] = rec.extra.get("verified")
    else:
        entry["iterations"] = rec.iterations
    return entry


def run(config: TextAutoConfig, update: SharedUpdate, model: TextModel, engine: Engine) -> TextReconstruction:
    k = int(update.meta.batch_size)
    tried: list[dict[str, Any]] = []
    answers: list[tuple[str, TextReconstruction]] = []
    best: tuple[str, TextReconstruction] | None = None
    error: GradleakError | None = None
    spent, why = 0.0, ""
    for name in (EXACT_FIRST, *PORTFOLIO):
        member = resolve_text_attack({"attack": name, "seed": config.seed}, model, k)
        engine.session.scope = f"{name}/"   # each member checkpoints under its own name
        try:
            rec = engine.run(member, update, model)
        except StateFileError:
            raise
        except GradleakError as exc:   # refused this update (dager under FedAvg): the next one
            tried.append({"attack": name, "applies": False, "why": one_line(str(exc)), "error": type(exc).__name__})
            error = exc
            continue
        finally:
            engine.session.scope = ""
        spent += rec.wall_seconds
        floor = noise_floor(update, matched_tensors(model, update, rec))   # on the tensors it matched, as the verdict
        conv = verdict(FAMILY, rec.extra, floor)
        tried.append(_tried_entry(name, rec, conv))
        answers.append((name, rec))
        if name == EXACT_FIRST:
            if conv.converged:   # every sentence verified: exact
                best, why = (name, rec), f"dager verified all {k} sentence(s): the answer is exact"
                break
            continue
        if best is None or _score(rec) < _score(best[1]):
            best = (name, rec)
        rel = conv.relative_gradient_distance
        if rel is not None and rel <= converged_below(FAMILY, floor):
            why = f"{name}'s answer explains the update (within the text line): the rest of the portfolio was not needed"
            break
    if best is None:   # only dager answered (inexactly), or nothing did
        dager = [a for a in answers if a[0] == EXACT_FIRST]
        if not dager:
            assert error is not None
            raise error
        best = dager[0]
        why = why or "no optimisation attack left an answer; dager's inexact answer is kept"
    name, rec = best
    if not why:
        verified = next((t.get("verified") for t in tried if t["attack"] == EXACT_FIRST and t["applies"]), None)
        why = ((f"dager verified {verified} of {k} sentence(s); " if verified is not None else
                "dager does not apply; ") + f"{name}'s answer explains the update best (relative distance "
               f"{_score(rec):.2e})")
    rec.wall_seconds = spent   # the chooser's whole cost: every attack it ran
    rec.extra["attack_used"] = name
    rec.extra["auto"] = {"used": name, "why": why, "tried": tried, "portfolio": [EXACT_FIRST, *PORTFOLIO]}
    rec.alternatives = [a for a in answers if a[1] is not rec]
    return rec
