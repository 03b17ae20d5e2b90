"""GradInversion's metrics: FFT2D distance, registered PSNR, LPIPS availability, IIP, gradient norms."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gradleak.data import open_source, sample_batch
from gradleak.data.batch import Batch
from gradleak.errors import ConfigError, ModelMismatchError
from gradleak.metrics import psnr
from gradleak.metrics import paper
from gradleak.metrics.identifiability import (FeatureSpace, IIPResult, ModelFeatures, PixelFeatures, iip,
                                              per_sample_gradient_norms)
from gradleak.metrics.paper import fft2d_distance, lpips_distance, lpips_unavailable_reason, registered_psnr
from gradleak.models import build_model


def _source(name: str):
    return open_source(name)  # installed by `make setup`: missing is a failure, not a skip


@pytest.fixture(scope="module")
def imagenet32() -> torch.Tensor:
    src = _source("imagenet-samples")
    return torch.stack([src.load(i, 32, 3) for i in range(len(src))])


@pytest.fixture(scope="module")
def cifar() -> tuple[torch.Tensor, torch.Tensor]:
    src = _source("cifar10-samples")
    n = len(src)
    return torch.stack([src.load(i, 32, 3) for i in range(n)]), torch.tensor([src.label(i) for i in range(n)])


def _rotate_shift(images: torch.Tensor, degrees: float, dx: float, dy: float) -> torch.Tensor:
    import kornia

    k, _, h, w = images.shape
    center = torch.tensor([[(w - 1) / 2, (h - 1) / 2]]).expand(k, 2)
    m = kornia.geometry.transform.get_rotation_matrix2d(center, torch.full((k,), degrees), torch.ones(k, 2))
    m[:, 0, 2] += dx
    m[:, 1, 2] += dy
    return kornia.geometry.transform.warp_affine(images, m, (h, w), padding_mode="border")


# --------------------------------------------------------------------------- FFT2D


def test_fft2d_distance(imagenet32) -> None:
    x, other = imagenet32[:8], imagenet32[8:16]
    d_self = fft2d_distance(x, x)
    assert d_self.shape == (8,) and d_self.dtype == torch.float64
    assert d_self.abs().max() < 1e-12
    assert fft2d_distance(x.roll(5, dims=-1), x).abs().max() < 1e-12  # circular shift: same magnitudes
    d_shift = fft2d_distance(_rotate_shift(x, 0.0, 3.0, 2.0), x)
    d_other = fft2d_distance(other, x)
    assert (d_shift < d_other).all()
    assert d_shift.max() < 0.03
    assert ((0 <= d_other) & (d_other <= 1)).all()
    # Zero-mean Gaussian noise has no DC peak: far from a photo (the paper's N(0, I) row: 0.706).
    assert fft2d_distance(torch.randn_like(x), x).mean() > 0.5
    blank = torch.zeros(2, 3, 8, 8)
    assert torch.equal(fft2d_distance(blank, blank), torch.zeros(2, dtype=torch.float64))


# --------------------------------------------------------------------------- RPSNR


def test_registered_psnr_recovers_shift_and_rotation(imagenet32) -> None:
    x = imagenet32[:8]
    moved = _rotate_shift(x, 5.0, 3.0, 2.0)
    rpsnr = registered_psnr(moved, x)  # its time: benchmarks/checks.py
    plain = psnr(moved, x)
    assert rpsnr.shape == (8,) and rpsnr.dtype == torch.float64
    assert (rpsnr >= plain).all()
    assert (rpsnr - plain).mean() > 5.0
    assert (rpsnr - plain).min() > 3.0


def test_registered_psnr_never_below_psnr(imagenet32) -> None:
    x = imagenet32[:4]
    g = torch.Generator().manual_seed(0)
    cases = [x, imagenet32[4:8], torch.rand(x.shape, generator=g), torch.zeros_like(x)]
    for recon in cases:
        assert (registered_psnr(recon, x, iterations=10) >= psnr(recon, x)).all()
    assert torch.equal(registered_psnr(x, x, iterations=5), torch.full((4,), 100.0, dtype=torch.float64))
    with pytest.raises(ConfigError):
        registered_psnr(x, x, model="affine-ish")
    with pytest.raises(ModelMismatchError):
        registered_psnr(x, x[:, :, :16])


def test_other_registration_models(imagenet32) -> None:
    x = imagenet32[:4]
    shifted = _rotate_shift(x, 0.0, 3.0, -2.0)
    for model in ("translation", "homography"):
        assert (registered_psnr(shifted, x, model=model) - psnr(shifted, x)).mean() > 5.0


# --------------------------------------------------------------------------- LPIPS


def test_lpips_returns_none_with_notice_when_unavailable(monkeypatch) -> None:
    reason = "LPIPS not computed: test"
    monkeypatch.setattr(paper, "_lpips_status", lambda: (None, reason))
    x = torch.rand(2, 3, 32, 32)
    assert lpips_distance(x, x) is None
    assert lpips_unavailable_reason() == reason
    assert not paper.lpips_available()


def test_lpips_notice_names_missing_weights(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    status, reason = paper._lpips_status()
    assert status is None and reason.startswith("LPIPS not computed")
    assert "\n" not in reason
    assert lpips_distance(torch.rand(1, 3, 32, 32), torch.rand(1, 3, 32, 32)) is None


# --------------------------------------------------------------------------- IIP


def test_iip_perfect_and_chance(cifar) -> None:
    pool, _labels = cifar
    originals = pool[[0, 3, 5, 7, 11, 13, 17, 19]]
    space = PixelFeatures()
    assert isinstance(space, FeatureSpace)
    result = iip(originals, originals, pool, space)  # pool contains the originals: deduplicated
    assert isinstance(result, IIPResult)
    assert result.precision == 1.0 and all(result.hits)
    assert result.pool_size == 20 and result.nearest == list(range(8))
    assert "pixels" in result.feature_space
    precision, hits = result  # unpacks as (precision, hits)
    assert precision == 1.0 and len(hits) == 8

    g = torch.Generator().manual_seed(0)
    scores = [iip(torch.rand(originals.shape, generator=g), originals, pool, space).precision
              for _ in range(10)]
    assert sum(scores) / len(scores) <= 0.2  # chance is 1/20

    # Slightly perturbed reconstructions are still identified; a blank one never is.
    noisy = (originals + 0.05 * torch.randn(originals.shape, generator=g)).clamp(0, 1)
    assert iip(noisy, originals, pool, space).precision == 1.0
    blank = iip(torch.zeros_like(originals), originals, pool, space)
    assert blank.precision == 0.0 and set(blank.nearest) == {-1}


def test_iip_without_pool_and_paired_check(cifar) -> None:
    pool, _ = cifar
    x = pool[:4]
    assert iip(x, x, None, PixelFeatures(size=16, center=True)).pool_size == 4
    swapped = x[[1, 0, 2, 3]]
    assert iip(swapped, x, None, PixelFeatures()).hits == [False, False, True, True]
    with pytest.raises(ModelMismatchError):
        iip(x[:3], x, pool, PixelFeatures())


def test_iip_model_features(cifar) -> None:
    pool, _ = cifar
    spec = build_model("convnet", num_classes=10)
    space = ModelFeatures(spec)
    feats = space.embed(pool[:5])
    assert feats.shape == (5, spec.classifier.in_features)
    assert "avgpool" in space.name and spec.module.training  # state restored
    result = iip(pool[:6], pool[:6], pool, space)
    assert result.precision == 1.0 and result.feature_space == space.name


# --------------------------------------------------------------------------- gradient norms


def test_per_sample_gradient_norms(cifar) -> None:
    images, labels = cifar
    spec = build_model("convnet", num_classes=10)
    batch = Batch(images=images[:5], labels=labels[:5])
    before = {k: v.clone() for k, v in spec.module.state_dict().items()}
    norms = per_sample_gradient_norms(spec, batch)
    assert norms.shape == (5,) and norms.dtype == torch.float64
    assert (norms > 0).all() and torch.isfinite(norms).all()
    assert all(torch.equal(before[k], v) for k, v in spec.module.state_dict().items())
    # Same as one eval-mode backward per sample.
    module = spec.module
    module.eval()
    params = [p for p in module.parameters() if p.requires_grad]
    for k in range(5):
        loss = F.cross_entropy(module(spec.normalize(images[k:k + 1])), labels[k:k + 1])
        grads = torch.autograd.grad(loss, params)
        expected = torch.sqrt(sum(g.double().pow(2).sum() for g in grads))
        assert norms[k].item() == pytest.approx(expected.item(), rel=1e-4)
    module.train()
    assert torch.equal(per_sample_gradient_norms(spec, images[:5], labels[:5]), norms)


def test_per_sample_gradient_norms_in_blocks_bound_memory(cifar, monkeypatch) -> None:
    """A whole data source is reduced to norms block by block (70 000 Fashion-MNIST images at once
    held ~20 GB of per-sample gradients): blocks of 2 give the same norms as one block."""
    import gradleak.metrics.identifiability as ident

    images, labels = cifar
    spec = build_model("convnet", num_classes=10)
    whole = per_sample_gradient_norms(spec, images[:5], labels[:5])
    monkeypatch.setattr(ident, "NORM_BLOCK", 2)
    blocks = per_sample_gradient_norms(spec, images[:5], labels[:5])
    assert blocks.shape == (5,) and torch.allclose(blocks, whole, rtol=1e-6, atol=0)


def test_per_sample_gradient_norms_sampled_batch() -> None:
    src = _source("cifar10-samples")
    batch = sample_batch(src, 4, seed=1, image_size=32, channels=3)
    spec = build_model("lenet-dlg", num_classes=10)
    norms = per_sample_gradient_norms(spec, batch, chunk_size=None)
    assert norms.shape == (4,) and (norms > 0).all()
