"""Defenses: pure functions SharedUpdate -> SharedUpdate, composable, each recorded in
``meta.defenses`` as its canonical spec string.

    defenses = parse_defenses(["prune:0.9", "gaussian:1e-3"])
    defended = apply_defenses(update, defenses, torch.Generator().manual_seed(0))

Update-level defenses (gaussian, laplace, prune, fp16, int8) transform ``gradients`` only;
global weights and BN statistics pass through untouched. DP-SGD (``dpsgd:clip=C,noise=Z``) is
client-side: it needs per-sample gradients, so it runs in :func:`client_update` /
:func:`dpsgd_gradient`, not on a finished update. See :mod:`gradleak.defenses.spec` for the
grammar.
"""

from .base import Defense
from .dpsgd import DPSGD, dp_epsilon, dpsgd_gradient, per_sample_gradients
from .noise import GaussianNoise, LaplaceNoise
from .pruning import Prune
from .quantization import FP16, Int8
from .spec import (DEFENSES, apply_defenses, client_update, defense_names, parse_defense, parse_defenses,
                   split_defenses)

__all__ = ["DEFENSES", "DPSGD", "FP16", "Defense", "GaussianNoise", "Int8", "LaplaceNoise", "Prune",
           "apply_defenses", "client_update", "defense_names", "dp_epsilon", "dpsgd_gradient",
           "parse_defense", "parse_defenses", "per_sample_gradients", "split_defenses"]
