"""The image-distance metrics of the GradInversion paper (Yin et al., CVPR 2021, Sec. 4)."""

from __future__ import annotations

import importlib.util
import math
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from gradleak import registration
from gradleak.errors import ModelMismatchError
from gradleak.metrics.image import psnr as _psnr

__all__ = [
    "LPIPS_BACKBONE_FILES",
    "REGISTRATION_MODELS",
    "fft2d_distance",
    "lpips_available",
    "lpips_distance",
    "lpips_unavailable_reason",
    "metric_schedule",
    "metric_transform",
    "register",
    "registered_psnr",
]


def _pair(recon: torch.Tensor, truth: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if recon.ndim != 4 or truth.ndim != 4:
        raise ModelMismatchError(
            f"metrics expect [K,C,H,W] images, got shapes {tuple(recon.shape)} and {tuple(truth.shape)}")
    if recon.shape != truth.shape:
        raise ModelMismatchError(
            f"cannot compare images of different shapes {tuple(recon.shape)} and {tuple(truth.shape)}")
    # A diverged attack may leave NaN/Inf pixels: treat them as black/white, as evaluate() does.
    recon = torch.nan_to_num(recon.detach(), nan=0.0, posinf=1.0, neginf=0.0)
    return recon, truth.detach()


# --------------------------------------------------------------------------- (i) FFT2D


def fft2d_distance(recon: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Cosine distance ``1 - cos(|F(recon)|, |F(truth)|)`` of the 2-D FFT magnitude spectra.

    recon, truth: [K, C, H, W] in [0, 1].  Returns [K] float64 in [0, 1] (magnitudes are
    non-negative, so the cosine is in [0, 1]); 0 means identical magnitude spectra.

    Per image, ``torch.fft.fft2`` is taken over (H, W) of every channel, the plain magnitudes
    (no fftshift, no log: a cosine over all frequencies does not depend on their order, and
    the log would change the weighting) are flattened over channels and frequencies, and the
    two vectors compared by cosine similarity. A circular shift leaves magnitudes unchanged,
    so small translations barely move the score: that is the point of the metric
    ("to account for pixel-wise mismatch"). Note that the DC term (the image mean, times
    H*W) usually dominates a natural image's spectrum, so values are small for any two
    photos of similar brightness; compare values between methods, not against an absolute
    scale. Two all-black images have distance 0; all-black against anything else, 1.
    """
    recon, truth = _pair(recon, truth)
    a = torch.fft.fft2(recon.to("cpu", torch.float64)).abs().flatten(1)
    b = torch.fft.fft2(truth.to("cpu", torch.float64)).abs().flatten(1)
    na, nb = a.norm(dim=1), b.norm(dim=1)
    cos = (a * b).sum(dim=1) / (na * nb).clamp_min(1e-300)
    both_zero = (na == 0) & (nb == 0)
    cos = torch.where(both_zero, torch.ones_like(cos), cos)
    return (1.0 - cos).clamp(0.0, 1.0)


# --------------------------------------------------------------------------- (ii) RPSNR

#: Geometric models :func:`register` fits (see :mod:`gradleak.registration`).
REGISTRATION_MODELS: tuple[str, ...] = registration.MODELS

# Bounds on the similarity parameters (tanh-squashed): registration should undo a
# misalignment, not turn an unrelated reconstruction into the original by zooming into a patch.
_MAX_SHIFT = 0.25  # a quarter of the image side
_MAX_ANGLE = math.radians(30.0)
_MAX_LOG_SCALE = math.log(1.25)
_SCHEDULE_SIDE = 32  # lr sized so that a step moves about as many pixels at every pyramid level
_FULL_FIT_SIDE = 64  # pyramid levels above this side only refine


def metric_transform(model: str = "similarity") -> registration.Transform:
    """The transform RPSNR fits: bounded, see :func:`register` (ConfigError for an unknown model)."""
    return registration.Transform(model, shift=_MAX_SHIFT, angle=_MAX_ANGLE, log_scale=_MAX_LOG_SCALE, bounded=True)


def metric_schedule(iterations: int = 40, lr: float = 0.05, levels: int | None = None) -> registration.Schedule:
    """How RPSNR fits it: coarse to fine, pixel-sized steps decaying to a tenth within a level."""
    return registration.Schedule(steps=int(iterations), lr=float(lr), levels=levels, lr_end=0.1,
                                 lr_side=_SCHEDULE_SIDE, refine_above=_FULL_FIT_SIDE)


def register(recon: torch.Tensor, truth: torch.Tensor, *, model: str = "similarity",
             iterations: int = 40, lr: float = 0.05, levels: int | None = None) -> torch.Tensor:
    """Align every reconstruction to its original; returns the warped reconstructions [K, C, H, W].

    The registration of GradInversion's post-registration PSNR (Sec. 4), run by
    :func:`gradleak.registration.fit` (the same batched fit Eq. 12's group consistency uses):
    a coarse-to-fine Adam fit of one geometric transform per image (all K at once, on the
    images' device, float32), minimising the MSE between the warped reconstruction and the
    original; a fit that does not lower an image's MSE leaves it unwarped (identity).

    model:      "translation", "similarity" (rotation, isotropic scale, shift; default) or
                "homography" (8 free parameters; most flexible, most able to flatter a poor
                reconstruction). Rotation is bounded to +-30 degrees, scale to [0.8, 1.25],
                shift to a quarter of the side.
    iterations: Adam steps per pyramid level up to 64 px (coarsest first); finer levels get a
                sixth of that (at least 5) to refine.
    lr:         Adam's lr at a 32 px level (scaled by 32/side, at most 2x, so that a step is about
                the same number of pixels at every level), decaying linearly to a tenth of it
                within each level: the fit ends well below a pixel at every resolution.
    levels:     pyramid levels; default: halve while the shorter side stays >= 16 px (max 4).
    """
    transform = metric_transform(model)
    recon, truth = _pair(recon, truth)
    src = recon.to(torch.float32)
    dst = truth.to(src.device, torch.float32)
    if src.shape[0] == 0:
        return src.clone()
    params = registration.fit(src, dst, transform, metric_schedule(iterations, lr, levels))
    with torch.no_grad():
        return registration.warp(src, params, transform).to(recon.dtype)


def registered_psnr(recon: torch.Tensor, truth: torch.Tensor, *, model: str = "similarity",
                    iterations: int = 40) -> torch.Tensor:
    """Post-registration PSNR (RPSNR) per image, in dB (capped at 100 like :func:`psnr`).

    recon, truth: [K, C, H, W] in [0, 1], paired row by row.  Returns [K] float64.
    Each reconstruction is aligned to its original by :func:`register` (batched), then
    ``PSNR(warped, original)`` is taken. Per image the better of the registered and the
    unregistered PSNR is returned (registration that does not help falls back to the
    identity), so ``registered_psnr >= psnr`` always holds.

    Expect a floor effect: bilinear resampling at a sub-pixel offset averages neighbouring
    pixels, which lowers the error of a noisy or unrelated reconstruction by itself (uniform
    noise against a photo: about +2 dB at 32-224 px). Compare RPSNR with RPSNR, not with PSNR.
    A reconstruction that is a shifted/rotated copy gains much more (5 degrees plus a 3 px
    shift at 32 px: PSNR about 15 dB, RPSNR about 25 dB).
    """
    recon, truth = _pair(recon, truth)
    plain = _psnr(recon, truth).cpu()
    if recon.shape[0] == 0:
        return plain
    warped = register(recon, truth, model=model, iterations=iterations)
    reg = _psnr(warped, truth).cpu()
    reg = torch.nan_to_num(reg, nan=-math.inf)
    return torch.maximum(plain, reg)


# --------------------------------------------------------------------------- (iii) LPIPS

#: Backbone checkpoints LPIPS needs, looked for in ``torch.hub.get_dir()/checkpoints``.
LPIPS_BACKBONE_FILES: dict[str, str] = {"alex": "alexnet-owt-7be5be79.pth", "vgg": "vgg16-397923af.pth"}

_LPIPS_CACHE: dict[str, Any] = {}
_LPIPS_MIN_SIDE = 32


def _hub_checkpoint(net: str) -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints" / LPIPS_BACKBONE_FILES[net]


def _lpips_status() -> tuple[str | None, str]:
    """(net to use or None, reason when None)."""
    if importlib.util.find_spec("lpips") is None:
        return None, ("LPIPS not computed: the 'lpips' package is not installed "
                      "(pip install lpips; it also needs the AlexNet/VGG ImageNet weights in the torch hub cache)")
    for net in ("alex", "vgg"):
        if _hub_checkpoint(net).is_file():
            return net, ""
    wanted = " or ".join(str(_hub_checkpoint(n)) for n in ("alex", "vgg"))
    return None, (f"LPIPS not computed: its backbone weights are not cached ({wanted} missing); "
                  "gradleak never downloads them and never uses a random backbone")


def lpips_available() -> bool:
    """True when the lpips package and a real AlexNet/VGG backbone checkpoint are on disk."""
    return _lpips_status()[0] is not None


def lpips_unavailable_reason() -> str:
    """One-line notice saying why :func:`lpips_distance` returns None ('' when it would not)."""
    return _lpips_status()[1]


def _build_lpips(net: str) -> Any:
    """lpips.LPIPS with its shipped linear heads and the cached torchvision backbone weights.

    ``lpips.LPIPS(pnet_rand=True)`` is used only so that the package does not try to download
    the backbone; every backbone parameter is then overwritten from the cached torchvision
    checkpoint (loaded with ``weights_only=True``), and the copy is verified tensor by tensor.
    Any mismatch raises, so a random backbone can never be scored.
    """
    import lpips  # type: ignore[import-not-found]
    import torchvision

    with warnings.catch_warnings():  # torchvision's "pretrained is deprecated" from lpips' call
        warnings.simplefilter("ignore", UserWarning)
        metric = lpips.LPIPS(net=net, pretrained=True, pnet_rand=True, pnet_tune=False, verbose=False)
    tv = torchvision.models.alexnet(weights=None) if net == "alex" else torchvision.models.vgg16(weights=None)
    state = torch.load(_hub_checkpoint(net), map_location="cpu", weights_only=True)
    tv.load_state_dict(state, strict=True)
    features = tv.features
    copied = 0
    for slice_module in metric.net.children():
        for name, child in slice_module.named_children():
            source = features[int(name)]
            child.load_state_dict(source.state_dict(), strict=True)
            for p_dst, p_src in zip(child.parameters(), source.parameters(), strict=True):
                if not torch.equal(p_dst, p_src):
                    raise RuntimeError(f"LPIPS backbone layer {name} was not loaded")
                copied += 1
    n_backbone = sum(1 for _ in metric.net.parameters())
    if copied != n_backbone or copied == 0:
        raise RuntimeError(f"LPIPS backbone: loaded {copied} of {n_backbone} parameter tensors")
    metric.eval()
    for p in metric.parameters():
        p.requires_grad_(False)
    return metric


def lpips_distance(recon: torch.Tensor, truth: torch.Tensor, *, batch_size: int = 16) -> torch.Tensor | None:
    """LPIPS (Zhang et al. 2018, v0.1 linear heads) per image, or None when unavailable.

    recon, truth: [K, C, H, W] in [0, 1] (grey images are replicated to RGB; images under
    32 px are bilinearly upsampled to 32 px, the smallest size AlexNet's feature stack accepts).
    Returns [K] float64 (lower is more similar), or ``None`` when the lpips package or the
    cached AlexNet (preferred) / VGG-16 backbone checkpoint is missing; then
    :func:`lpips_unavailable_reason` says why. Nothing is downloaded.
    """
    recon, truth = _pair(recon, truth)
    net, _reason = _lpips_status()
    if net is None:
        return None
    if net not in _LPIPS_CACHE:
        _LPIPS_CACHE[net] = _build_lpips(net)
    metric = _LPIPS_CACHE[net]
    device = recon.device
    metric = metric.to(device)
    a = recon.to(torch.float32).clamp(0, 1)
    b = truth.to(device, torch.float32).clamp(0, 1)
    if a.shape[1] == 1:
        a, b = a.expand(-1, 3, -1, -1), b.expand(-1, 3, -1, -1)
    if min(a.shape[-2:]) < _LPIPS_MIN_SIDE:  # AlexNet's stride-4 stem + pools need >= 32 px
        size = [max(_LPIPS_MIN_SIDE, int(d)) for d in a.shape[-2:]]
        a = F.interpolate(a, size=size, mode="bilinear", align_corners=False)
        b = F.interpolate(b, size=size, mode="bilinear", align_corners=False)
    out = []
    with torch.no_grad():
        for i in range(0, a.shape[0], batch_size):
            out.append(metric(a[i:i + batch_size], b[i:i + batch_size], normalize=True).reshape(-1))
    if not out:
        return torch.zeros(0, dtype=torch.float64)
    return torch.cat(out).to("cpu", torch.float64)
