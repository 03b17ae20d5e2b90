"""Issue 62: the paper's pairing (each slot with the photo of its restored label, labels ascending
on both sides) beside the oracle's pairing by pixels, and the public prior image's PSNR."""

from __future__ import annotations

import torch

from gradleak.attacks.reconstruction import Reconstruction
from gradleak.data.batch import Batch
from gradleak.metrics import evaluate, pair_by_label, prior_psnr, psnr


def test_pair_by_label_sorts_both_sides_ascending_and_keeps_batch_order_for_equal_labels():
    restored = torch.tensor([3, 1, 1, 0])     # slots
    true = torch.tensor([1, 0, 3, 1])         # truth images
    perm = pair_by_label(restored, true)
    # truth 1 (label 0) <- slot 3; truth 0 and 3 (label 1, in that order) <- slots 1 and 2; truth 2 <- slot 0
    assert perm.tolist() == [1, 3, 0, 2]
    assert (restored[perm] == true).all()


def _batch(images: torch.Tensor, labels: list[int]) -> Batch:
    return Batch(images=images, labels=torch.tensor(labels), names=tuple(f"img{i}" for i in range(len(labels))))


def test_oracle_pairing_is_more_lenient_than_pairing_by_label():
    g = torch.Generator().manual_seed(0)
    truth = _batch(torch.rand(3, 3, 16, 16, generator=g), [0, 1, 2])
    # the right photos, in another order, with the right labels: both pairings find every photo
    order = torch.tensor([2, 0, 1])
    ev = evaluate(Reconstruction(images=truth.images[order], labels=truth.labels[order]), truth)
    assert [s.psnr for s in ev.per_image] == [100.0] * 3
    assert [s.psnr_by_label for s in ev.per_image] == [100.0] * 3
    # the photos of slots 0 and 1 swapped, their labels not: pixels still find every photo, labels do not
    images = truth.images.clone()[[1, 0, 2]]
    ev = evaluate(Reconstruction(images=images, labels=truth.labels), truth)
    d = ev.to_dict()
    assert [s.psnr for s in ev.per_image] == [100.0] * 3
    assert ev.per_image[2].psnr_by_label == 100.0
    wrong = psnr(truth.images[1:2], truth.images[0:1]).item()
    assert abs(ev.per_image[0].psnr_by_label - wrong) < 1e-6 and wrong < 15.0
    assert d["psnr_oracle_pairing_mean"] == d["psnr_mean"] == 100.0
    assert d["psnr_by_label_mean"] < 100.0 - 20.0 and d["psnr_by_label_min"] < 15.0
    assert [r["slot_by_label"] for r in d["per_image"]] == [0, 1, 2]


def test_prior_image_psnr_is_finite_per_image_and_needs_square_images():
    g = torch.Generator().manual_seed(1)
    scores = prior_psnr(torch.rand(2, 3, 32, 32, generator=g))
    assert scores is not None and scores.shape == (2,) and bool(torch.isfinite(scores).all())
    # uniform noise against the public photos' mean image: a few dB above 0, far below a rebuild
    assert bool((scores > 3.0).all()) and bool((scores < 15.0).all())
    assert prior_psnr(torch.rand(1, 3, 32, 24, generator=g)) is None
