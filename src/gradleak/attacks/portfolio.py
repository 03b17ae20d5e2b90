"""The one portfolio driver of both choosers (attacks/auto.py for images, text/attacks/auto.py for
text): it runs the members in order, records each one tried, keeps the best answer, stops once an
answer explains the update, and writes the record. What differs by modality, the members, the
floor, the verdict's family, the rules and the sentences, each chooser supplies as a Portfolio."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..engine.state import StateFileError
from ..errors import GradleakError
from ..paths import one_line

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..defenses.floor import NoiseFloor
    from ..engine import Engine
    from ..fl.update import SharedUpdate
    from .verdict import Convergence

__all__ = ["Answer", "Portfolio", "run_portfolio", "score"]


@dataclass(frozen=True)
class Answer:
    """One member's answer (its Reconstruction or TextReconstruction), with the noise floor it was
    judged on and its verdict."""

    name: str
    rec: Any
    floor: NoiseFloor
    conv: Convergence


def score(rec: Any) -> float:
    """An answer's relative gradient distance, the attacker-side rank of both choosers (inf when
    it recorded none, or none finite)."""
    rel = rec.extra.get("relative_gradient_distance")
    return float(rel) if isinstance(rel, (int, float)) and math.isfinite(rel) else math.inf


class Portfolio:
    """What a chooser supplies to run_portfolio, as hooks: its members and how each is resolved,
    checked and scoped; its floor and verdict; its tried entry's own fields; its "better answer"
    and "enough, stop here" rules; its ``why`` sentences and its record's own fields. The defaults
    are those the two choosers share."""

    def __init__(self, update: SharedUpdate, model: Any) -> None:
        self.update, self.model = update, model

    def members(self) -> Sequence[str]:
        """The attacks to try, in order."""
        raise NotImplementedError

    def resolve(self, name: str) -> Any:
        """Member ``name``'s typed config (what ``engine.run`` takes)."""
        raise NotImplementedError

    def check(self, name: str) -> None:
        """Raise a GradleakError when ``name`` does not apply (recorded with its reason, not run)."""

    def scope(self, name: str) -> str:
        """The checkpoint scope member ``name`` runs under (engine.Session.scope)."""
        return f"{name}/"

    def floor(self, rec: Any) -> NoiseFloor:
        """The defenses' noise floor the answer ``rec`` is judged on."""
        raise NotImplementedError

    def judge(self, name: str, rec: Any, floor: NoiseFloor) -> Convergence:
        """The verdict on member ``name``'s answer (attacks/verdict.py, in the chooser's family)."""
        raise NotImplementedError

    def entry(self, answer: Answer) -> dict[str, Any]:
        """The fields the tried entry of an answer adds to the shared ones."""
        return {}

    def better(self, answer: Answer, best: Answer | None) -> bool:
        """Whether ``answer`` explains the update better than ``best``: the smaller distance."""
        return best is None or score(answer.rec) < score(best.rec)

    def enough(self, answer: Answer) -> str:
        """Why the chooser stops at this answer ("" to go on)."""
        return ""

    def unanswered(self, answers: list[Answer]) -> tuple[Answer, str] | None:
        """The answer kept, and why, when none was ever the best (None: the last error is raised)."""
        return None

    def why_kept(self, best: Answer, tried: list[dict[str, Any]], answers: list[Answer]) -> str:
        """Why the chooser kept ``best`` when no answer stopped it early."""
        raise NotImplementedError

    def recorded(self) -> dict[str, Any]:
        """The record's own fields after ``used``, ``why`` and ``tried`` (e.g. the portfolio)."""
        return {}

    def started(self, name: str, engine: Engine) -> None:
        """Called just before member ``name`` runs."""

    def finished(self, name: str, engine: Engine) -> None:
        """Called after member ``name`` answered."""

    def kept(self, name: str, engine: Engine) -> None:
        """Called once the answer to keep is chosen."""


def _tried(answer: Answer, extra: dict[str, Any]) -> dict[str, Any]:
    """The tried entry of a member that answered: its convergence, distance and cost, then ``extra``."""
    return {"attack": answer.name, "applies": True, "converged": answer.conv.converged,
            "relative_gradient_distance": answer.conv.relative_gradient_distance,
            "seconds": round(answer.rec.wall_seconds, 3), **extra}


def _run_member(chooser: Portfolio, name: str, engine: Engine) -> Any:
    """Run member ``name`` under its own checkpoint scope (the scope always reset after)."""
    member = chooser.resolve(name)
    chooser.started(name, engine)
    engine.session.scope = chooser.scope(name)
    try:
        return engine.run(member, chooser.update, chooser.model)
    finally:
        engine.session.scope = ""


def run_portfolio(chooser: Portfolio, engine: Engine) -> Any:
    """Try ``chooser``'s members in order and return the kept answer, its record in
    ``extra["auto"]``, its cost the sum of all, the others' answers its ``alternatives``. A member
    that refuses the update (a GradleakError, never a StateFileError) is recorded as not applying;
    the run ends on an error only when no member left an answer to keep."""
    tried: list[dict[str, Any]] = []
    answers: list[Answer] = []
    best: Answer | None = None
    error: GradleakError | None = None
    spent, why = 0.0, ""
    for name in chooser.members():
        try:
            chooser.check(name)
        except GradleakError as exc:
            tried.append({"attack": name, "applies": False, "why": one_line(str(exc))})
            continue
        try:
            rec = _run_member(chooser, name, engine)
        except StateFileError:
            raise
        except GradleakError as exc:  # the member refused this update at run time: the next one
            tried.append({"attack": name, "applies": False, "why": one_line(str(exc)), "error": type(exc).__name__})
            error = exc
            continue
        chooser.finished(name, engine)
        spent += rec.wall_seconds
        floor = chooser.floor(rec)
        answer = Answer(name, rec, floor, chooser.judge(name, rec, floor))
        tried.append(_tried(answer, chooser.entry(answer)))
        answers.append(answer)
        if chooser.better(answer, best):
            best = answer
        why = chooser.enough(answer)
        if why:
            break
    if best is None:
        fallback = chooser.unanswered(answers)
        if fallback is None:
            assert error is not None  # every member raised or refused, the last one with an error
            raise error
        best, why = fallback
    chooser.kept(best.name, engine)
    return _record(chooser, best, why or chooser.why_kept(best, tried, answers), tried, spent, answers)


def _record(chooser: Portfolio, best: Answer, why: str, tried: list[dict[str, Any]], spent: float,
            answers: list[Answer]) -> Any:
    """The kept answer with the chooser's record: its whole cost, what was tried and why it was kept."""
    rec = best.rec
    rec.wall_seconds = spent  # the chooser's whole cost: every attack it ran
    rec.extra["attack_used"] = best.name
    rec.extra["auto"] = {"used": best.name, "why": why, "tried": tried, **chooser.recorded()}
    rec.alternatives = [(a.name, a.rec) for a in answers if a.rec is not rec]
    return rec
