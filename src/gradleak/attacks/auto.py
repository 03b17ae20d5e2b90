"""The closed-form attacks on the engine, and the chooser ``--attack auto``: the worst case, the
first closed form whose answer explains the update, else the best answer of a portfolio of
optimisation attacks."""

from __future__ import annotations

# The chooser's declaration (gradleak/specs.py reads it without importing this module).
SPEC = {
    "name": "auto",
    "summary": "the worst case first: the closed forms that apply, then a portfolio of optimisation attacks",
    "kind": "chooser",
    "converged_below": None,   # each attack it runs is judged on its own line
    "needs": "whatever the attacks it runs need; it skips those that do not apply",
    "flags": {
        "fallback": ["optimisation attack", None, "auto: run this one optimisation attack when no closed-form attack "
                     "explains the update (default: a portfolio: dlg, gradinversion and ig for a batch or an "
                     "aggregate, keeping the answer that explains the update best; idlg, then ig unless idlg's answer "
                     "explains the update exactly, for one image)"],
    },
    "changed_defaults": {"fallback": "a portfolio on batches and aggregates (DLG, GradInversion, IG) "
                                     "(GradInversion alone before); one image: iDLG then IG (iDLG alone "
                                     "before; under strong noise iDLG fits the noise where IG still rebuilds a "
                                     "recognisable image)"},
    # the flags every sweep cell identity hashes even unset (gradleak/specs.py); frozen, never extended
    "hashed_flags": ["fallback"],
}

import importlib
from typing import Any

from ..defenses.floor import NoiseFloor, noise_floor
from ..engine import Engine
from ..fl.threats import ThreatModel
from ..fl.update import SharedUpdate
from ..models import ModelSpec
from ..specs import attack_specs
from .configs import CLOSED_FORM, CONFIGS, AutoConfig
from .portfolio import Answer, Portfolio, run_portfolio, score
from .reconstruction import Reconstruction
from .verdict import Convergence, converged_below, verdict


# Which optimisation attacks the portfolio runs is declared by each (its SPEC's "auto": one image
# or batches, and the largest image side it is run at). DLG optimises every pixel and label in
# float64 with L-BFGS: at 32-64 px (its paper's CIFAR and LFW images) a batch of 4 takes ~50 s
# here; at 224 px one start costs hours on this CPU, so it declares max_side 64. Inverting
# Gradients, likewise, is run up to 64 px (its ImageNet runs took 24k steps on a GPU).
# GradInversion is the batch attack built for 224 px (ImageNet's 224 px) and always runs.


def auto_portfolio(update: SharedUpdate) -> tuple[str, ...]:
    """The optimisation attacks ``auto`` runs, in their declared order, when no closed form
    explains the update: those declared for one image (iDLG, IG) for one image of one client; for a
    batch, an aggregate of clients or several local steps of a batch, those declared for batches
    whose largest image side (``max_side``) the images fit (DLG, GradInversion, IG)."""
    threat = ThreatModel.from_record(update.meta.threat)
    one_image = update.meta.batch_size <= 1 and threat.clients <= 1
    side = max(update.meta.input_shape[1:])
    members = []
    for spec in sorted((s for s in attack_specs().values() if s.optimisation and s.auto),
                       key=lambda s: s.auto["order"]):  # type: ignore[index]
        use = spec.auto or {}
        if use.get("one_image" if one_image else "batch") and (use.get("max_side") is None or side <= use["max_side"]):
            members.append(spec.name)
    return tuple(members)


def _closed_form(name: str) -> Any:
    """The closed-form attack's module (its ``check`` and ``run``); ``name`` is one of CLOSED_FORM,
    whose modules are files of gradleak's own attack package (specs.attack_specs)."""
    return importlib.import_module(CONFIGS[name].spec.module)


class ImagePortfolio(Portfolio):
    """The image chooser's hooks for the portfolio driver (attacks/portfolio.py): the closed forms,
    each checked first, then the optimisation portfolio ``cfg.portfolio``; one noise floor for all;
    each answer judged on its own attack's line; the history the kept answer's own observations."""

    def __init__(self, cfg: AutoConfig, update: SharedUpdate, model: ModelSpec) -> None:
        super().__init__(update, model)
        self.cfg, self.the_floor = cfg, noise_floor(update)
        self.portfolio = {m.attack: m for m in cfg.portfolio}
        self.several = len(cfg.portfolio) > 1
        self.observed: dict[str, dict[int, float]] = {}

    def members(self) -> tuple[str, ...]:
        return (*CLOSED_FORM, *self.portfolio)

    def resolve(self, name: str) -> Any:
        return CONFIGS[name](seed=self.cfg.seed) if name in CLOSED_FORM else self.portfolio[name]  # type: ignore[call-arg]

    def check(self, name: str) -> None:
        if name in CLOSED_FORM:  # the typed refusals, a cost over its bound (rgap) included
            _closed_form(name).check(self.update, self.model)

    def scope(self, name: str) -> str:
        # each member of a portfolio checkpoints under its own name (state.Session.scope)
        return f"{name}/" if self.several and name not in CLOSED_FORM else ""

    def floor(self, rec: Reconstruction) -> NoiseFloor:
        return self.the_floor

    def judge(self, name: str, rec: Reconstruction, floor: NoiseFloor) -> Convergence:
        return verdict(name, rec.extra, floor)

    def entry(self, answer: Answer) -> dict[str, Any]:
        entry: dict[str, Any] = {} if answer.name in CLOSED_FORM else {"iterations": answer.rec.iterations}
        if floor_only(answer.conv):   # converged only onto the noise floor: no sign of a rebuilt input
            entry["floor_only"] = True
        return entry

    def better(self, answer: Answer, best: Answer | None) -> bool:
        """An imprint answer before any that did not converge (the inputs it separated are read off
        the update), else the smaller relative gradient distance. Each attack's own convergence line
        does not rank them: the priors' line (0.4) is far looser than DLG's (1e-5), and a DLG answer
        at 0.03 explains the update better than a prior-regularised one "converged" at 0.1."""
        if best is None:
            return True
        if (answer.name == "imprint") != (best.name == "imprint"):
            other_converged = best.conv.converged if answer.name == "imprint" else answer.conv.converged
            if not other_converged:
                return answer.name == "imprint"
        return score(answer.rec) < score(best.rec)

    def enough(self, answer: Answer) -> str:
        """A closed form that converged, or a portfolio member whose answer is within DLG's line."""
        name, conv = answer.name, answer.conv
        if name in CLOSED_FORM and conv.converged:
            return f"{name} applies and its answer {fit_words(conv)}"
        if name not in CLOSED_FORM and self.several and conv.relative_gradient_distance is not None \
                and conv.relative_gradient_distance <= converged_below("dlg", answer.floor):
            return (f"{name}'s answer {fit_words(conv, exactly=True)} (within DLG's line): the rest of the "
                    "portfolio was not needed")
        return ""

    def why_kept(self, best: Answer, tried: list[dict[str, Any]], answers: list[Answer]) -> str:
        """Worded by the kept answer's own evidence."""
        name, conv = best.name, best.conv
        if name in CLOSED_FORM:
            return f"no attack converged; {name} is kept (" + (
                "it reads the separated inputs off the update" if name == "imprint" else "it explains the update best") + ")"
        ran = any(t["applies"] for t in tried if t["attack"] in CLOSED_FORM)
        head = (("no closed-form attack explained the update" if ran else "no closed-form attack applies")
                + f"; fell back to optimisation ({', '.join(self.cfg.members)}): ")
        if floor_only(conv):
            return head + f"{name}'s answer is kept: it {fit_words(conv)}"
        return (head + f"{name}'s answer explains the update " + ("best " if len(answers) > 1 else "")
                + f"(relative distance {score(best.rec):.2e}"
                + (", within its line)" if conv.converged else ", not within its line)"))

    def recorded(self) -> dict[str, Any]:
        budget = {m.attack: int(getattr(m, "iterations", 0) or 0) for m in self.cfg.portfolio}
        return {"portfolio": list(self.cfg.members), "budget_iterations": budget}

    def started(self, name: str, engine: Engine) -> None:
        _observed(engine, {})

    def finished(self, name: str, engine: Engine) -> None:
        self.observed[name] = _observed(engine)

    def kept(self, name: str, engine: Engine) -> None:
        _observed(engine, self.observed.get(name, {}))  # the history shows the kept answer's own observations


def run(cfg: AutoConfig, update: SharedUpdate, model: ModelSpec, engine: Engine) -> Reconstruction:
    """The chooser (module doc): closed forms first, then the portfolio ``cfg.portfolio``."""
    return run_portfolio(ImagePortfolio(cfg, update, model), engine)


def floor_only(conv: Convergence) -> bool:
    """Whether a converged answer fits the defended update no better than the true data do: its
    distance is within the noise floor's spread (defenses/floor.py), so the update no longer tells
    this answer from the client's data, and converging is no sign of a rebuilt input."""
    rel = conv.relative_gradient_distance
    return conv.converged and conv.noise_floor > 0 and rel is not None and rel >= conv.noise_floor - conv.floor_tolerance


def fit_words(conv: Convergence, exactly: bool = False) -> str:
    """How a converged member's answer fits the update, in the words its evidence allows: it
    "explains" the update only when it fits better than the defenses' noise lets the truth."""
    rel = conv.relative_gradient_distance
    dist = f"relative distance {rel:.2e}" if rel is not None else "no finite distance"
    if floor_only(conv):
        return (f"fits the defended update only as well as the true data would ({dist}; the truth's "
                f"{conv.noise_floor:.2e} +- {conv.floor_tolerance:.2e}): under this noise the update no longer tells "
                "the data apart, so the fit is no sign of a rebuilt input")
    return f"explains the update{' exactly' if exactly else ''} ({dist})"


def _observed(engine: Engine, replace: dict[int, float] | None = None) -> dict[int, float]:
    """The pipeline's observer's points (its PSNR per iteration; read afresh: a resumed state
    replaces the dict), after replacing them with ``replace`` when given."""
    if replace is not None and isinstance(getattr(engine.observer, "points", None), dict):
        engine.observer.points = dict(replace)  # type: ignore[union-attr]
    points = getattr(engine.observer, "points", None)
    return dict(points) if isinstance(points, dict) else {}


__all__ = ["SPEC", "auto_portfolio", "run"]
