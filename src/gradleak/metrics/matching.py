"""Pair reconstructed slots with ground-truth images."""

from __future__ import annotations

import torch
from scipy.optimize import linear_sum_assignment

from gradleak.errors import ModelMismatchError


def pairwise_mse(recon: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Cost matrix ``cost[k, j] = mse(truth[k], recon[j])``.

    recon, truth: [K, ...] (any trailing shape, identical for both).  Returns [K, K] float64.
    Built one truth row at a time so memory stays O(K * pixels), not O(K^2 * pixels).
    """
    r = recon.detach().to("cpu", torch.float64).flatten(1)
    t = truth.detach().to("cpu", torch.float64).flatten(1)
    cost = torch.empty(t.shape[0], r.shape[0], dtype=torch.float64)
    for k in range(t.shape[0]):
        cost[k] = (r - t[k]).pow(2).mean(dim=1)
    return cost


def match(recon: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Optimal one-to-one pairing of reconstruction slots with ground-truth images.

    recon, truth: [K, ...] tensors of the same shape (typically [K, C, H, W] in [0, 1]).
    Returns ``perm``, a [K] int64 tensor (a permutation of 0..K-1) such that
    ``recon[perm[k]]`` is paired with ``truth[k]``; the pairing minimises the summed MSE
    (Hungarian algorithm, ``scipy.optimize.linear_sum_assignment``).
    """
    if recon.shape != truth.shape:
        raise ModelMismatchError(
            f"cannot match reconstruction of shape {tuple(recon.shape)} "
            f"with ground truth of shape {tuple(truth.shape)}"
        )
    if recon.ndim == 0:
        raise ModelMismatchError("match expects a batch [K, ...], got a scalar")
    if recon.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long)
    cost = pairwise_mse(recon, truth)
    # A diverged attack may leave NaN/Inf pixels; the solver rejects non-finite costs, and such
    # a slot should simply be the worst possible partner.
    cost = torch.nan_to_num(cost, nan=1e30, posinf=1e30, neginf=1e30)
    rows, cols = linear_sum_assignment(cost.numpy())
    # Rows are the truth images and come back sorted 0..K-1, so cols is already perm.
    perm = torch.empty(len(rows), dtype=torch.long)
    perm[torch.as_tensor(rows, dtype=torch.long)] = torch.as_tensor(cols, dtype=torch.long)
    return perm


def pair_by_label(restored: torch.Tensor, true: torch.Tensor) -> torch.Tensor:
    """The attacker's pairing (GradInversion Fig. 4: "labels rearranged in ascending order to match
    ground truth after label restoration"): slots sorted by restored label and truths sorted by true
    label, both ascending and stable (equal labels keep batch order), paired in that order.

    restored, true: [K] integer labels. Returns ``perm`` [K] int64 (a permutation of 0..K-1) with
    ``recon[perm[k]]`` paired with ``truth[k]``, as :func:`match` returns. Uses no pixels: a wrong
    restored label pairs a slot with another class's photo, as it would for the attacker.
    """
    r = restored.detach().reshape(-1).to("cpu", torch.long)
    t = true.detach().reshape(-1).to("cpu", torch.long)
    if r.numel() != t.numel():
        raise ModelMismatchError(f"cannot pair {r.numel()} restored labels with {t.numel()} true labels")
    slots = torch.sort(r, stable=True).indices
    truths = torch.sort(t, stable=True).indices
    perm = torch.empty_like(slots)
    perm[truths] = slots
    return perm
