"""DLG for text (Zhu et al. 2019, Sec. 4.2), restricted to the leaked bag of words, then a greedy
search over discrete sentences (text/search.py ``dlg_text``)."""

from __future__ import annotations

# The attack's declaration (gradleak/specs.py reads it without importing this module). Its
# defaults depend on the text model ("model_defaults"; the first model's for any other).
SPEC = {
    "name": "dlg",
    "modality": "text",
    "summary": "DLG restricted to the leaked bag of words, plus a search over orders (default)",
    "kind": "optimisation",
    "converged_below": 1e-4,   # the text line (attacks/verdict.py)
    "needs": "the gradients (or update) of a text classifier whose word embedding is trained",
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

from typing import Any

from ...engine import Engine
from ...fl.update import SharedUpdate
from ..configs import text_config_class
from ..leak import TextReconstruction, TextResolution
from ..search import dlg_text
from ..models import TextModel

# the typed config of this attack, derived from its SPEC (text/configs.py)
TextDLGConfig = text_config_class(SPEC["name"])


def resolve(values: dict[str, Any], context: TextResolution) -> dict[str, Any]:
    """The label rule: the classifier bias's gradient for one sentence (exact), soft labels
    optimised with the sentences for a batch."""
    if values.get("labels") is None:
        values = {**values, "labels": "bias" if context.batch_size == 1 else "soft"}
    return values


def run(config: TextDLGConfig, update: SharedUpdate, model: TextModel, engine: Engine) -> TextReconstruction:
    return dlg_text(update, model, config, engine, restrict=True)
