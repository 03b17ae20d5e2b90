"""The malicious server's imprint block ("Robbing the Fed", Fowl et al., ICLR 2022)."""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from statistics import NormalDist
from typing import Any, Sequence

import torch
from torch import nn

from ..errors import ConfigError
from .spec import ModelSpec

# Declared for the catalog (specs.declarations reads this without torch; server_spec.py parses
# --server imprint[:...] with its parameters, the first of them a bare value's; models/server.py
# builds it with imprint_server).
SERVER_SPEC = {"name": "imprint", "summary": "imprint block before the model: each bin's rows rebuild one image "
               "(Fowl et al., ICLR 2022)", "parameters": ["bins", "mean", "std", "gain"], "integers": ["bins"],
               "example": "imprint:bins=64", "build": "imprint_server"}

# The bins the server sends when --server imprint gives none.
DEFAULT_BINS = 64

# How loud and how visible the block is. linear2's weights all hold ``gain``; linear0's rows are
# the measurement scaled by s = IMPRINT_SHIFT / gain (row s/d, bias -s c_i). The victim sees its
# input plus a shift gain * s * sum_i relu(h - c_i) = IMPRINT_SHIFT * sum_i relu(h - c_i) on every
# entry, whatever the gain: measured over the 20 cifar10-samples photos, ResNet-18 CIFAR stem, 64
# bins, a shift of at most 0.07 in normalised units, logits moved by at most 0.06 where they reach
# 2.1 (the shift grows with the number of bins): the server's model keeps its function. The
# imprint rows' gradients dW_i = gain * (sum over the sample's entries of dL/d out) * x are
# proportional to the gain alone, so the server makes them loud: loud next to a defense's noise
# and next to the float32 rounding of a FedAvg update (the attack's exact ratio does not depend on
# it). A gain of 1e-3 with s = 1 (the first version) lost the images under Gaussian noise of 1e-5
# that iDLG shrugs off; see IMPRINT_GAIN's measurements in tests/attacks/test_imprint.py.
IMPRINT_SHIFT = 1e-3
IMPRINT_GAIN = 1e2

MAX_BINS = 4096
# A bound on the weight entries of one imprint layer (d x bins): 2^27 float32 entries are 512 MB
# per layer; a 224 px image (d = 150528) at 4096 bins would need 2.3 GB per layer.
MAX_IMPRINT_ENTRIES = 2 ** 27

# The server's default prior on the client's brightness, measured on PUBLIC photos that are not
# the client's data: the natural RGB photos scikit-image 0.26.0 and scikit-learn 1.9.1 ship in
# their wheels (skimage.data astronaut, coffee, chelsea, rocket, immunohistochemistry,
# hubble_deep_field, retina; sklearn.datasets.load_sample_images china, flower; the synthetic
# colorwheel and logo left out), each center-cropped to a square and resized to 32x32 RGB with
# PIL's bicubic filter (as benchmarks/robustness.py builds them), pixels in [0, 1]. Per image the
# mean over its pixels and channels; over the 9 images the mean of those and their standard
# deviation (ddof 1). Measured once (0.3821, 0.1648); constants, so no photo is loaded at run time.
PUBLIC_BRIGHTNESS_MEAN = 0.3821
PUBLIC_BRIGHTNESS_STD = 0.1648


def _finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"imprint: {name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ConfigError(f"imprint: {name} must be finite, got {value!r}")
    return v


def _check_bins(bins: Any) -> int:
    if isinstance(bins, bool) or not isinstance(bins, int):
        raise ConfigError(f"imprint: bins must be an integer, got {bins!r}")
    if not 2 <= bins <= MAX_BINS:
        raise ConfigError(f"imprint: bins must be between 2 and {MAX_BINS}, got {bins}")
    return int(bins)


def imprint_thresholds(bins: int, mean: float, std: float) -> torch.Tensor:
    """The N = ``bins`` thresholds c_1 < ... < c_N, [N] float64: the quantiles of N(mean, std^2)
    at i / (N + 1), i = 1..N. Under the prior every one of the N + 1 intervals they cut is
    equally likely to hold a sample's brightness (the paper's bins from a CDF, Sec. 3); a sample
    below c_1 (probability 1 / (N + 1) under the prior) activates no bin and is lost."""
    n = _check_bins(bins)
    m, s = _finite("mean", mean), _finite("std", std)
    if s <= 0:
        raise ConfigError(f"imprint: std must be > 0, got {std!r}")
    dist = NormalDist(m, s)
    return torch.tensor([dist.inv_cdf(i / (n + 1)) for i in range(1, n + 1)], dtype=torch.float64, device="cpu")


def default_brightness_prior(spec: ModelSpec) -> tuple[float, float]:
    """(mean, std) of the per-image mean brightness in the model's normalised units, from the
    public photos' pixel-space constants (PUBLIC_BRIGHTNESS_MEAN / _STD): per channel c,
    ((mu - mean_c) / std_c, sigma / std_c), averaged over the channels (h is the mean over all
    entries of the normalised image, channels included)."""
    c = len(spec.mean)
    mean = sum((PUBLIC_BRIGHTNESS_MEAN - m) / s for m, s in zip(spec.mean, spec.std, strict=True)) / c
    std = sum(PUBLIC_BRIGHTNESS_STD / s for s in spec.std) / c
    return float(mean), float(std)


class ImprintBlock(nn.Module):
    """Fowl et al.'s imprint module (Sec. 3) for inputs of shape ``input_shape`` = (C, H, W).

    ``linear0`` (d -> N): every row is the measurement w = 1/d (the mean over the d = C*H*W
    entries), bias -c_i: bin i is active when the image's mean brightness exceeds c_i.
    ``linear2`` (N -> d): every weight ``gain``, bias 0, so every bin pushes every entry alike and
    dL/d(pre-activation of bin i) is the same scalar per sample for every active bin.

    The output is x + linear2(relu(linear0(x))): a residual connection. The paper's block maps
    back to the input size so that it can sit in front of any architecture, and discusses
    placing and scaling it so that the model keeps its function (the server needs a model that
    still trains and that a client has no reason to distrust). With the identity path and a
    small ``gain`` the victim sees its own input plus a small, per-image constant shift: its
    logits barely change and the block is inconspicuous. The shift changes nothing in what the
    imprint layer leaks (the attack divides it out)."""

    def __init__(self, input_shape: Sequence[int], thresholds: Sequence[float] | torch.Tensor,
                 gain: float = IMPRINT_GAIN):
        super().__init__()
        shape = tuple(int(v) for v in input_shape)
        if len(shape) != 3 or min(shape) < 1:
            raise ConfigError(f"imprint: input_shape must be (C, H, W), got {tuple(input_shape)}")
        # on the CPU even under a meta-device context (an update file's shapes are checked on meta)
        c = torch.as_tensor(thresholds, dtype=torch.float64, device="cpu").flatten()
        n = _check_bins(int(c.numel()))
        if not bool(torch.isfinite(c).all()) or not bool((c[1:] > c[:-1]).all()):
            raise ConfigError("imprint: thresholds must be finite and strictly increasing")
        g = _finite("gain", gain)
        if g <= 0:
            raise ConfigError(f"imprint: gain must be > 0, got {gain!r}")
        d = shape[0] * shape[1] * shape[2]
        if d * n > MAX_IMPRINT_ENTRIES:
            raise ConfigError(f"imprint: {n} bins on {d} input entries need {d * n} weights per layer "
                              f"(at most {MAX_IMPRINT_ENTRIES}); use fewer bins")
        self.input_shape = shape
        self.bins = n
        self.gain = g
        self.linear0 = nn.Linear(d, n)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(n, d)
        scale = IMPRINT_SHIFT / g  # the measurement's scale s: the forward shift stays IMPRINT_SHIFT-small
        weights = (scale / d, scale * float(c.abs().max()), g)
        if not all(math.isfinite(w) and w > 0 and torch.finfo(torch.float32).tiny < w < torch.finfo(torch.float32).max
                   for w in weights):
            raise ConfigError(f"imprint: gain {gain!r} makes the block's weights ({weights[0]:.3g}, {weights[2]:.3g}) "
                              "leave float32's range; use a gain between 1e-6 and 1e6")
        with torch.no_grad():
            self.linear0.weight.fill_(scale / d)
            self.linear0.bias.copy_(-scale * c.to(self.linear0.bias.dtype))
            self.linear2.weight.fill_(g)
            self.linear2.bias.zero_()

    @property
    def thresholds(self) -> torch.Tensor:
        """c_i = -bias_i / s (each row is s times the unit-sum measurement w), [N]."""
        return -self.linear0.bias.detach().clone() / self.linear0.weight.detach()[0].sum()

    def measure(self, x: torch.Tensor) -> torch.Tensor:
        """h(x) = w . x per image, [B]: the mean brightness in normalised units."""
        w = self.linear0.weight[0]
        return x.flatten(1) @ w / w.sum()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(1)
        shift = self.linear2(self.relu(self.linear0(flat)))
        return (flat + shift).view_as(x)


class ImprintedNet(nn.Module):
    """The server's modified model: ``net(imprint(x))``. Parameter names: ``imprint.linear0.*``,
    ``imprint.linear2.*`` and ``net.<the victim's names>``."""

    def __init__(self, imprint: ImprintBlock, net: nn.Module):
        super().__init__()
        self.imprint = imprint
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.imprint(x))


def imprint_model(spec: ModelSpec, *, bins: int, mean: float, std: float, gain: float = IMPRINT_GAIN) -> ModelSpec:
    """The server's imprinted version of ``spec``: ImprintedNet(ImprintBlock with ``bins``
    thresholds from the brightness prior N(mean, std^2) in normalised units, a deep copy of the
    victim). Same name, input shape, classes and normalisation; kwargs record the modification
    as its canonical ``--server`` text (models/server.py) under ``server``. ``spec`` itself
    is left alone. Raises ConfigError on an invalid bin count, prior or gain."""
    thresholds = imprint_thresholds(bins, mean, std)  # validates bins, mean, std
    block = ImprintBlock(spec.input_shape, thresholds, gain)
    victim = copy.deepcopy(spec.module)
    first = next(iter(victim.parameters()), None)
    if first is not None:  # the block lives where the victim's weights do
        block = block.to(device=first.device, dtype=first.dtype)
    kwargs = {**spec.kwargs, "server": f"imprint:bins={int(bins)},mean={float(mean)!r},std={float(std)!r},"
                                        f"gain={float(gain)!r}"}
    return replace(spec, module=ImprintedNet(block, victim), kwargs=kwargs)


def imprint_server(spec: ModelSpec, *, bins: int | None = None, mean: float | None = None, std: float | None = None,
                   gain: float | None = None) -> ModelSpec:
    """``--server imprint[:...]``'s model: imprint_model with each parameter not given at its
    default (DEFAULT_BINS, the public brightness prior, IMPRINT_GAIN)."""
    prior_mean, prior_std = default_brightness_prior(spec)
    return imprint_model(spec, bins=DEFAULT_BINS if bins is None else bins, mean=prior_mean if mean is None else mean,
                         std=prior_std if std is None else std, gain=IMPRINT_GAIN if gain is None else gain)


__all__ = ["DEFAULT_BINS", "IMPRINT_GAIN", "ImprintBlock", "ImprintedNet", "MAX_BINS", "PUBLIC_BRIGHTNESS_MEAN",
           "PUBLIC_BRIGHTNESS_STD", "default_brightness_prior", "imprint_model", "imprint_server", "imprint_thresholds"]
