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

from typing import Any

from ...attacks.portfolio import Answer, Portfolio, run_portfolio, score
from ...attacks.verdict import Convergence, converged_below, verdict
from ...defenses.floor import NoiseFloor, noise_floor
from ...engine import Engine
from ...fl.update import SharedUpdate
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


class TextPortfolio(Portfolio):
    """The text chooser's hooks for the portfolio driver (attacks/portfolio.py): dager, then
    PORTFOLIO, each resolved at its defaults for the model; each answer judged on the text line
    with the noise floor of the tensors it matched; dager kept early only when exact."""

    def __init__(self, config: TextAutoConfig, update: SharedUpdate, model: TextModel) -> None:
        super().__init__(update, model)
        self.config, self.k = config, int(update.meta.batch_size)

    def members(self) -> tuple[str, ...]:
        return (EXACT_FIRST, *PORTFOLIO)

    def resolve(self, name: str) -> Any:
        return resolve_text_attack({"attack": name, "seed": self.config.seed}, self.model, self.k)

    def floor(self, rec: TextReconstruction) -> NoiseFloor:
        # on the tensors it matched, as the verdict
        return noise_floor(self.update, matched_tensors(self.model, self.update, rec))

    def judge(self, name: str, rec: TextReconstruction, floor: NoiseFloor) -> Convergence:
        return verdict(FAMILY, rec.extra, floor)

    def entry(self, answer: Answer) -> dict[str, Any]:
        """dager's verified sentences, or an optimiser's iterations."""
        if answer.name == EXACT_FIRST:
            return {"verified": answer.rec.extra.get("verified")}
        return {"iterations": answer.rec.iterations}

    def better(self, answer: Answer, best: Answer | None) -> bool:
        """dager's answer only when exact (every sentence verified), else the smaller distance."""
        if answer.name == EXACT_FIRST:
            return answer.conv.converged
        return super().better(answer, best)

    def enough(self, answer: Answer) -> str:
        """dager's exact answer, or an optimiser's within the text line."""
        if answer.name == EXACT_FIRST:
            return f"dager verified all {self.k} sentence(s): the answer is exact" if answer.conv.converged else ""
        rel = answer.conv.relative_gradient_distance
        if rel is not None and rel <= converged_below(FAMILY, answer.floor):
            return (f"{answer.name}'s answer explains the update (within the text line): the rest of the "
                    "portfolio was not needed")
        return ""

    def unanswered(self, answers: list[Answer]) -> tuple[Answer, str] | None:
        """Only dager answered (inexactly): its answer is kept."""
        dager = [a for a in answers if a.name == EXACT_FIRST]
        return (dager[0], "no optimisation attack left an answer; dager's inexact answer is kept") if dager else None

    def why_kept(self, best: Answer, tried: list[dict[str, Any]], answers: list[Answer]) -> str:
        verified = next((t.get("verified") for t in tried if t["attack"] == EXACT_FIRST and t["applies"]), None)
        return ((f"dager verified {verified} of {self.k} sentence(s); " if verified is not None else
                 "dager does not apply; ") + f"{best.name}'s answer explains the update best (relative distance "
                f"{score(best.rec):.2e})")

    def recorded(self) -> dict[str, Any]:
        return {"portfolio": [EXACT_FIRST, *PORTFOLIO]}


def run(config: TextAutoConfig, update: SharedUpdate, model: TextModel, engine: Engine) -> TextReconstruction:
    """dager first, then the optimisation portfolio (module doc), on the one portfolio driver."""
    return run_portfolio(TextPortfolio(config, update, model), engine)
