"""Plain DLG for text: free dummy embeddings (no token set), each position mapped to its nearest
row of the word embedding, then the same search among each position's nearest tokens
(text/search.py ``dlg_text`` with ``restrict=False``)."""

from __future__ import annotations

# The attack's declaration (gradleak/specs.py reads it without importing this module).
SPEC = {
    "name": "dlg-free",
    "modality": "text",
    "summary": "DLG on free token embeddings, nearest tokens, plus the search",
    "kind": "optimisation",
    "converged_below": 1e-4,   # the text line (attacks/verdict.py)
    "needs": "the gradients (or update) of a text classifier",
    "flags": {"iterations": None, "lr": None, "optimizer": None, "dtype": None, "labels": None,
              "search_evaluations": None},
    "model_defaults": {
        "tiny-transformer": {"iterations": 200, "lr": 0.1, "optimizer": "adam", "dtype": "float64",
                             "search_evaluations": 4000},
        "minilm": {"iterations": 50, "lr": 0.1, "optimizer": "adam", "dtype": "float32", "search_evaluations": 500},
    },
    "default_note": {"labels": "bias for one sentence, else soft"},
    "resolve": True,
    # the flags every sweep cell identity hashes even unset (gradleak/specs.py); frozen, never extended
    "hashed_flags": ["iterations", "lr", "optimizer", "dtype", "labels", "search_evaluations"],
}

from ...engine import Engine
from ...fl.update import SharedUpdate
from ..configs import text_config_class
from ..leak import TextReconstruction
from ..search import dlg_text
from ..models import TextModel
from .dlg import resolve  # the same label rule as dlg

# the typed config of this attack, derived from its SPEC (text/configs.py)
TextDLGFreeConfig = text_config_class(SPEC["name"])

__all__ = ["SPEC", "resolve", "run"]


def run(config: TextDLGFreeConfig, update: SharedUpdate, model: TextModel, engine: Engine) -> TextReconstruction:
    return dlg_text(update, model, config, engine, restrict=False)
