"""The GradInversion paper's image metrics for one run, as plain numbers for ``metrics.json``."""

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
