"""The GradInversion paper's image metrics for one run, as plain numbers for ``metrics.json``.

    fft2d_mean   mean cosine distance of 2-D FFT magnitudes (lower is better)     (Sec. 4)
    rpsnr_mean   mean PSNR after registering each reconstruction to its original  (Sec. 4)
    lpips_mean   mean LPIPS, only with the real AlexNet/VGG weights cached; else None and
                 ``lpips_notice`` says why (never a random backbone)             (Sec. 4)
    iip          Image Identifiability Precision: share of reconstructions whose nearest
                 neighbour among the originals and a pool of real images is their own original
                 (Sec. 4.3, Fig. 8), with ``iip_feature_space`` and ``iip_pool_size``

The run's feature space for IIP is raw pixels (cosine, 32 x 32): it is model-free, so numbers
from runs on different victim models stay comparable; the paper's avgpool features
(``ModelFeatures``) are meaningful only for a trained network and are used by the
``identifiability`` experiment when asked.
"""

from __future__ import annotations

from typing import Any

import torch

from .identifiability import FeatureSpace, PixelFeatures, iip
from .paper import fft2d_distance, lpips_distance, lpips_unavailable_reason, registered_psnr


def _mean(values: torch.Tensor) -> float:
    return float(values.double().mean())


def paper_metrics(paired: torch.Tensor, originals: torch.Tensor, pool: torch.Tensor | None,
                  feature_space: FeatureSpace | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(batch-level numbers, one dict per image) for reconstructions ``paired`` row by row with
    ``originals`` (both [K, C, H, W] in [0, 1]); ``pool`` holds other real images for IIP."""
    space = feature_space or PixelFeatures(32)
    fft = fft2d_distance(paired, originals)
    rpsnr = registered_psnr(paired, originals)
    lp = lpips_distance(paired, originals)
    ident = iip(paired, originals, pool, space)
    summary: dict[str, Any] = {
        "fft2d_mean": _mean(fft), "rpsnr_mean": _mean(rpsnr),
        "lpips_mean": None if lp is None else _mean(lp),
        "iip": ident.precision, "iip_feature_space": ident.feature_space, "iip_pool_size": ident.pool_size,
    }
    if lp is None:
        summary["lpips_notice"] = lpips_unavailable_reason()
    per_image = [{"fft2d": float(fft[k]), "rpsnr": float(rpsnr[k]),
                  "lpips": None if lp is None else float(lp[k]), "identified": ident.hits[k]}
                 for k in range(paired.shape[0])]
    return summary, per_image


__all__ = ["paper_metrics"]
