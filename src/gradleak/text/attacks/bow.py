"""The bag of words: the batch's token set read off the word-embedding gradient's non-zero rows
(embedding backward is an index-add), and the longest sentence's length off the position
embedding's. No optimisation: text/leak.py ``bag_of_words`` and ``bow_attack``."""

from __future__ import annotations

# The attack's declaration (gradleak/specs.py reads it without importing this module).
SPEC = {
    "name": "bow",
    "modality": "text",
    "summary": "bag of words only: the token set from the word-embedding gradient's non-zero rows",
    "kind": "closed-form",
    # no optimisation: the text verdict judges it on whether its rows were exactly non-zero
    "converged_below": None,
    "needs": "the word-embedding gradient (or update) of a model whose embedding is trained",
    "flags": {},
}

from ...engine import Engine
from ...fl.update import SharedUpdate
from ..configs import text_config_class
from ..leak import TextReconstruction, bow_attack
from ..models import TextModel

# the typed config of this attack, derived from its SPEC (text/configs.py)
TextBowConfig = text_config_class(SPEC["name"])


def run(config: TextBowConfig, update: SharedUpdate, model: TextModel, engine: Engine) -> TextReconstruction:
    return bow_attack(update, model, engine.observer)
