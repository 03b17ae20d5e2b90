"""The malicious server's trap weights ("When the Curious Abandon Honesty", Boenisch et al.,
EuroS&P 2023, Sec. 4)."""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import replace
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from ..errors import ConfigError
from .spec import ModelSpec

# Declared for the catalog (specs.declarations reads this without torch; server_spec.py parses
# --server trap[:...] with its parameters, the first of them a bare value's, refusing shrink and
# rate together; models/server.py builds it with trap_server).
SERVER_SPEC = {"name": "trap", "summary": "trap weights in a fully connected first layer: rows firing for one "
               "image rebuild it (Boenisch et al., EuroS&P 2023)", "parameters": ["rows", "shrink", "rate", "seed",
                                                                                  "gain"],
               "integers": ["rows", "seed"], "exclusive": [["shrink", "rate", "the shrink is calibrated for the rate"]],
               "example": "trap:rows=1000", "build": "trap_server"}

# Rows the server sends by default (at most MAX_TRAP_ENTRIES // d: 891 at 224 px RGB). Measured on
# 5 batches of 8 from each of cifar10-samples and cifar100-samples at the default rate, 32 px: with
# 1000 rows 5-8 images of 8 had two or more rows of their own (the attack's rule), with 2000 all 8
# in all 10 batches (the photos' rows fire together: their activation sets overlap more than
# independent draws would).
DEFAULT_ROWS = 2000
# The target firing rate the server calibrates its shrink for when none is given: 1 / 8 of the
# crops fire a row, so that for a client batch of 8 a row fires for exactly one of them with
# probability 8 (1/8) (7/8)^7 = 0.39 (the paper tunes its scaling factor to the batch size
# likewise); measured recovery for batch 8-64 in benchmarks/trap_batch.json.
DEFAULT_RATE = 0.125
MAX_ROWS = 65536
# A bound on one trap layer's weights (d x rows); see imprint.MAX_IMPRINT_ENTRIES.
MAX_TRAP_ENTRIES = 2 ** 27
# The forward shift the block adds to the victim's input, as in the imprint block (IMPRINT_SHIFT):
# linear0 holds TRAP_SHIFT / gain times unit-norm rows, linear2 gain times N(0, 1 / rows) entries.
TRAP_SHIFT = 1e-3
TRAP_GAIN = 1e2
DEFAULT_SEED = 0
MAX_SEED = 2 ** 32 - 2   # the rows are drawn with seed, linear2 with seed + 1 (torch takes up to 2^64 - 1)

# Calibration crops: CALIBRATION_CROPS random square crops of each of scikit-learn's two sample
# photos, sides uniform in [CROP_MIN, 1] of the photo's shorter side, drawn with this seed.
CALIBRATION_CROPS = 64
CROP_MIN = 0.25
CALIBRATION_SEED = 1234
CALIBRATION_ROWS = 256


def _finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"trap: {name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ConfigError(f"trap: {name} must be finite, got {value!r}")
    return v


def default_rows(input_shape: Sequence[int]) -> int:
    """DEFAULT_ROWS, or fewer where the layer would exceed MAX_TRAP_ENTRIES weights."""
    d = 1
    for v in input_shape:
        d *= int(v)
    return max(1, min(DEFAULT_ROWS, MAX_TRAP_ENTRIES // d))


def check_rows(rows: Any) -> int:
    if isinstance(rows, bool) or not isinstance(rows, int):
        raise ConfigError(f"trap: rows must be an integer, got {rows!r}")
    if not 1 <= rows <= MAX_ROWS:
        raise ConfigError(f"trap: rows must be between 1 and {MAX_ROWS}, got {rows}")
    return int(rows)


def check_shrink(shrink: Any) -> float:
    a = _finite("shrink", shrink)
    if not 0.0 <= a < 1.0:
        raise ConfigError(f"trap: shrink must be in [0, 1), got {shrink!r}")
    return a


def trap_rows(rows: int, d: int, shrink: float, seed: int) -> torch.Tensor:
    """The server's trap rows in pixel space, [rows, d] float64: N(0, 1) entries drawn with
    ``seed``, the positive entries of every row scaled by (1 - shrink) (Boenisch et al. Sec. 4)."""
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    w = torch.randn(check_rows(rows), int(d), generator=g, dtype=torch.float64, device="cpu")
    return torch.where(w > 0, w * (1.0 - check_shrink(shrink)), w)


@functools.lru_cache(maxsize=8)
def public_crops(channels: int, size: int) -> torch.Tensor:
    """The server's public calibration images, [2 * CALIBRATION_CROPS, channels, size, size] in
    [0, 1]: random square crops of scikit-learn's two sample photos (shipped in its wheel),
    resized with PIL's bicubic filter; grey by PIL's "L" conversion when ``channels`` is 1."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(CALIBRATION_SEED)
    out = []
    for photo in load_sample_images().images:
        h, w = photo.shape[:2]
        side = min(h, w)
        for _ in range(CALIBRATION_CROPS):
            s = int(rng.integers(int(CROP_MIN * side), side + 1))
            top, left = int(rng.integers(0, h - s + 1)), int(rng.integers(0, w - s + 1))
            img = Image.fromarray(photo[top:top + s, left:left + s]).resize((size, size), Image.BICUBIC)
            if channels == 1:
                img = img.convert("L")
            a = np.asarray(img, dtype=np.float32) / 255.0
            out.append(torch.tensor(a[None] if a.ndim == 2 else a.transpose(2, 0, 1), device="cpu"))
    return torch.stack(out)


def firing_rate(rows: torch.Tensor, images: torch.Tensor) -> float:
    """The fraction of (row, image) pairs with w . x > 0 (pixel space, rows [n, d])."""
    return float((images.flatten(1).double() @ rows.T > 0).double().mean())


def shapes_only() -> bool:
    """Whether tensors are being made on torch's meta device (fl/files.py checks a file's tensor
    shapes on a meta model before anything is built): no value is needed then, and none is
    computed, so a file's record (rows, rate) cannot make the check allocate or calibrate."""
    return torch.get_default_device().type == "meta"


def calibrate_shrink(input_shape: Sequence[int], rate: float = DEFAULT_RATE) -> float:
    """The shrink whose trap rows fire at ``rate`` on the public crops (bisection to 1e-4 on
    CALIBRATION_ROWS rows drawn with CALIBRATION_SEED). The rate falls as the shrink grows
    (a larger shrink pushes every product further below 0). Under the meta device
    (:func:`shapes_only`) the rate is checked and 0 returned: the shrink changes no shape."""
    r = _finite("rate", rate)
    if not 0.0 < r < 0.5:
        raise ConfigError(f"trap: rate must be in (0, 0.5), got {rate!r}")
    c, h, w = (int(v) for v in input_shape)
    if h != w:
        raise ConfigError(f"trap: calibration needs square images, got {h}x{w}")
    if shapes_only():
        return 0.0
    images = public_crops(c, h)
    g = torch.Generator(device="cpu").manual_seed(CALIBRATION_SEED)
    base = torch.randn(CALIBRATION_ROWS, c * h * w, generator=g, dtype=torch.float64, device="cpu")
    lo, hi = 0.0, 0.999
    while hi - lo > 1e-4:
        mid = (lo + hi) / 2
        if firing_rate(torch.where(base > 0, base * (1 - mid), base), images) > r:
            lo = mid
        else:
            hi = mid
    return round((lo + hi) / 2, 4)


class TrapBlock(nn.Module):
    """The trap layer for inputs of shape ``input_shape`` = (C, H, W) in front of a victim network
    whose input is normalised with per-channel ``mean`` / ``std``: out = x + linear2(ReLU(linear0(x))).

    ``linear0`` (d -> rows): the pixel-space trap rows w_j (:func:`trap_rows`), unit-normalised,
    folded into the normalised input and scaled by s = TRAP_SHIFT / gain: weight s (w_j * std),
    bias s (w_j . mean); so the row fires exactly when w_j . x_pix > 0. ``linear2`` (rows -> d):
    gain times N(0, 1 / rows) entries (seed + 1), bias 0. Under the meta device (:func:`shapes_only`)
    only the shapes are made: the rows are not drawn."""

    def __init__(self, input_shape: Sequence[int], mean: Sequence[float], std: Sequence[float], *,
                 rows: int = DEFAULT_ROWS, shrink: float, seed: int = DEFAULT_SEED, gain: float = TRAP_GAIN):
        super().__init__()
        shape = tuple(int(v) for v in input_shape)
        if len(shape) != 3 or min(shape) < 1:
            raise ConfigError(f"trap: input_shape must be (C, H, W), got {tuple(input_shape)}")
        n = check_rows(rows)
        a = check_shrink(shrink)
        g = _finite("gain", gain)
        if not 1e-6 <= g <= 1e6:
            raise ConfigError(f"trap: gain must be between 1e-6 and 1e6, got {gain!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
            raise ConfigError(f"trap: seed must be an integer in 0..{MAX_SEED}, got {seed!r}")
        d = shape[0] * shape[1] * shape[2]
        if d * n > MAX_TRAP_ENTRIES:
            raise ConfigError(f"trap: {n} rows on {d} input entries need {d * n} weights per layer "
                              f"(at most {MAX_TRAP_ENTRIES}); use fewer rows")
        self.input_shape, self.rows, self.shrink, self.seed, self.gain = shape, n, a, int(seed), g
        self.linear0 = nn.Linear(d, n)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(n, d)
        if len(std) != shape[0] or len(mean) != shape[0]:
            raise ConfigError(f"trap: {len(std)} normalisation channels for {shape[0]}-channel images")
        if self.linear0.weight.is_meta:  # shapes only (shapes_only): the d x rows draw is skipped
            return
        hw = shape[1] * shape[2]
        # drawn on the CPU whatever the default device (the same numbers everywhere)
        std_flat = torch.tensor([float(v) for v in std], dtype=torch.float64, device="cpu").repeat_interleave(hw)
        mean_flat = torch.tensor([float(v) for v in mean], dtype=torch.float64, device="cpu").repeat_interleave(hw)
        w = trap_rows(n, d, a, seed)
        w = w / w.norm(dim=1, keepdim=True)
        s = TRAP_SHIFT / g
        gen = torch.Generator(device="cpu").manual_seed(int(seed) + 1)
        with torch.no_grad():
            self.linear0.weight.copy_((s * w * std_flat).to(self.linear0.weight.dtype))
            self.linear0.bias.copy_((s * (w @ mean_flat)).to(self.linear0.bias.dtype))
            self.linear2.weight.copy_((g / math.sqrt(n)) * torch.randn(d, n, generator=gen, dtype=torch.float64,
                                                                             device="cpu"))
            self.linear2.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(1)
        return (flat + self.linear2(self.relu(self.linear0(flat)))).view_as(x)


class TrappedNet(nn.Module):
    """The server's modified model: ``net(trap(x))``. Parameter names: ``trap.linear0.*``,
    ``trap.linear2.*`` and ``net.<the victim's names>``."""

    def __init__(self, trap: TrapBlock, net: nn.Module):
        super().__init__()
        self.trap = trap
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.trap(x))


def trap_model(spec: ModelSpec, *, rows: int = DEFAULT_ROWS, shrink: float, seed: int = DEFAULT_SEED,
               gain: float = TRAP_GAIN) -> ModelSpec:
    """The server's trapped version of ``spec``: TrappedNet(TrapBlock, a deep copy of the victim).
    Same name, input shape, classes and normalisation; kwargs record the modification as its
    canonical ``--server`` text under ``server`` (every value resolved, the shrink included, so
    the attacker and a file's reader rebuild the same architecture without calibrating).
    ``spec`` itself is left alone. ConfigError on invalid rows, shrink, seed or gain."""
    block = TrapBlock(spec.input_shape, spec.mean, spec.std, rows=rows, shrink=shrink, seed=seed, gain=gain)
    victim = copy.deepcopy(spec.module)
    first = next(iter(victim.parameters()), None)
    if first is not None:  # the block lives where the victim's weights do
        block = block.to(device=first.device, dtype=first.dtype)
    kwargs = {**spec.kwargs, "server": f"trap:rows={block.rows},shrink={block.shrink!r},seed={block.seed},"
                                        f"gain={block.gain!r}"}
    return replace(spec, module=TrappedNet(block, victim), kwargs=kwargs)


def trap_server(spec: ModelSpec, *, rows: int | None = None, shrink: float | None = None, rate: float | None = None,
                seed: int | None = None, gain: float | None = None) -> ModelSpec:
    """``--server trap[:...]``'s model: trap_model with each parameter not given at its default
    (default_rows, the shrink calibrated for ``rate`` or DEFAULT_RATE, DEFAULT_SEED, TRAP_GAIN)."""
    if shrink is None:
        shrink = calibrate_shrink(spec.input_shape, DEFAULT_RATE if rate is None else rate)
    return trap_model(spec, rows=default_rows(spec.input_shape) if rows is None else rows, shrink=shrink,
                      seed=DEFAULT_SEED if seed is None else seed, gain=TRAP_GAIN if gain is None else gain)


__all__ = ["DEFAULT_RATE", "DEFAULT_ROWS", "TRAP_GAIN", "TrapBlock", "TrappedNet", "calibrate_shrink",
           "default_rows", "firing_rate", "public_crops", "shapes_only", "trap_model", "trap_rows", "trap_server"]
