"""Per-image similarity metrics between reconstructions and ground truth."""

from __future__ import annotations

import warnings

import torch
from pytorch_msssim import ssim as _msssim_ssim

from gradleak.errors import ModelMismatchError

#: PSNR reported for a perfect (or numerically perfect) reconstruction, in dB.
PSNR_CAP_DB = 100.0

#: SSIM Gaussian window of Wang et al. (2004); shrunk for images smaller than this.
SSIM_WIN_SIZE = 11


def _pair_f64(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Check that ``x`` and ``y`` are both [K, C, H, W] and return float64 copies.

    Float64 costs nothing at these sizes and keeps MSE of near-identical images (1e-10 and
    below) from rounding to zero or going negative in SSIM's variance terms.
    """
    if x.ndim != 4 or y.ndim != 4:
        raise ModelMismatchError(
            f"metrics expect [K,C,H,W] images, got shapes {tuple(x.shape)} and {tuple(y.shape)}"
        )
    if x.shape != y.shape:
        raise ModelMismatchError(
            f"cannot compare images of different shapes {tuple(x.shape)} and {tuple(y.shape)}"
        )
    # MPS has no float64; the metrics are cheap enough to run on the CPU instead.
    if x.device.type == "mps":
        x = x.cpu()
    if y.device != x.device:
        y = y.to(x.device)
    return x.to(torch.float64), y.to(torch.float64)


def mse(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean squared error per image.

    x, y: [K, C, H, W] in [0, 1].  Returns [K] float64, mean over C*H*W pixels.
    """
    x, y = _pair_f64(x, y)
    return (x - y).pow(2).flatten(1).mean(dim=1)


def psnr(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Peak signal-to-noise ratio per image, ``10 * log10(1 / mse)`` in dB (data range 1).

    x, y: [K, C, H, W] in [0, 1].  Returns [K] float64.

    Identical images have ``mse == 0`` and an infinite PSNR; it is capped at
    :data:`PSNR_CAP_DB` (100 dB) so means and JSON stay finite. The cap applies to any value
    above 100 dB (mse < 1e-10), which is already far below 8-bit quantisation noise.
    """
    m = mse(x, y)
    # log10(1/0) = inf, which the clamp turns into the cap; no special case or warning needed.
    return (10.0 * torch.log10(1.0 / m)).clamp(max=PSNR_CAP_DB)


def ssim_window(height: int, width: int) -> int:
    """The SSIM Gaussian window size used for an H x W image.

    11 (the standard) when the image is at least 11 px on both sides, else the largest odd
    number <= min(H, W), and never below 3. Images smaller than 3 px are rejected by :func:`ssim`.
    """
    side = min(height, width)
    win = min(SSIM_WIN_SIZE, side if side % 2 == 1 else side - 1)
    return max(win, 3)


def ssim(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Structural similarity per image (``pytorch_msssim.ssim``, Gaussian window, sigma 1.5).

    x, y: [K, C, H, W] in [0, 1].  Returns [K] float64 in [-1, 1], averaged over channels.

    The window is 11 px, shrunk via :func:`ssim_window` for tiny images (e.g. 7 px for 8 x 8),
    because ``pytorch_msssim`` filters without padding and would otherwise skip the smoothing
    (with a warning) on sides shorter than the window.
    """
    x, y = _pair_f64(x, y)
    height, width = int(x.shape[-2]), int(x.shape[-1])
    if min(height, width) < 3:
        # pytorch_msssim also squeezes size-1 spatial dims, which would break its shape checks.
        raise ModelMismatchError(f"SSIM needs images of at least 3x3 pixels, got {height}x{width}")
    if x.shape[0] == 0:
        return torch.zeros(0, dtype=torch.float64, device=x.device)
    win = ssim_window(height, width)
    k, c = int(x.shape[0]), int(x.shape[1])
    # Fold channels into the batch: pytorch_msssim averages SSIM per channel anyway, so the
    # result is identical, but single-channel convolutions avoid the slow grouped float64
    # conv path on CPU (about 3x faster for RGB).
    xf = x.reshape(k * c, 1, height, width)
    yf = y.reshape(k * c, 1, height, width)
    with warnings.catch_warnings():
        # Defensive: the window always fits, so no "Skipping Gaussian Smoothing" is expected.
        warnings.simplefilter("ignore", UserWarning)
        per_channel = _msssim_ssim(xf, yf, data_range=1.0, size_average=False, win_size=win)
    return per_channel.reshape(k, c).mean(dim=1).to(torch.float64)
