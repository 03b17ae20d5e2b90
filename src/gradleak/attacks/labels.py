"""Label restoration from the classifier's gradient (no optimisation needed)."""

from __future__ import annotations

import torch

from ..errors import GradleakError


def fc_weight_gradient(gradients: dict[str, torch.Tensor], classifier_name: str) -> torch.Tensor:
    """The FC layer's weight gradient, [N classes, M features] (torch's Linear layout)."""
    key = f"{classifier_name}.weight" if classifier_name else "weight"
    if key not in gradients:
        raise GradleakError(f"the update holds no gradient for the classifier weight {key!r}")
    return gradients[key]


def idlg_label(fc_grad: torch.Tensor) -> int:
    """iDLG (Zhao et al. 2020), one sample: with non-negative FC inputs, the gradient row of the
    true class is the only one with a negative sum (Eq. 6 of GradInversion with K = 1)."""
    return int(fc_grad.sum(dim=1).argmin())


def sum_rule_labels(fc_grad: torch.Tensor, k: int) -> torch.Tensor:
    """iDLG's sum rule extended to batches (GradInversion Eq. 7): s_n = sum_m dW_{m,n};
    the K most negative entries of s are the labels (assumes no repeats). Returns [K]."""
    s = fc_grad.sum(dim=1)
    return torch.argsort(s)[:k].sort().values


def gradinversion_labels(fc_grad: torch.Tensor, k: int) -> torch.Tensor:
    """GradInversion Eq. 8: argsort(min_m dW_{m,n})[:K] (assumes no repeats). Returns [K]."""
    s = fc_grad.min(dim=1).values
    return torch.argsort(s)[:k].sort().values
