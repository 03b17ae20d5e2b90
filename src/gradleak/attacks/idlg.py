"""iDLG (Zhao, Mopuri, Bilen 2020): the label restored analytically from the sign of the
classifier's weight gradient, then DLG on the image alone (dlg.py holds the shared machinery)."""

from __future__ import annotations

# The attack's declaration (gradleak/specs.py reads it without importing this module).
SPEC = {
    "name": "idlg",
    "summary": "iDLG (Zhao et al. 2020): the label from the classifier gradient's sign, then DLG on the image",
    "kind": "optimisation",
    "converged_below": 1e-5,   # DLG's line (attacks/verdict.py)
    "needs": "the gradients (or update) and the model; restores labels exactly for one image",
    "flags": {
        "iterations": 300, "lr": 1.0, "optimizer": "lbfgs", "init": "randn", "dtype": "float64",
        "stall_restarts": 3, "stop": "settled",
    },
    "default_note": {"iterations": "dlg and idlg: per start"},
    "one_start": {"stall_restarts": 0},   # a single start: no further starts from other inits
    "auto": {"order": 0, "one_image": True, "batch": False, "max_side": None},
    "changed_defaults": {"optimizer": "L-BFGS with a strong Wolfe line search (none before)"},
    # the flags every sweep cell identity hashes even unset (gradleak/specs.py); frozen, never extended
    "hashed_flags": ["iterations", "lr", "optimizer", "init", "dtype", "stall_restarts", "stop"],
}


from ..fl.update import SharedUpdate
from ..models import ModelSpec
from .dlg import run_dlg
from ..engine import Engine
from .reconstruction import Reconstruction
from .configs import config_class

# the typed config of this attack, derived from its SPEC (attacks/configs.py)
IDLGConfig = config_class(SPEC["name"])


def run(config: IDLGConfig, update: SharedUpdate, model: ModelSpec, engine: Engine) -> Reconstruction:
    """iDLG: the label from the classifier gradient's sign, then the image alone (``config.stop`` as in DLG)."""
    return run_dlg(config, update, model, engine, restore_labels=True, name="idlg")


__all__ = ["SPEC", "run"]
