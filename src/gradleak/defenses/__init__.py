"""Defenses: pure functions SharedUpdate -> SharedUpdate, composable, each recorded in
``meta.defenses`` as its canonical spec string."""

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
