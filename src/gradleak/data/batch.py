"""The client's private batch. Only the client and the evaluation ever hold one."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Batch:
    """A client's private training batch (ground truth).

    images: [K, C, H, W] float32 in [0, 1] (pixel space, before model normalisation).
    labels: [K] int64 class indices.
    names:  K identifiers (file names or dataset indices), for reports.
    """

    images: torch.Tensor
    labels: torch.Tensor
    names: tuple[str, ...] = ()
    source: str = ""
    class_names: tuple[str, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if self.images.ndim != 4:
            raise ValueError(f"images must be [K,C,H,W], got shape {tuple(self.images.shape)}")
        if self.labels.ndim != 1 or self.labels.shape[0] != self.images.shape[0]:
            raise ValueError("labels must be [K] with K = images.shape[0]")

    @property
    def size(self) -> int:
        return int(self.images.shape[0])
