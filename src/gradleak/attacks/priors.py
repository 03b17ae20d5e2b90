"""Image priors: GradInversion's fidelity regularisation (Eq. 9-10), Inverting Gradients' TV and
DeepInversion's class term."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..fl.update import SharedUpdate

BN_MODES = ("exact", "approx", "none")
BNTargets = list[tuple[torch.Tensor, torch.Tensor]]


def _diffs(x: torch.Tensor) -> list[torch.Tensor]:
    return [x[..., :, :-1] - x[..., :, 1:],             # horizontal
            x[..., :-1, :] - x[..., 1:, :],             # vertical
            x[..., 1:, :-1] - x[..., :-1, 1:],          # diagonal /
            x[..., :-1, :-1] - x[..., 1:, 1:]]          # diagonal \


def _batch_norm2(t: torch.Tensor) -> torch.Tensor:
    """L2 norm over the last four dims (K, C, H, W) -> t.shape[:-4]."""
    return t.flatten(-4).norm(dim=-1)


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """R_TV of Eq. 9 (DeepInversion's L2 TV): sum of the L2 norms of the 4 difference images.
    x [..., K, C, H, W] -> [...]. Zero for any constant image."""
    return sum(_batch_norm2(d) for d in _diffs(x))  # type: ignore[return-value]


def l2_norm(x: torch.Tensor) -> torch.Tensor:
    """R_l2 of Eq. 9: ||x||_2 over the whole batch. x [..., K, C, H, W] -> [...]."""
    return _batch_norm2(x)


def tv_l1_mean(x: torch.Tensor) -> torch.Tensor:
    """Inverting Gradients' TV (Geiping et al. 2020, Eq. 4's TV term, their code): mean |dx| +
    mean |dy|. x [..., K, C, H, W] -> [...]."""
    dx = (x[..., :, :-1] - x[..., :, 1:]).abs().flatten(-4).mean(dim=-1)
    dy = (x[..., :-1, :] - x[..., 1:, :]).abs().flatten(-4).mean(dim=-1)
    return dx + dy


def bn_targets(update: SharedUpdate, bn_names: list[str], mode: str, *, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> BNTargets | None:
    """Per-BN-layer (mean [C], var [C]) targets of Eq. 10 in ``bn_names`` order, or None.

    exact:  the client's batch statistics (``update.bn_statistics``); ConfigError if the client
            did not share them. approx: the global model's running statistics. none: None.
    A model without BatchNorm layers has no R_BN: None for every mode.
    """
    if mode not in BN_MODES:
        raise ConfigError(f"bn: unknown mode {mode!r}; known: {', '.join(BN_MODES)}")
    if mode == "none" or not bn_names:
        return None
    out: BNTargets = []
    if mode == "exact":
        if not update.bn_statistics:
            raise ConfigError("bn: mode 'exact' needs the client's BatchNorm batch statistics, but the "
                              "client did not share BN statistics with this update; use --bn approx or none")
        missing = [n for n in bn_names if n not in update.bn_statistics]
        if missing:
            raise ConfigError(f"bn: the shared BN statistics lack layer {missing[0]!r} (mode 'exact')")
        for n in bn_names:
            mean, var = update.bn_statistics[n]
            out.append((mean.detach().to(device, dtype), var.detach().to(device, dtype)))
        return out
    for n in bn_names:  # approx
        keys = (f"{n}.running_mean", f"{n}.running_var")
        if any(k not in update.global_weights for k in keys):
            raise ConfigError(f"bn: mode 'approx' needs running statistics, but layer {n!r} has none "
                              "in the global weights; use --bn exact or none")
        out.append(tuple(update.global_weights[k].detach().to(device, dtype) for k in keys))  # type: ignore[arg-type]
    return out


# What an approx BN prior pulls toward when the global model was never trained: BatchNorm's
# initial running statistics (mean 0, variance 1), not any data's. Measured (benchmarks/presets.py,
# ResNet-18 CIFAR stem, untrained, batch 4): dropping the BN prior there gained 2.7 dB.
INITIAL_STATISTICS_NOTE = ("the BN prior (--bn approx) matches the model's running statistics, which are still "
                           "BatchNorm's initial mean 0 / variance 1 (an untrained model): it pulls toward those, "
                           "not toward real data; --bn none (or exact, when the client shares its batch "
                           "statistics) may rebuild more")


def initial_running_statistics(targets: BNTargets | None) -> bool:
    """Whether every layer's approx target is BatchNorm's initial (mean 0, variance 1)."""
    return bool(targets) and all(bool((m == 0).all()) and bool((v == 1).all()) for m, v in targets)


def bn_prior(stats: list[tuple[torch.Tensor, torch.Tensor]], targets: BNTargets) -> torch.Tensor:
    """R_BN, GradInversion Eq. 10: sum_l ||mu_l - BN_l(mean)||_2 + ||sigma^2_l - BN_l(var)||_2.

    stats: per layer (mean [..., C], var [..., C]) of the dummy batch (e.g. [G, C] from
    ``DummyGradient.batched``); targets: per layer ([C], [C]). Returns [...].
    """
    total = None
    for (mu, var), (t_mu, t_var) in zip(stats, targets, strict=True):
        term = (mu - t_mu).norm(dim=-1) + (var - t_var).norm(dim=-1)
        total = term if total is None else total + term
    assert total is not None
    return total


class ClassTerm:
    """DeepInversion's class term (Yin et al., CVPR 2020, Eq. 1's L(x^, y)): the cross-entropy of
    the labels on the received model's output in eval mode (its running statistics), per
    candidate. It is what ties a synthesis to its classes when no gradient is matched."""

    def __init__(self, module: torch.nn.Module, update: SharedUpdate, labels: torch.Tensor, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        self.module = copy.deepcopy(module).to(device=device, dtype=dtype)
        self.module.load_state_dict({n: w.detach().to(device) for n, w in update.global_weights.items()},
                                    strict=False)
        self.module.eval()
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.labels = labels

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """images [G, K, C, H, W] (the model's normalised space) -> [G]."""
        return torch.stack([F.cross_entropy(self.module(x), self.labels) for x in images])
