"""Image registration: one batched fit of a geometric transform per image pair, for GradInversion's
registered group consistency (Eq. 12) and its post-registration PSNR."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gradleak.errors import ConfigError
from gradleak.optim import Adam

__all__ = ["MODELS", "Schedule", "Transform", "auto_levels", "fit", "matrices", "mse", "n_params", "warp"]

#: Transform families :func:`fit` knows.
MODELS: tuple[str, ...] = ("translation", "similarity", "homography")


@dataclass(frozen=True)
class Transform:
    """A transform family and the meaning of its raw parameters.

    translation / similarity: 4 raw parameters (tx, ty, angle, log-scale). Their values are
    ``raw * unit`` (``bounded=False``) or ``tanh(raw) * unit`` (``bounded=True``: the units are
    then the largest values reachable): ``shift`` in fractions of the image side (tx of W, ty
    of H), ``angle`` in radians, ``log_scale`` in natural-log units. "translation" keeps angle
    and scale at 0 (their units are taken as 0, so their raw values never move).
    homography: 8 raw parameters added to the identity 3x3 matrix (bottom-right entry fixed)
    in centred normalised coordinates (u = (x - cx) / (W/2), v = (y - cy) / (H/2)); the units
    and ``bounded`` do not apply.
    """

    model: str = "similarity"
    shift: float = 1.0 / 16
    angle: float = 0.25
    log_scale: float = 0.25
    bounded: bool = False

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ConfigError(f"registration model must be one of {', '.join(MODELS)}, got {self.model!r}")


@dataclass(frozen=True)
class Schedule:
    """How the transforms are fitted.

    steps:   Adam steps per pyramid level (see ``refine_above``).
    lr:      Adam's learning rate (on the raw parameters).
    levels:  Gaussian-pyramid levels, coarsest fitted first (1: the images only);
             None: :func:`auto_levels`.
    lr_end:  within a level the lr decays linearly from its start to ``lr_end`` times it
             (1.0: constant).
    lr_side: if set, a level of shorter side ``s`` starts at ``lr * min(2, lr_side / s)``:
             Adam moves a parameter by about lr per step whatever its gradient, so this keeps the
             step a fixed size in pixels at every resolution.
    refine_above: if set, levels whose shorter side exceeds it run only ``max(5, steps // 6)``
             steps (they refine what coarser levels found; a step there costs (side/64)^2 more).
    """

    steps: int = 40
    lr: float = 0.05
    levels: int | None = 1
    lr_end: float = 1.0
    lr_side: int | None = None
    refine_above: int | None = None


def n_params(transform: Transform) -> int:
    """Raw parameters per image: 8 for a homography, else 4."""
    return 8 if transform.model == "homography" else 4


def auto_levels(height: int, width: int) -> int:
    """Pyramid levels: halve while the shorter side stays >= 16 px, at most 4 levels."""
    levels, side = 1, min(height, width)
    while side // 2 >= 16 and levels < 4:
        side //= 2
        levels += 1
    return levels


def _similarity(params: torch.Tensor, height: int, width: int, transform: Transform) -> torch.Tensor:
    """[B, 4] raw (tx, ty, angle, log-scale) -> [B, 2, 3] source->destination pixel matrices,
    rotating and scaling about the image centre."""
    fixed = 1.0 if transform.model == "similarity" else 0.0
    units = torch.tensor((transform.shift, transform.shift, transform.angle * fixed, transform.log_scale * fixed),
                         dtype=params.dtype, device=params.device)
    raw = params.tanh() if transform.bounded else params
    t = raw * units * torch.tensor([width, height, 1.0, 1.0], dtype=params.dtype, device=params.device)
    tx, ty, angle, log_s = t.unbind(dim=-1)
    s = log_s.exp()
    cos, sin = s * angle.cos(), s * angle.sin()
    cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
    row0 = torch.stack([cos, -sin, tx + cx - cos * cx + sin * cy], dim=-1)
    row1 = torch.stack([sin, cos, ty + cy - sin * cx - cos * cy], dim=-1)
    return torch.stack([row0, row1], dim=-2)


def _homography(params: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[B, 8] raw -> [B, 3, 3] source->destination pixel homographies: I + p in centred
    normalised coordinates, conjugated to pixels (C^-1 (I + p) C)."""
    b = params.shape[0]
    flat = torch.cat([params, torch.zeros(b, 1, dtype=params.dtype, device=params.device)], dim=1)
    h_norm = torch.eye(3, dtype=params.dtype, device=params.device) + flat.view(b, 3, 3)
    cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
    to_norm = torch.tensor([[2.0 / width, 0.0, -2.0 * cx / width], [0.0, 2.0 / height, -2.0 * cy / height],
                            [0.0, 0.0, 1.0]], dtype=params.dtype, device=params.device)
    to_pix = torch.tensor([[width / 2.0, 0.0, cx], [0.0, height / 2.0, cy], [0.0, 0.0, 1.0]],
                          dtype=params.dtype, device=params.device)
    return to_pix @ h_norm @ to_norm


def matrices(params: torch.Tensor, height: int, width: int, transform: Transform) -> torch.Tensor:
    """Raw parameters [B, n_params] -> source->destination pixel matrices for H x W images:
    [B, 2, 3] (translation, similarity) or [B, 3, 3] (homography)."""
    if transform.model == "homography":
        return _homography(params, height, width)
    return _similarity(params, height, width, transform)


def warp(images: torch.Tensor, params: torch.Tensor, transform: Transform) -> torch.Tensor:
    """images [B, C, H, W] warped by their transforms (raw parameters [B, n_params]); bilinear,
    border padding, differentiable in both (kornia's warp_affine / warp_perspective)."""
    from kornia.geometry.transform import warp_affine, warp_perspective

    h, w = images.shape[-2:]
    m = matrices(params, h, w, transform)
    fn = warp_perspective if transform.model == "homography" else warp_affine
    return fn(images, m, (h, w), mode="bilinear", padding_mode="border", align_corners=True)


def mse(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-image mean squared error of [B, ...] tensors -> [B]: the fit's objective."""
    return (a - b).pow(2).flatten(1).mean(dim=1)


def fit(src: torch.Tensor, dst: torch.Tensor, transform: Transform = Transform(),
        schedule: Schedule = Schedule()) -> torch.Tensor:
    """Fit one transform per pair, registering src[b] onto dst[b]; returns the raw parameters
    [B, n_params] (zeros = identity), detached, in src's dtype and device.

    src, dst: [B, C, H, W] floating tensors (dst may be an expanded view). Nothing flows back
    into them. Every image's transform starts at the identity; at each pyramid level (coarsest
    first) Adam minimises the sum over images of each image's MSE (images do not compete), with
    the schedule's steps and lr. An image whose fitted transform does not lower its full-
    resolution MSE below the identity's gets the identity.
    """
    if src.ndim != 4 or src.shape != dst.shape:
        raise ConfigError(f"registration expects two [B, C, H, W] batches of one shape, got "
                          f"{list(src.shape)} and {list(dst.shape)}")
    src, dst = src.detach(), dst.detach()
    b, _, h, w = src.shape
    params = torch.zeros(b, n_params(transform), dtype=src.dtype, device=src.device, requires_grad=True)
    if b == 0:
        return params.detach()
    levels = auto_levels(h, w) if schedule.levels is None else max(1, int(schedule.levels))
    if levels > 1:
        from kornia.geometry.transform import build_pyramid

        pyr_src, pyr_dst = build_pyramid(src, levels), build_pyramid(dst, levels)
    else:
        pyr_src, pyr_dst = [src], [dst]
    with torch.enable_grad():
        for level in reversed(range(levels)):
            s_img, d_img = pyr_src[level], pyr_dst[level]
            side = min(s_img.shape[-2:])
            steps = int(schedule.steps)
            if schedule.refine_above is not None and side > schedule.refine_above:
                steps = max(5, steps // 6)
            base = float(schedule.lr)
            if schedule.lr_side is not None:
                base = base * min(2.0, schedule.lr_side / side)
            opt = Adam([params], lr=base)  # torch's Adam without the torch._dynamo import
            for i in range(steps):
                if schedule.lr_end != 1.0:
                    opt.param_groups[0]["lr"] = base * (1.0 - (1.0 - schedule.lr_end) * i / max(1, steps - 1))
                # Eq. 12's F_{x_g -> mean} / Sec. 4's registration: each pair's MSE after warping
                err = mse(warp(s_img, params, transform), d_img)
                opt.zero_grad(set_to_none=True)
                params.grad, = torch.autograd.grad(err.sum(), [params])
                opt.step()
    with torch.no_grad():
        keep = (mse(warp(src, params, transform), dst) < mse(src, dst)).unsqueeze(1)
        return torch.where(keep, params.detach(), torch.zeros_like(params))
