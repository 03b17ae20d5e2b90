"""TAG (Deng et al., Findings of EMNLP 2021): free dummy token embeddings matched under TAG's
distance (Euclidean plus alpha times Manhattan, Sec. 3), then each position mapped to its nearest
row of the word embedding (text/search.py ``dlg_text``)."""

from __future__ import annotations

# The attack's declaration (gradleak/specs.py reads it without importing this module).
SPEC = {
    "name": "tag",
    "modality": "text",
    "summary": "TAG (Deng et al. 2021): free token embeddings under an l2 + alpha l1 gradient distance, nearest tokens",
    "kind": "optimisation",
    "converged_below": 1e-4,   # the text line (attacks/verdict.py)
    "needs": "the gradients (or update) of a text classifier",
    "flags": {"iterations": None, "lr": None, "optimizer": None, "dtype": None, "labels": None,
              "search_evaluations": None,
              "l1_weight": ["float>=0", None, "TAG: alpha, the weight of the l1 gradient distance beside the squared l2"]},
    "model_defaults": {
        "tiny-transformer": {"iterations": 200, "lr": 0.1, "optimizer": "adam", "dtype": "float64",
                             "search_evaluations": 0, "l1_weight": 0.01},
        "minilm": {"iterations": 50, "lr": 0.1, "optimizer": "adam", "dtype": "float32", "search_evaluations": 0,
                   "l1_weight": 0.01},
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
TextTAGConfig = text_config_class(SPEC["name"])

__all__ = ["SPEC", "resolve", "run"]


def run(config: TextTAGConfig, update: SharedUpdate, model: TextModel, engine: Engine) -> TextReconstruction:
    # TAG's distance: DLG's squared l2 plus alpha times the l1 (0 or None: DLG's alone)
    return dlg_text(update, model, config, engine, restrict=False, l1_weight=float(config.l1_weight or 0.0))
