"""The one image registration (gradleak.registration) and its two users: GradInversion's registered
group consistency (Eq. 12, attacks/group.py) and the post-registration PSNR (Sec. 4, metrics/paper.py)."""

from __future__ import annotations

import math

import pytest
import torch

from gradleak import registration as reg
from gradleak.attacks.group import TRANSFORM as GROUP_TRANSFORM
from gradleak.attacks.group import GroupConsistency, Registration, lazy_mean
from gradleak.data import open_source
from gradleak.errors import ConfigError
from gradleak.metrics import paper


@pytest.fixture(scope="module")
def photos() -> torch.Tensor:
    """8 real photos (the foolbox ImageNet samples) at 64 px, [8, 3, 64, 64] in [0, 1]."""
    src = open_source("imagenet-samples")  # installed by `make setup`: missing is a failure, not a skip
    return torch.stack([src.load(i, 64, 3) for i in range(8)])


def _move(images: torch.Tensor, degrees: float, dx: float, dy: float, scale: float = 1.0):
    """Rotate/scale about the centre, then shift (pixels), with kornia (independent of the code
    under test); returns the moved images and the source->destination pixel matrices [B, 2, 3]."""
    import kornia

    k, _, h, w = images.shape
    center = torch.tensor([[(w - 1) / 2, (h - 1) / 2]]).expand(k, 2)
    m = kornia.geometry.transform.get_rotation_matrix2d(center, torch.full((k,), float(degrees)),
                                                        torch.full((k, 2), float(scale)))
    m[:, 0, 2] += dx
    m[:, 1, 2] += dy
    moved = kornia.geometry.transform.warp_affine(images, m, (h, w), padding_mode="border", align_corners=True)
    return moved, m


def _residual_px(fitted: torch.Tensor, applied: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Largest displacement (px) over all pixels of fitted o applied: 0 if the fit undid the motion."""
    def h3(m: torch.Tensor) -> torch.Tensor:
        if m.shape[-2] == 3:
            return m
        return torch.cat([m, torch.tensor([0.0, 0.0, 1.0], dtype=m.dtype).expand(m.shape[0], 1, 3)], dim=1)

    comp = h3(fitted.detach()) @ h3(applied)
    ys, xs = torch.meshgrid(torch.arange(h, dtype=comp.dtype), torch.arange(w, dtype=comp.dtype), indexing="ij")
    pts = torch.stack([xs.flatten(), ys.flatten(), torch.ones(h * w, dtype=comp.dtype)])
    q = comp @ pts
    return (q[:, :2] / q[:, 2:] - pts[:2]).norm(dim=1).amax(dim=1)


MOTIONS = [(0.0, 3.0, -2.0, 1.0), (6.0, 2.0, 1.0, 1.0), (-4.0, -1.5, 2.5, 1.05)]


@pytest.mark.parametrize("degrees,dx,dy,scale", MOTIONS)
def test_metric_fit_recovers_known_motion(photos, degrees, dx, dy, scale) -> None:
    # Every photo moved by a known similarity: the metric's coarse-to-fine fit undoes it to
    # within 0.3 px everywhere in the image (measured: 0.02-0.17 px).
    moved, applied = _move(photos, degrees, dx, dy, scale)
    transform = paper.metric_transform()
    params = reg.fit(moved, photos, transform, paper.metric_schedule())
    err = _residual_px(reg.matrices(params, 64, 64, transform), applied, 64, 64)
    assert err.max() < 0.3, err


def test_group_fit_recovers_known_motion(photos) -> None:
    # Eq. 12's parametrisation (unbounded, one level, its default 40 steps at a constant lr of
    # 0.05 raw units = 0.2 px at 64 px): it ends within a step or two of the optimum, 0.5 px
    # everywhere in the image (measured: 0.15-0.36 px).
    moved, applied = _move(photos, 4.0, 1.5, -1.0)
    params = reg.fit(moved, photos, GROUP_TRANSFORM, reg.Schedule(steps=40, lr=0.05))
    err = _residual_px(reg.matrices(params, 64, 64, GROUP_TRANSFORM), applied, 64, 64)
    assert err.max() < 0.5, err


def test_non_square_rotation_is_in_pixel_geometry(photos) -> None:
    x = photos[:4, :, 12:52, :]  # 40 x 64
    moved, applied = _move(x, 6.0, 2.0, 1.0)
    for transform, schedule in ((paper.metric_transform(), paper.metric_schedule()),
                                (GROUP_TRANSFORM, reg.Schedule(steps=200, lr=0.05))):
        params = reg.fit(moved, x, transform, schedule)
        err = _residual_px(reg.matrices(params, 40, 64, transform), applied, 40, 64)
        assert err.max() < 0.3, err


def test_translation_and_homography_models(photos) -> None:
    x = photos[:4]
    moved, applied = _move(x, 0.0, 3.0, -2.0)
    t = paper.metric_transform("translation")
    params = reg.fit(moved, x, t, paper.metric_schedule())
    assert torch.equal(params[:, 2:], torch.zeros(4, 2))  # angle and scale never move
    assert _residual_px(reg.matrices(params, 64, 64, t), applied, 64, 64).max() < 0.3
    hom = paper.metric_transform("homography")
    params = reg.fit(moved, x, hom, paper.metric_schedule())
    assert params.shape == (4, 8)
    # 8 free parameters fit less tightly (measured 0.08-0.4 px on 8 photos).
    assert _residual_px(reg.matrices(params, 64, 64, hom), applied, 64, 64).max() < 0.6


def test_matrices_units_and_identity() -> None:
    h, w = 32, 48
    zero = torch.zeros(1, 4)
    ident = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    for transform in (GROUP_TRANSFORM, paper.metric_transform()):
        assert torch.allclose(reg.matrices(zero, h, w, transform), ident, atol=1e-6)
    eye = reg.matrices(torch.zeros(1, 8), h, w, paper.metric_transform("homography"))
    assert torch.allclose(eye, torch.eye(3).unsqueeze(0), atol=1e-5)
    # Eq. 12's units: raw 1 = 1/16 of the side (tx of the width, ty of the height), 0.25 rad.
    m = reg.matrices(torch.tensor([[1.0, 1.0, 0.0, 0.0]]), h, w, GROUP_TRANSFORM)
    assert torch.allclose(m[0, :, 2], torch.tensor([w / 16, h / 16]))
    m = reg.matrices(torch.tensor([[0.0, 0.0, 1.0, 0.0]]), h, w, GROUP_TRANSFORM)
    assert math.isclose(math.atan2(m[0, 1, 0].item(), m[0, 0, 0].item()), 0.25, rel_tol=1e-6)
    # The metric's bounds: even huge raw values stay within 30 degrees, 1.25x and w/4 px.
    m = reg.matrices(torch.tensor([[50.0, -50.0, 50.0, 50.0]]), h, w, paper.metric_transform())
    scale = torch.linalg.det(m[0, :, :2]).sqrt().item()
    assert math.isclose(scale, 1.25, rel_tol=1e-5)
    assert math.isclose(math.atan2(m[0, 1, 0].item(), m[0, 0, 0].item()), math.radians(30), rel_tol=1e-5)


def test_identity_fallback_and_bad_input(photos) -> None:
    x = photos[:3]
    # Nothing beats the identity on identical pairs: the fit returns exactly zero parameters.
    assert torch.equal(reg.fit(x, x, paper.metric_transform(), paper.metric_schedule(iterations=5)),
                       torch.zeros(3, 4))
    assert reg.fit(x[:0], x[:0]).shape == (0, 4)
    with pytest.raises(ConfigError):
        reg.Transform("affine-ish")
    with pytest.raises(ConfigError):
        reg.fit(x, x[:2])
    assert reg.auto_levels(32, 32) == 2 and reg.auto_levels(64, 48) == 2 and reg.auto_levels(224, 224) == 4


def test_pairs_do_not_compete(photos) -> None:
    # One fit for B pairs = B fits of one pair (the objective is a sum of per-pair MSEs).
    moved, _ = _move(photos[:4], 5.0, 2.0, -1.0)
    batched = reg.fit(moved, photos[:4], paper.metric_transform(), paper.metric_schedule(iterations=10))
    single = torch.cat([reg.fit(moved[i:i + 1], photos[i:i + 1], paper.metric_transform(),
                                paper.metric_schedule(iterations=10)) for i in range(4)])
    assert torch.allclose(batched, single, atol=1e-5)


# --------------------------------------------------------------------------- the two users


def test_metric_runs_the_one_registration(photos) -> None:
    moved, _ = _move(photos, 5.0, 3.0, 2.0)
    for model in ("similarity", "translation", "homography"):
        transform = paper.metric_transform(model)
        params = reg.fit(moved, photos, transform, paper.metric_schedule(iterations=12))
        assert torch.equal(paper.register(moved, photos, model=model, iterations=12),
                           reg.warp(moved, params, transform))
    rpsnr = paper.registered_psnr(moved, photos)
    from gradleak.metrics import psnr

    assert (rpsnr - psnr(moved, photos)).min() > 5.0  # 5 degrees + (3, 2) px: recovered


def test_group_runs_the_one_registration(photos) -> None:
    # G=3 candidates of K=2 images, each seed's copy moved differently (Eq. 12's setting).
    imgs = photos[:2]
    cands = torch.stack([imgs, _move(imgs, 0.0, 2.0, 0.0)[0], _move(imgs, 3.0, -1.0, 1.0)[0]])
    g, k, c, h, w = cands.shape
    registration = Registration(tuple(cands.shape), steps=15, lr=0.05)
    registration.fit(cands)
    target = cands.mean(0, keepdim=True).expand_as(cands).reshape(g * k, c, h, w)
    params = reg.fit(cands.reshape(g * k, c, h, w), target, GROUP_TRANSFORM, reg.Schedule(steps=15, lr=0.05))
    assert torch.equal(registration.theta, params)
    warped = reg.warp(cands.reshape(g * k, c, h, w), params, GROUP_TRANSFORM).reshape(g, k, c, h, w)
    assert torch.equal(registration.consensus(cands), warped.mean(0))
    # ... and registering brings the seeds together.
    spread = lambda t: (t - t.mean(0, keepdim=True)).pow(2).mean().item()  # noqa: E731
    assert spread(warped) < 0.5 * spread(cands)
    group = GroupConsistency("registered", tuple(cands.shape), start=0, every=1, steps=15)
    assert group.maybe_register(0, cands)
    assert torch.equal(group.consensus(cands), warped.mean(0))
    assert not torch.equal(group.consensus(cands), lazy_mean(cands))
