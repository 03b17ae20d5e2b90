"""Gradient pruning (DLG Fig. 7, "prune ratio"): zero the smallest-magnitude entries."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import ConfigError
from .base import Defense, check_finite

SCOPES = ("layer", "global")


def prune_count(fraction: float, n: int) -> int:
    """How many of ``n`` entries ``fraction`` prunes: round half up, floor(fraction * n + 0.5)."""
    return min(n, int(math.floor(fraction * n + 0.5)))


def _smallest(abs_flat: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k smallest entries; ties go to the lower index (a stable sort), so the
    count is exactly k whatever the ties and the choice is deterministic. NaN sorts last."""
    return torch.argsort(abs_flat, stable=True)[:k]


# Declared for the catalog (read without torch).
SPEC = {
    "name": "prune", "class": "Prune", "summary": "zero the smallest-magnitude fraction of the gradient entries",
    "positional": "fraction",
    "parameters": {"fraction": ["float", True, [0.0, True], [1.0, False], []],
                   "scope": ["str", False, None, None, ["layer", "global"]]},
    "example": "prune:0.9",
}


@dataclass(frozen=True)
class Prune(Defense):
    """``prune:P`` / ``prune:P,scope=global``: zero the fraction P in [0, 1) of the
    smallest-magnitude gradient entries.

    scope=layer (default, as DLG's per-layer "prune ratio"): exactly round(P * n) entries of
    each gradient tensor (each parameter: weight and bias separately) of n entries.
    scope=global: exactly round(P * N) entries of all N gradient entries together, ranked by
    magnitude across tensors (large-gradient layers keep more). round is half up.
    Entries already zero count among the smallest, so they are "pruned" first.
    """

    name: ClassVar[str] = "prune"
    positional: ClassVar[str | None] = "fraction"
    fraction: float
    scope: str = "layer"

    def __post_init__(self) -> None:
        object.__setattr__(self, "fraction", check_finite(self.name, "fraction", self.fraction, minimum=0.0,
                                                          maximum=1.0, maximum_inclusive=False))
        if self.scope not in SCOPES:
            raise ConfigError(f"defense prune: scope must be one of {', '.join(SCOPES)}, got {self.scope!r}")

    def transform(self, gradients: dict[str, torch.Tensor],
                  generator: torch.Generator) -> dict[str, torch.Tensor]:
        # contiguous copies: the in-place zeroing below works on flat views of them
        out = {k: g.detach().clone(memory_format=torch.contiguous_format) for k, g in gradients.items()}
        if self.fraction == 0 or not out:
            return out
        if self.scope == "layer":
            for g in out.values():
                flat = g.view(-1)
                k = prune_count(self.fraction, flat.numel())
                if k:
                    flat[_smallest(flat.abs(), k)] = 0
            return out
        # global: rank every entry together, on the first tensor's device, in a common dtype
        tensors = list(out.values())
        device = tensors[0].device
        dtype = tensors[0].dtype
        for t in tensors[1:]:
            dtype = torch.promote_types(dtype, t.dtype)
        abs_all = torch.cat([t.reshape(-1).abs().to(device=device, dtype=dtype) for t in tensors])
        k = prune_count(self.fraction, abs_all.numel())
        if k == 0:
            return out
        keep = torch.ones(abs_all.numel(), dtype=torch.bool, device=device)
        keep[_smallest(abs_all, k)] = False
        for t, mask in zip(tensors, torch.split(keep, [t.numel() for t in tensors]), strict=True):
            t.view(-1)[~mask.to(t.device)] = 0
        return out
