"""Image metrics, slot matching and evaluation against ground truth."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from gradleak.attacks.reconstruction import Reconstruction
from gradleak.data.batch import Batch
from gradleak.errors import GradleakError, ModelMismatchError
from gradleak.metrics import Evaluation, ImageScore, evaluate, match, mse, psnr, ssim
from gradleak.metrics.image import ssim_window


def smooth_images(k: int, c: int = 3, size: int = 32, seed: int = 0) -> torch.Tensor:
    """[k, c, size, size] in [0, 1]: upsampled low-resolution noise, photo-like smooth blobs."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(k, c, 6, 6, generator=g)
    return F.interpolate(low, size=(size, size), mode="bicubic", align_corners=False).clamp(0, 1)


# --------------------------------------------------------------------------- image metrics


def test_identical_images_are_perfect() -> None:
    x = smooth_images(4)
    assert torch.equal(mse(x, x), torch.zeros(4, dtype=torch.float64))
    assert torch.equal(psnr(x, x), torch.full((4,), 100.0, dtype=torch.float64))
    assert torch.allclose(ssim(x, x), torch.ones(4, dtype=torch.float64), atol=1e-9)


def test_constant_offset_gives_known_mse_and_psnr() -> None:
    x = torch.full((2, 3, 16, 16), 0.25, dtype=torch.float64)
    y = x + 0.1
    assert mse(x, y) == pytest.approx([0.01, 0.01], abs=1e-15)
    assert psnr(x, y) == pytest.approx([20.0, 20.0], abs=1e-9)
    # float32 inputs are promoted: still 20 dB to within float32 rounding of the offset.
    assert psnr(x.float(), y.float()) == pytest.approx([20.0, 20.0], abs=1e-5)


def test_metrics_return_one_float64_value_per_image() -> None:
    x, y = smooth_images(5, seed=1), smooth_images(5, seed=2)
    for fn in (mse, psnr, ssim):
        out = fn(x, y)
        assert out.shape == (5,) and out.dtype == torch.float64


def test_ssim_of_image_vs_noise_is_low() -> None:
    x = smooth_images(3, seed=3)
    noise = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    assert float(ssim(x, noise).max()) < 0.2
    assert float(ssim(x, x + 0.01 * torch.randn_like(x)).min()) > 0.9


@pytest.mark.parametrize("shape", [(2, 1, 28, 28), (2, 3, 8, 8), (1, 1, 5, 9), (2, 3, 3, 3)])
def test_ssim_on_small_images(shape: tuple[int, ...]) -> None:
    x = torch.rand(*shape, generator=torch.Generator().manual_seed(5))
    y = (x + 0.05 * torch.randn(*shape, generator=torch.Generator().manual_seed(6))).clamp(0, 1)
    same, other = ssim(x, x), ssim(x, y)
    assert torch.allclose(same, torch.ones_like(same), atol=1e-9)
    assert torch.isfinite(other).all() and (other < 1).all()


def test_ssim_window_size() -> None:
    assert ssim_window(32, 32) == 11
    assert ssim_window(28, 28) == 11
    assert ssim_window(8, 8) == 7
    assert ssim_window(10, 64) == 9
    assert ssim_window(3, 3) == 3
    with pytest.raises(ModelMismatchError):
        ssim(torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 8))


def test_metric_shape_mismatch_raises() -> None:
    with pytest.raises(ModelMismatchError):
        mse(torch.zeros(2, 3, 8, 8), torch.zeros(2, 1, 8, 8))
    with pytest.raises(ModelMismatchError):
        psnr(torch.zeros(3, 8, 8), torch.zeros(3, 8, 8))


# --------------------------------------------------------------------------- matching


def test_match_recovers_a_random_permutation() -> None:
    truth = smooth_images(6, seed=7)
    q = torch.randperm(6, generator=torch.Generator().manual_seed(8))
    recon = truth[q] + 0.02 * torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(9))
    perm = match(recon, truth)
    assert perm.dtype == torch.long
    assert torch.equal(q[perm], torch.arange(6))  # recon[perm[k]] is a noisy truth[k]
    assert torch.equal(perm, torch.argsort(q))


def test_match_is_identity_for_ordered_input_and_handles_nan() -> None:
    truth = smooth_images(4, seed=10)
    assert torch.equal(match(truth.clone(), truth), torch.arange(4))
    recon = truth.clone()
    recon[2] = float("nan")
    perm = match(recon, truth)
    assert sorted(perm.tolist()) == [0, 1, 2, 3]
    with pytest.raises(ModelMismatchError):
        match(truth[:3], truth)


# --------------------------------------------------------------------------- evaluate


def make_batch(images: torch.Tensor, labels: list[int]) -> Batch:
    names = tuple(f"img{i}.png" for i in range(images.shape[0]))
    return Batch(images=images, labels=torch.tensor(labels), names=names)


def test_label_accuracy_is_order_free() -> None:
    images = smooth_images(3, seed=11)
    truth = make_batch(images, [1, 2, 3])
    rec = Reconstruction(images=images.clone(), labels=torch.tensor([3, 1, 5]))
    ev = evaluate(rec, truth)
    assert ev.label_accuracy == pytest.approx(2 / 3)
    # duplicates count as a multiset: two 7s restored, only one true 7
    truth2 = make_batch(images, [7, 7, 2])
    rec2 = Reconstruction(images=images.clone(), labels=torch.tensor([7, 2, 2]))
    assert evaluate(rec2, truth2).label_accuracy == pytest.approx(2 / 3)


def test_evaluate_pairs_slots_consistently() -> None:
    truth_images = smooth_images(5, seed=12)
    q = torch.tensor([3, 0, 4, 1, 2])  # slot j of the reconstruction holds truth image q[j]
    rec_images = truth_images[q] + 0.01 * torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(13))
    rec_labels = torch.tensor([30, 0, 40, 10, 20])  # slot j restored label 10 * q[j]
    truth = make_batch(truth_images, [0, 10, 20, 30, 40])
    ev = evaluate(Reconstruction(images=rec_images, labels=rec_labels), truth)

    assert isinstance(ev, Evaluation) and all(isinstance(s, ImageScore) for s in ev.per_image)
    assert ev.label_accuracy == 1.0
    assert ev.paired_images.shape == truth_images.shape
    for k, score in enumerate(ev.per_image):
        assert score.index == k and score.name == f"img{k}.png"
        assert int(q[score.matched_slot]) == k
        assert score.label_true == score.label_restored == 10 * k
        assert torch.equal(ev.paired_images[k], rec_images[score.matched_slot].clamp(0, 1))
        assert score.psnr > 35 and score.ssim > 0.9
    assert ev.psnr_mean == pytest.approx(sum(s.psnr for s in ev.per_image) / 5)
    assert ev.mse_mean == pytest.approx(float(mse(ev.paired_images, truth_images).mean()))


def test_evaluate_clamps_and_serialises() -> None:
    truth_images = torch.full((2, 1, 8, 8), 1.0)
    rec = Reconstruction(images=torch.full((2, 1, 8, 8), 1.7), labels=torch.tensor([0, 1]))
    ev = evaluate(rec, make_batch(truth_images, [0, 1]))
    assert ev.mse_mean == 0.0 and ev.psnr_mean == 100.0  # 1.7 clamps to 1.0
    d = ev.to_dict()
    assert set(d) == {"psnr_mean", "psnr_oracle_pairing_mean", "psnr_min", "psnr_by_label_mean", "psnr_by_label_min",
                      "ssim_mean", "mse_mean", "label_accuracy", "per_image"}
    assert d["psnr_by_label_mean"] == d["psnr_oracle_pairing_mean"] == 100.0   # flat images: either pairing
    assert d["per_image"][0]["matched_slot"] in (0, 1)
    json.loads(json.dumps(d, allow_nan=False))  # plain JSON, no tensors, no NaN
    assert all(math.isfinite(v) for v in (d["psnr_mean"], d["ssim_mean"], d["mse_mean"]))


def test_evaluate_shape_mismatch_raises() -> None:
    truth = make_batch(smooth_images(3), [0, 1, 2])
    rec = Reconstruction(images=smooth_images(2), labels=torch.tensor([0, 1]))
    with pytest.raises(ModelMismatchError, match="shape"):
        evaluate(rec, truth)
    rec_gray = Reconstruction(images=smooth_images(3, c=1), labels=torch.tensor([0, 1, 2]))
    with pytest.raises(GradleakError):
        evaluate(rec_gray, truth)
    rec_labels = Reconstruction(images=smooth_images(3), labels=torch.tensor([0, 1]))
    with pytest.raises(ModelMismatchError, match="labels"):
        evaluate(rec_labels, truth)
