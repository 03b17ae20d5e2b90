"""What an attacker is given of a victim model: the network and its public facts (``ModelSpec``),
below the registry that builds it and the servers that rewrite it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import ModelMismatchError


@dataclass
class ModelSpec:
    """A victim model plus the public facts an attacker is entitled to.

    module:      the network; input [B, C, H, W] *normalised*, output logits [B, num_classes].
    input_shape: (C, H, W) of one image.
    mean, std:   per-channel normalisation: model_input = (pixels - mean) / std, pixels in [0, 1].
    kwargs:      what `build_model` needs to rebuild the same architecture (name + kwargs).
    """

    name: str
    module: nn.Module
    input_shape: tuple[int, int, int]
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = torch.tensor(self.mean, dtype=like.dtype, device=like.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=like.dtype, device=like.device).view(1, -1, 1, 1)
        return mean, std

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        """[..., C, H, W] in [0, 1] -> model input space."""
        mean, std = self._stats(pixels)
        return (pixels - mean) / std

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        """Model input space -> pixel space (not clamped)."""
        mean, std = self._stats(x)
        return x * std + mean

    @property
    def classifier(self) -> nn.Linear:
        """The final fully connected layer (the one label restoration reads)."""
        return find_classifier(self.module, self.num_classes)[1]

    @property
    def classifier_name(self) -> str:
        return find_classifier(self.module, self.num_classes)[0]


def find_classifier(module: nn.Module, num_classes: int) -> tuple[str, nn.Linear]:
    """The last nn.Linear whose out_features is the number of classes."""
    found: tuple[str, nn.Linear] | None = None
    for name, m in module.named_modules():
        if isinstance(m, nn.Linear) and m.out_features == num_classes:
            found = (name, m)
    if found is None:
        raise ModelMismatchError(
            f"model has no final nn.Linear with {num_classes} outputs (needed to restore labels)"
        )
    return found


__all__ = ["ModelSpec", "find_classifier"]
