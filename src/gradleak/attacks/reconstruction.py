"""What an attack returns. It never contains ground truth."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Reconstruction:
    """The attacker's answer for one shared update.

    images:      [K, C, H, W] float32 in [0, 1] (pixel space), the final answer per slot.
    labels:      [K] int64, the labels the attack restored (or its argmax soft labels).
    candidates:  optional [G, K, C, H, W] in [0, 1]: every seed's candidate (GradInversion).
    history:     one dict per logged iteration, at least {"iteration": int, "loss": float}.
    label_method: how ``labels`` were obtained ("idlg", "gradinversion", "soft", ...).
    extra:       attack-specific numbers for metrics.json (final gradient distance, restarts, the
                 verdict's evidence: see verdict.py). What settings ran is the typed attack config
                 (configs.py), which the pipeline records in config.json and metrics.json.
    alternatives: (attack, answer) of the other attacks ``auto`` ran on the same update (auto.py),
                 which the pipeline scores too: the verdict is the worst case over them.
    """

    images: torch.Tensor
    labels: torch.Tensor
    candidates: torch.Tensor | None = None
    history: list[dict[str, float]] = field(default_factory=list)
    iterations: int = 0
    wall_seconds: float = 0.0
    label_method: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    alternatives: list[tuple[str, "Reconstruction"]] = field(default_factory=list, repr=False)

    @property
    def size(self) -> int:
        return int(self.images.shape[0])
