"""Batch labels with repeats: estimate how many times each class occurs (beyond GradInversion)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch

from ..errors import GradleakError

if TYPE_CHECKING:
    from ..fl.update import SharedUpdate
    from ..models import ModelSpec


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


def round_counts(raw: torch.Tensor, k: int) -> torch.Tensor:
    """Real-valued counts [N] -> integers >= 0 summing to k (negative estimates are 0; the
    largest remainders take the units left, the smallest give back the units too many)."""
    raw = raw.double().clamp_min(0)
    counts = raw.floor().long()
    while int(counts.sum()) < k:
        counts[int(torch.argmax(raw - counts))] += 1
    while int(counts.sum()) > k:
        residual = torch.where(counts > 0, raw - counts, torch.full_like(raw, float("inf")))
        counts[int(torch.argmin(residual))] -= 1
    return counts


def step_weights(optimizer: Any, steps: int) -> torch.Tensor:
    """a_j [S]: how much step j's gradient moves W_S - W_0 under SGD (-lr * sum_j a_j g_j): 1
    for plain SGD; with momentum mu (torch's b_t = mu b_{t-1} + g_t, W_t = W_{t-1} - lr b_t)
    a_j = sum_{t=j..S} mu^(t-j); with Nesterov (W_t = W_{t-1} - lr (g_t + mu b_t)) 1 + mu times that."""
    j = torch.arange(steps, dtype=torch.float64)
    mu = float(optimizer.momentum)
    if mu == 0:
        return torch.ones(steps, dtype=torch.float64)
    tail = (1 - mu ** (steps - j)) / (1 - mu)
    return 1 + mu * tail if optimizer.nesterov else tail


def fedavg_counts(update: SharedUpdate, model: ModelSpec, k: int, *, samples: int = 64,
                  seed: int = 0) -> torch.Tensor:
    """The label multiset [K] (sorted) of one FedAvg SGD client: Geng et al. 2021's count rule,
    its parameters estimated at every local step (Dimitrov et al. 2022's FedAvg label restoration).

    Geng et al., per step j on the mean cross-entropy: sum_m g_j[n, m] ~= O_j (p_j,n - c_n / K),
    p_j the mean softmax and O_j the mean sum of the classifier's inputs over dummy inputs, at the
    step's unknown weights, which Dimitrov et al. interpolate linearly between W_0 and W_S. With
    W_S - W_0 = -lr * sum_j a_j (g_j + wd * W_{j-1}) (step_weights), summing over the steps gives
    c_n = K (sum_j a_j O_j p_j,n + wd sum_j a_j sum_m W_j[n, m] - D_n) / sum_j a_j O_j, with
    D_n = -sum_m (W_S - W_0)[n, m] / lr; rounded to K (round_counts). Every epoch covers the K
    samples once, so these are also each epoch's counts. ``samples`` dummy inputs N(0, I) in the
    model's input space, drawn from ``seed``."""
    from ..fl.threats import ThreatModel

    threat = ThreatModel.from_record(update.meta.threat)
    o = threat.optimizer
    if threat.name != "fedavg" or o.name != "sgd":
        raise GradleakError("per-step label counts apply to one FedAvg client trained with SGD (its update is "
                            "linear in the step gradients), not to this update")
    prefix = f"{model.classifier_name}." if model.classifier_name else ""
    key = f"{prefix}weight"
    if key not in update.gradients:
        raise GradleakError(f"the update holds no update of the classifier weight {key!r}")
    module = copy.deepcopy(model.module).train()
    w0 = {n: update.global_weights[n].detach().to(torch.float64) for n in update.gradients}
    ws = {n: w0[n] + update.gradients[n].detach().to(torch.float64) for n in update.gradients}
    buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
    module.double()
    classifier = module.get_submodule(model.classifier_name) if model.classifier_name else module
    g = torch.Generator().manual_seed(int(seed))
    x = torch.randn((samples, *model.input_shape), generator=g, dtype=torch.float64)
    inputs: list[torch.Tensor] = []
    hook = classifier.register_forward_hook(lambda _m, i, _o: inputs.append(i[0].detach()))
    try:
        stats = []
        with torch.no_grad():
            for params in (w0, ws):
                b = {n: v.clone().double() if v.is_floating_point() else v.clone() for n, v in buffers.items()}
                p = torch.func.functional_call(module, (params, b), (x,)).softmax(-1).mean(0)   # p [N]
                stats.append((p, float(inputs.pop().flatten(1).sum(1).mean())))                  # O: mean sum_m o_m
    finally:
        hook.remove()
    s = threat.local_steps
    c = torch.arange(s, dtype=torch.float64) / s          # step j's weights: W_0 + c_j (W_S - W_0) (Dimitrov et al.)
    (p0, o0), (ps, os_) = stats
    p = (1 - c)[:, None] * p0 + c[:, None] * ps           # [S, N]
    feat = (1 - c) * o0 + c * os_                          # [S]
    a = step_weights(o, s)
    rows0, rows_s = w0[key].sum(1), ws[key].sum(1)         # sum_m W[n, m] at W_0 and W_S
    decay = o.weight_decay * (a[:, None] * ((1 - c)[:, None] * rows0 + c[:, None] * rows_s)).sum(0)
    d = -(update.gradients[key].detach().double().sum(1)) / o.lr
    raw = k * ((a * feat)[:, None] * p).sum(0) / (a * feat).sum() + k * (decay - d) / (a * feat).sum()
    counts = round_counts(raw, k)
    return torch.repeat_interleave(torch.arange(len(counts)), counts).sort().values
