"""DP-SGD (Abadi et al. 2016) as a client-side defense: per-sample clipping + Gaussian noise."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from ..data.batch import Batch
from ..errors import ConfigError, DataError
from ..fl.client import check_batch_fits, fedsgd, trainable_parameters
from ..fl.update import SharedUpdate
from ..models import ModelSpec
from .base import Defense, Residual, check_finite, entry_noise, record_defense
from .noise import gaussian_like

CLIP_EPS = 1e-6  # Opacus' DPOptimizer: clip factor = C / (norm + 1e-6)
DEFAULT_DELTA = 1e-5


def check_no_batchnorm(model: ModelSpec) -> None:
    """ConfigError for a model with BatchNorm: per-sample gradients (DP-SGD) are undefined under it."""
    bn = [n or "<root>" for n, m in model.module.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if bn:
        raise ConfigError(
            f"defense dpsgd: model {model.name} has BatchNorm layers ({', '.join(bn[:3])}"
            f"{', ...' if len(bn) > 3 else ''}); BN mixes the samples of a batch, so per-sample "
            "clipping bounds nothing. Use a model without BatchNorm (e.g. lenet-dlg) or replace BN "
            "with GroupNorm (opacus.validators.ModuleValidator.fix)")


def per_sample_gradients(model: ModelSpec, batch: Batch, *, chunk_size: int = 32):  # noqa: ANN201
    """Yield (start index, {param name: [k, *param.shape]}) per chunk of the batch: the gradient
    of each sample's own cross-entropy (torch.func vmap over grad of functional_call), the model
    in training mode, parameters as the client received them. Chunks bound the memory."""
    check_batch_fits(model, batch)
    check_no_batchnorm(model)
    module = model.module
    params = {n: p.detach() for n, p in trainable_parameters(module).items()}
    buffers = {n: b.detach() for n, b in module.named_buffers()}
    first = next(iter(params.values()))
    x_all = model.normalize(batch.images.to(device=first.device, dtype=first.dtype))
    y_all = batch.labels.to(first.device)

    def sample_loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = functional_call(module, (p, buffers), (x.unsqueeze(0),))
        return F.cross_entropy(logits, y.unsqueeze(0))

    # randomness="different": dropout, if any, draws per sample from the global RNG
    per_sample = vmap(grad(sample_loss), in_dims=(None, 0, 0), randomness="different")
    was_training = module.training
    module.train()
    try:
        for start in range(0, batch.size, chunk_size):
            sl = slice(start, start + chunk_size)
            yield start, per_sample(params, x_all[sl], y_all[sl])
    finally:
        module.train(was_training)


def dpsgd_gradient(model: ModelSpec, batch: Batch, clip: float, noise_multiplier: float,
                   generator: torch.Generator, *, chunk_size: int = 32) -> dict[str, torch.Tensor]:
    """The DP-SGD gradient of ``batch``: {param name: tensor shaped like the parameter}.

    Per-sample gradients clipped to L2 norm ``clip`` (over all parameters together), summed,
    N(0, (noise_multiplier * clip)^2) added per entry (drawn with ``generator``), divided by the
    batch size K. noise_multiplier = 0 and a clip above every per-sample norm give the plain
    FedSGD mean gradient. Does not modify the model.
    """
    clip = check_finite("dpsgd", "clip", clip, minimum=0.0, minimum_inclusive=False)
    noise_multiplier = check_finite("dpsgd", "noise", noise_multiplier, minimum=0.0)
    if chunk_size < 1:
        raise ConfigError(f"defense dpsgd: chunk_size must be >= 1, got {chunk_size}")
    if batch.size == 0:
        raise DataError("defense dpsgd: the batch is empty")
    summed: dict[str, torch.Tensor] | None = None
    with torch.no_grad():
        for _, grads in per_sample_gradients(model, batch, chunk_size=chunk_size):
            norms = torch.stack([g.reshape(g.shape[0], -1).norm(2, dim=1) for g in grads.values()], dim=1).norm(2, dim=1)
            factor = (clip / (norms + CLIP_EPS)).clamp(max=1.0)
            clipped = {n: torch.einsum("i,i...", factor.to(g.dtype), g) for n, g in grads.items()}
            summed = clipped if summed is None else {n: summed[n] + clipped[n] for n in summed}
    assert summed is not None  # K >= 1, so the loop ran
    std = noise_multiplier * clip
    out: dict[str, torch.Tensor] = {}
    for n, s in summed.items():
        if std > 0:  # Opacus draws nothing for std 0 either (keeps generator streams aligned)
            s = s + gaussian_like(s, std, generator).to(s.dtype)
        out[n] = (s / batch.size).detach()
    return out


def dp_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """Epsilon of ``steps`` DP-SGD steps with Poisson sample rate ``sample_rate`` at ``delta``,
    by Opacus' RDPAccountant (the same as calling ``step`` ``steps`` times). inf for noise 0."""
    noise_multiplier = check_finite("dpsgd", "noise", noise_multiplier, minimum=0.0)
    sample_rate = check_finite("dpsgd", "sample_rate", sample_rate, minimum=0.0, minimum_inclusive=False,
                               maximum=1.0)
    delta = check_finite("dpsgd", "delta", delta, minimum=0.0, minimum_inclusive=False, maximum=1.0,
                         maximum_inclusive=False)
    if isinstance(steps, bool) or int(steps) != steps or steps < 1:
        raise ConfigError(f"defense dpsgd: steps must be an integer >= 1, got {steps!r}")
    if noise_multiplier == 0:
        return math.inf
    from opacus.accountants import RDPAccountant  # slow import: only when asked

    accountant = RDPAccountant()
    accountant.history = [(noise_multiplier, sample_rate, int(steps))]
    return float(accountant.get_epsilon(delta))


# Declared for the catalog (read without torch). "unmodelled": the part of it the noise floor
# cannot model (defenses/floor.py): the per-sample norms it clips are private.
SPEC = {
    "name": "dpsgd", "class": "DPSGD", "summary": "DP-SGD on the client: per-sample clipping + Gaussian noise",
    "parameters": {"clip": ["float", True, [0.0, False], None, []],
                   "noise": ["float", True, [0.0, True], None, []],
                   "delta": ["float", False, [0.0, False], [1.0, False], []],
                   "sample_rate": ["float", False, [0.0, False], [1.0, True], []],
                   "steps": ["int", False, [1.0, True], None, []]},
    "example": "dpsgd:clip=1,noise=1", "unmodelled": "clipping",
}


@dataclass(frozen=True)
class DPSGD(Defense):
    """``dpsgd:clip=C,noise=Z[,delta=D][,sample_rate=Q][,steps=T]``: DP-SGD on the client.

    clip: per-sample L2 bound C > 0; noise: noise multiplier Z >= 0 (std Z*C on the sum).
    delta (default 1e-5), sample_rate (default 1: the whole client batch every round, no
    subsampling amplification) and steps (default 1: this one update) only feed the epsilon
    that :meth:`describe` reports; they do not change the gradient.
    """

    name: ClassVar[str] = "dpsgd"
    client_side: ClassVar[bool] = True
    clip: float
    noise: float
    delta: float = DEFAULT_DELTA
    sample_rate: float = 1.0
    steps: int = 1

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "clip", check_finite(self.name, "clip", self.clip, minimum=0.0, minimum_inclusive=False))
        set_(self, "noise", check_finite(self.name, "noise", self.noise, minimum=0.0))
        set_(self, "delta", check_finite(self.name, "delta", self.delta, minimum=0.0, minimum_inclusive=False,
                                         maximum=1.0, maximum_inclusive=False))
        set_(self, "sample_rate", check_finite(self.name, "sample_rate", self.sample_rate, minimum=0.0,
                                               minimum_inclusive=False, maximum=1.0))
        steps = self.steps
        if isinstance(steps, bool) or not isinstance(steps, (int, float)) or steps != int(steps) or steps < 1:
            raise ConfigError(f"defense dpsgd: steps must be an integer >= 1, got {steps!r}")
        set_(self, "steps", int(steps))

    @property
    def epsilon(self) -> float:
        """Epsilon at ``delta`` for ``steps`` steps at ``sample_rate`` (Opacus RDP accountant)."""
        return dp_epsilon(self.noise, self.sample_rate, self.steps, self.delta)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        eps = self.epsilon
        d["epsilon"] = eps if math.isfinite(eps) else None  # None: no privacy (noise 0); JSON-safe
        d["delta"] = self.delta
        return d

    def residual(self, shared: list[torch.Tensor], client_batch: int) -> Residual:
        # the noise only: N(0, (Z C)^2) on the sum of K clipped per-sample gradients, divided by K.
        # Clipping is not modelled (the attacker cannot see the per-sample norms): when it bites,
        # the truth itself scores above this floor and the verdict errs on "inconclusive".
        std = self.noise * self.clip / max(int(client_batch), 1)
        return entry_noise(sum(t.numel() for t in shared), std ** 2, 3 * std ** 4)

    def apply(self, update: SharedUpdate, generator: torch.Generator) -> SharedUpdate:
        raise ConfigError(
            f"defense {self.spec} needs per-sample gradients, which a finished update does not hold: "
            "apply it while the client computes the gradient (DPSGD.client_update or "
            "gradleak.defenses.client_update), not to a SharedUpdate")

    def transform(self, gradients: dict[str, torch.Tensor],
                  generator: torch.Generator) -> dict[str, torch.Tensor]:
        return self.apply(None, generator)  # type: ignore[arg-type]  # always raises

    def gradient(self, model: ModelSpec, batch: Batch, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The DP-SGD gradient of ``batch`` with this defense's clip and noise."""
        return dpsgd_gradient(model, batch, self.clip, self.noise, generator)

    def client_update(self, model: ModelSpec, batch: Batch, generator: torch.Generator) -> SharedUpdate:
        """A FedSGD SharedUpdate whose gradients are DP-SGD's, with this spec in meta.defenses.

        Global weights and metadata are FedSGD's. Note: meta.loss is the exact batch loss,
        which DP-SGD does not privatise (the guarantee covers the gradients only).
        """
        check_no_batchnorm(model)
        base = fedsgd(model, batch)
        grads = self.gradient(model, batch, generator)
        return base.replace(gradients=grads, meta=record_defense(base.meta, self.spec))
