"""Recognisability measures that pixel noise does not fool, per image, against the truth."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from gradleak.errors import GradleakError
from gradleak.metrics.identifiability import PixelFeatures, iip
from gradleak.metrics.image import ssim

#: Structure is compared on images area-averaged over blocks of this many pixels a side (32 px
#: -> 8 px): independent pixel noise of standard deviation s is left at s / 4.
COARSE_FACTOR = 4
#: ... but never below this side (SSIM's window needs a few pixels).
COARSE_MIN_SIDE = 8
#: A decoy whose pixels correlate with an original at least this much is that photo itself (a
#: public copy of the client's image): dropped from the pool, as IIP drops exact duplicates.
NEAR_DUPLICATE = 0.98


def coarse(images: torch.Tensor) -> torch.Tensor:
    """[K, C, H, W] -> [K, C, h, w]: area-averaged by COARSE_FACTOR (h >= COARSE_MIN_SIDE)."""
    h, w = int(images.shape[-2]), int(images.shape[-1])
    side = max(COARSE_MIN_SIDE, min(h, w) // COARSE_FACTOR)
    if side >= min(h, w):
        return images
    return F.adaptive_avg_pool2d(images.to(torch.float64), (side * h // min(h, w), side * w // min(h, w)))


def coarse_ssim(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """SSIM of the coarse (block-averaged) images, [K] float64; x, y: [K, C, H, W] in [0, 1]."""
    return ssim(coarse(x), coarse(y))


def _public_arrays() -> list[np.ndarray]:
    """The public photos shipped by the project's dependencies, as HxWx3 uint8 arrays."""
    from sklearn.datasets import load_sample_images

    photos = list(load_sample_images().images)   # china, flower (scikit-learn: a core dependency)
    try:
        import skimage.data as sd
    except ImportError:   # the test extra's photos; the pool then holds the others
        return photos
    for name in ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry", "hubble_deep_field",
                 "retina", "colorwheel", "logo", "camera", "moon", "coins", "clock", "page", "text", "cell",
                 "brick", "grass", "gravel", "horse"):
        try:
            img = np.asarray(getattr(sd, name)())
        except (AttributeError, OSError, ValueError):
            continue
        if img.dtype != np.uint8:
            img = (np.clip(img.astype(np.float64) / max(float(img.max()), 1e-9), 0, 1) * 255).astype(np.uint8)
        photos.append(img[..., :3] if img.ndim == 3 else np.stack([img] * 3, axis=-1))
    return photos


@lru_cache(maxsize=8)
def public_decoys(size: int, channels: int) -> torch.Tensor:
    """[P, channels, size, size] float32 in [0, 1]: public photos no client owns, the IIP pool's
    decoys and the public prior: foolbox's sample photos (CIFAR-10/100, ImageNet, MNIST,
    Fashion-MNIST; 100 when installed), scikit-learn's and scikit-image's photos, each centre-
    cropped to a square as the data sources load images. Read offline; nothing is downloaded."""
    from PIL import Image

    from gradleak.data.images import load_image_file, pil_to_tensor
    from gradleak.data.sources import foolbox_data_dir

    out = [pil_to_tensor(Image.fromarray(np.ascontiguousarray(a)), size, channels) for a in _public_arrays()]
    try:
        files: list[Path] = sorted(foolbox_data_dir().iterdir())
    except (GradleakError, OSError):
        files = []
    for f in files:
        if f.suffix.lower() in (".png", ".jpg", ".jpeg"):
            try:
                out.append(load_image_file(f, size, channels))
            except GradleakError:
                continue
    return torch.stack(out)


def prior_image(decoys: torch.Tensor) -> torch.Tensor:
    """[1, C, H, W]: the public prior image, the mean of the public photos (reads nothing private)."""
    return decoys.to(torch.float32).mean(dim=0, keepdim=True)


def apart_from(pool: torch.Tensor, originals: torch.Tensor) -> torch.Tensor:
    """The pool images that are not (near-)copies of an original (pixel correlation < NEAR_DUPLICATE)."""
    if pool.shape[0] == 0 or pool.shape[1:] != originals.shape[1:]:
        return pool
    p = pool.to(torch.float64).flatten(1)
    o = originals.to(torch.float64).flatten(1)
    p = p - p.mean(1, keepdim=True)
    o = o - o.mean(1, keepdim=True)
    corr = (p / p.norm(dim=1, keepdim=True).clamp_min(1e-12)) @ (o / o.norm(dim=1, keepdim=True).clamp_min(1e-12)).T
    return pool[(corr < NEAR_DUPLICATE).all(dim=1)]


def candidate_pool(source: torch.Tensor | None, truth: torch.Tensor) -> torch.Tensor:
    """IIP's candidates besides the originals: the client's source photos (``source``
    [P, C, H, W] or None) followed by the public decoys that are not copies of an original."""
    _, c, h, w = truth.shape
    parts = [source.detach().cpu().float()] if source is not None and source.numel() else []
    if h == w:
        parts.append(apart_from(public_decoys(int(h), int(c)), truth.detach().cpu().float()))
    parts = [p for p in parts if p.shape[1:] == truth.shape[1:]]
    return torch.cat(parts) if parts else torch.zeros(0, *truth.shape[1:])


def recognisability(paired: torch.Tensor, truth: torch.Tensor, zero: torch.Tensor,
                    pool: torch.Tensor | None) -> list[dict[str, Any]]:
    """One row per image of what says whether the answer shows it (outcome.recognisable_row decides).

    paired: [K, C, H, W] answers paired with ``truth`` [K, C, H, W] (in [0, 1]); zero: [1, C, H, W]
    the zero image; pool: :func:`candidate_pool`. Rows hold ``coarse_ssim`` (the answer's),
    ``zero_coarse_ssim`` and ``prior_coarse_ssim`` (the zero and the public prior image against
    the same truth), ``identified`` and ``identified_among`` (IIP's hit and its candidates: the
    originals and the pool, pixel features as paper_metrics). ``prior_coarse_ssim`` is the better of
    two leak-free priors: the public photos' mean and the source's own mean (its other photos)."""
    paired, truth = paired.detach().cpu().float(), truth.detach().cpu().float()
    _, c, h, w = truth.shape
    decoys = public_decoys(int(h), int(c)) if h == w else torch.zeros(0, *truth.shape[1:])
    prior = prior_image(decoys) if decoys.shape[0] else zero.cpu().float()
    ident = iip(paired, truth, pool, PixelFeatures(32))
    own = coarse_ssim(paired, truth)
    flat = coarse_ssim(zero.cpu().float().expand_as(truth), truth)
    mean = coarse_ssim(prior.expand_as(truth), truth)
    # The source's own mean image is a leak-free answer too (an attacker knows the data's
    # distribution): on Fashion-MNIST it is a centred blob that the natural photos' mean is not,
    # and a noise answer brighter in the middle would beat the latter alone (DLG under Gaussian
    # 0.1 at 5.2 dB: coarse SSIM 0.66 against 0.25 for the decoys' mean).
    source = source_part(pool, truth)
    own_mean = coarse_ssim(prior_image(source).expand_as(truth), truth) if source.shape[0] else flat
    return [{"coarse_ssim": float(own[k]), "zero_coarse_ssim": float(flat[k]),
             "prior_coarse_ssim": max(float(mean[k]), float(own_mean[k])),
             "public_prior_coarse_ssim": float(mean[k]), "source_prior_coarse_ssim": float(own_mean[k]),
             "identified": ident.hits[k], "identified_among": ident.pool_size} for k in range(truth.shape[0])]


def source_part(pool: torch.Tensor | None, truth: torch.Tensor) -> torch.Tensor:
    """The client's source photos in ``pool`` (:func:`candidate_pool` puts them before the public
    decoys), apart from copies of the client's own photos: the images the source's mean is taken over."""
    if pool is None or pool.shape[0] == 0:
        return torch.zeros(0, *truth.shape[1:])
    _, c, h, w = truth.shape
    decoys = apart_from(public_decoys(int(h), int(c)), truth) if h == w else pool[:0]
    source = pool[: pool.shape[0] - decoys.shape[0]]
    return apart_from(source.detach().cpu().float(), truth) if source.shape[0] else source


__all__ = ["COARSE_FACTOR", "NEAR_DUPLICATE", "apart_from", "candidate_pool", "coarse", "coarse_ssim", "prior_image", "public_decoys",
           "recognisability", "source_part"]
