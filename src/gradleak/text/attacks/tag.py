"""TAG, "Gradient Attack on Transformer-based Language Models" (Deng et al., Findings of EMNLP
2021): free dummy token embeddings (and soft labels) optimised so that the simulated update
matches the shared one under TAG's distance, the Euclidean distance of the gradients plus alpha
times their Manhattan distance (Sec. 3), then each position mapped to its nearest row of the word
embedding (text/inversion.py ``dlg_text`` with ``restrict=False`` and ``l1_weight`` = alpha).

Choices (the paper leaves them to its code): the Euclidean term is squared (DLG's objective, so
that alpha = 0 is DLG on free embeddings exactly) and alpha defaults to 0.01 (``--l1-weight``);
no discrete search by default (``--search-evaluations 0``: TAG has none; gradleak's order search
may be switched on with a budget). Batches are handled as DLG does: K x L dummy positions and K
soft labels; the sentence length is the leaked position count.
"""

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
}

from typing import Any

from ...engine import Engine
from ...fl.update import SharedUpdate
from ..inversion import TextReconstruction, dlg_text, settings_from_config
from ..models import TextModel
from .dlg import resolve  # the same label rule as dlg

__all__ = ["SPEC", "resolve", "run"]


def run(config: Any, update: SharedUpdate, model: TextModel, engine: Engine) -> TextReconstruction:
    return dlg_text(update, model, settings_from_config(config, engine), engine.observer, restrict=False,
                    engine=engine)
