"""Batch labels with repeats: estimate how many times each class occurs (beyond GradInversion)."""

from __future__ import annotations

import torch

from ..errors import GradleakError


def classifier_signal(gradients: dict[str, torch.Tensor], classifier_name: str) -> tuple[torch.Tensor, str]:
    """The per-class signal the count rules read, [N], and which tensor it came from.

    The FC bias gradient when the layer has a bias (exactly (1/K) sum_k (p - y)); otherwise the
    weight gradient summed over the feature dimension (GradInversion Eq. 7's s_n).
    """
    prefix = f"{classifier_name}." if classifier_name else ""
    if f"{prefix}bias" in gradients:
        return gradients[f"{prefix}bias"].detach().double().flatten(), "bias"
    if f"{prefix}weight" in gradients:
        return gradients[f"{prefix}weight"].detach().double().sum(dim=1), "weight-sum"
    raise GradleakError(f"the update holds no gradient for the classifier {classifier_name!r}")


def _present(signal: torch.Tensor, k: int, presence: torch.Tensor | None = None) -> torch.Tensor:
    """Classes judged present, the most negative first, between 1 and K of them.

    ``presence`` [N] is GradInversion's Eq. 8 score min_m dW_{m,n}: with non-negative features
    o_k (ReLU/sigmoid before the classifier) an absent class has p_{k,n} o_k >= 0 in every entry,
    so a negative minimum proves presence; this detects a present class even where the model
    already gives it more probability than its share c_n / K (bias gradient >= 0). Without it
    (or when it marks more than K classes, e.g. features that can be negative) the sign of the
    signal decides.
    """
    if presence is not None:
        presence = presence.double()
        n_neg = int((presence < 0).sum())
        if 1 <= n_neg <= k:
            return torch.argsort(presence)[:n_neg]
    order = torch.argsort(signal)
    n_neg = int((signal < 0).sum())
    return order[: max(1, min(k, n_neg))]


def _round_to_total(estimate: torch.Tensor, k: int) -> torch.Tensor:
    """Largest-remainder rounding of ``estimate`` [P] (> 0) to integers >= 1 summing to k."""
    counts = estimate.floor().clamp_min(1).long()
    while int(counts.sum()) < k:
        counts[int(torch.argmax(estimate - counts))] += 1
    while int(counts.sum()) > k:
        residual = torch.where(counts > 1, estimate - counts, torch.full_like(estimate, float("inf")))
        counts[int(torch.argmin(residual))] -= 1
    return counts


def count_labels(signal: torch.Tensor, k: int, presence: torch.Tensor | None = None) -> torch.Tensor:
    """Label multiset [K] (sorted) from the per-class signal [N] by rule (*) of the module doc;
    ``presence`` [N]: optional Eq. 8 scores that decide which classes occur (see _present)."""
    signal = signal.double()
    present = _present(signal, k, presence)
    mask = torch.zeros_like(signal, dtype=torch.bool)
    mask[present] = True
    absent = signal[~mask]
    background = float(absent.mean()) if absent.numel() else 0.0
    excess = (background - signal[present]).clamp_min(1e-12)
    estimate = k * excess / excess.sum()
    counts = _round_to_total(estimate, k)
    return torch.repeat_interleave(present, counts).sort().values


def llg_counts(signal: torch.Tensor, k: int, presence: torch.Tensor | None = None) -> torch.Tensor:
    """LLG-style multiset [K] (Wainakh et al. 2022; breaching's "bias-corrected"), sorted."""
    s = signal.double().clone()
    present = _present(s, k, presence)
    labels = present.tolist()
    impact = float(s[s < 0].sum()) / k if bool((s < 0).any()) else float(s.min())
    s[present] -= impact
    while len(labels) < k:
        i = int(torch.argmin(s))
        labels.append(i)
        s[i] -= impact
    return torch.tensor(sorted(labels), dtype=torch.long)
