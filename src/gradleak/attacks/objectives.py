"""Gradient-matching objectives: distances between the dummy and the shared gradients.

All take lists of tensors in the same (parameter) order and return a scalar.
"""

from __future__ import annotations

from typing import Sequence

import torch

Tensors = Sequence[torch.Tensor]


def squared_l2(dummy: Tensors, target: Tensors) -> torch.Tensor:
    """DLG (Zhu et al. 2019, Algorithm 1 / Eq. 4): sum over layers of ||dW' - dW||_2^2."""
    diffs = torch._foreach_sub(list(dummy), list(target))
    return torch.stack(torch._foreach_norm(diffs, 2)).pow(2).sum()


def layer_l2(dummy: Tensors, target: Tensors, weights: Sequence[float] | None = None) -> torch.Tensor:
    """GradInversion Eq. 3 (without alpha_G): sum over layers l of ||dW'_l - dW_l||_2 (not squared)."""
    diffs = torch._foreach_sub(list(dummy), list(target))
    norms = torch.stack(torch._foreach_norm(diffs, 2))
    if weights is not None:
        norms = norms * torch.as_tensor(weights, dtype=norms.dtype, device=norms.device)
    return norms.sum()


def cosine(dummy: Tensors, target: Tensors) -> torch.Tensor:
    """Inverting Gradients (Geiping et al. 2020, Eq. 4): 1 - <dW', dW> / (||dW'|| ||dW||), with the
    inner product and norms taken over all layers together."""
    dot = torch.stack([(a * b).sum() for a, b in zip(dummy, target)]).sum()
    n1 = torch.stack(torch._foreach_norm(list(dummy), 2)).pow(2).sum()
    n2 = torch.stack(torch._foreach_norm(list(target), 2)).pow(2).sum()
    return 1 - dot / (n1.sqrt() * n2.sqrt()).clamp_min(1e-30)


OBJECTIVES = {"l2sq": squared_l2, "l2": layer_l2, "cosine": cosine}
