"""Score a reconstruction against the client's private batch."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import torch

from gradleak.attacks.reconstruction import Reconstruction
from gradleak.data.batch import Batch
from gradleak.errors import ModelMismatchError
from gradleak.metrics.image import mse as _mse
from gradleak.metrics.image import psnr as _psnr
from gradleak.metrics.image import ssim as _ssim
from gradleak.metrics.matching import match, pair_by_label


@dataclass
class ImageScore:
    """Scores of one ground-truth image against the reconstruction slot paired with it.

    index:          position of the image in the private batch (truth order).
    name:           its identifier (file name or dataset index) from ``Batch.names``.
    psnr, ssim, mse: similarity of the paired slot to this image (PSNR in dB, capped at 100),
                    paired by pixels with the truth (an oracle pairing; :func:`match`).
    label_true:     the image's true class.
    label_restored: the label the attack restored for the paired slot.
    matched_slot:   which reconstruction slot was paired with this image.
    psnr_by_label, ssim_by_label, slot_by_label: the same for the slot paired by restored label
                    (the paper's and the attacker's pairing; :func:`pair_by_label`).
    """

    index: int
    name: str
    psnr: float
    ssim: float
    mse: float
    label_true: int
    label_restored: int
    matched_slot: int
    psnr_by_label: float = float("nan")
    ssim_by_label: float = float("nan")
    slot_by_label: int = -1


@dataclass
class Evaluation:
    """What leaked, batch-level means plus one :class:`ImageScore` per private image.

    paired_images: [K, C, H, W] float32 in [0, 1], the reconstruction reordered (and clamped)
    so that row k pairs ground-truth image k; use it for side-by-side figures.
    """

    psnr_mean: float
    ssim_mean: float
    mse_mean: float
    label_accuracy: float
    per_image: list[ImageScore]
    paired_images: torch.Tensor

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (plain Python numbers and strings; no tensors)."""
        by_label = [float(score.psnr_by_label) for score in self.per_image]
        return {
            "psnr_mean": self.psnr_mean,
            # the same number under a name that says how it is paired (psnr_mean: its older name)
            "psnr_oracle_pairing_mean": self.psnr_mean,
            # the worst image beside the mean: a mean of 86 dB can hide an image at 17 dB
            "psnr_min": min((float(score.psnr) for score in self.per_image), default=self.psnr_mean),
            # the paper's pairing: each slot with the photo of its own restored label
            "psnr_by_label_mean": sum(by_label) / len(by_label) if by_label else None,
            "psnr_by_label_min": min(by_label, default=None),
            "ssim_mean": self.ssim_mean,
            "mse_mean": self.mse_mean,
            "label_accuracy": self.label_accuracy,
            "per_image": [asdict(s) for s in self.per_image],
        }


def label_accuracy(restored: torch.Tensor, true: torch.Tensor) -> float:
    """Order-free label accuracy: |multiset(restored) ∩ multiset(true)| / K.

    restored, true: [K] integer labels. Order-free because label restoration (iDLG,
    GradInversion) recovers *which* classes are in the batch, not which slot holds which.
    """
    k = int(true.numel())
    if k == 0:
        return 0.0
    common = Counter(restored.tolist()) & Counter(true.tolist())
    return sum(common.values()) / k


def _checked(reconstruction: Reconstruction,
             truth: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rec images, true images, rec labels [K] long on the CPU, true labels): detached, once the
    shapes are checked to pair (ModelMismatchError otherwise)."""
    rec_images = reconstruction.images.detach()
    true_images = truth.images.detach()
    if rec_images.shape != true_images.shape:
        raise ModelMismatchError(
            f"reconstruction images have shape {tuple(rec_images.shape)} but the ground-truth "
            f"batch has shape {tuple(true_images.shape)}; both must be [K,C,H,W] and equal"
        )
    if rec_images.ndim != 4:
        raise ModelMismatchError(f"images must be [K,C,H,W], got shape {tuple(rec_images.shape)}")
    k = int(true_images.shape[0])
    if k == 0:
        raise ModelMismatchError("cannot evaluate an empty batch (K = 0)")
    rec_labels = reconstruction.labels.detach().reshape(-1).to("cpu", torch.long)
    true_labels = truth.labels.detach().reshape(-1).to("cpu", torch.long)
    if rec_labels.numel() != k:
        raise ModelMismatchError(
            f"reconstruction has {rec_labels.numel()} labels for {k} images; expected one per image"
        )
    return rec_images, true_images, rec_labels, true_labels


def evaluate(reconstruction: Reconstruction, truth: Batch) -> Evaluation:
    """Pair the reconstruction's slots with the true images and score every pair.

    reconstruction.images: [K, C, H, W]; reconstruction.labels: [K].
    truth.images:          [K, C, H, W] in [0, 1]; truth.labels: [K].

    Reconstructed pixels are clamped to [0, 1] before scoring (non-finite pixels from a
    diverged attack become 0 or 1 rather than poisoning the means). Slots are paired by
    :func:`gradleak.metrics.match` (minimum total MSE), since batch order cannot be recovered
    from an averaged gradient; and again by restored label (:func:`pair_by_label`), as the paper
    and an attacker pair them (docs/explanation/pairing.md).
    """
    rec_images, true_images, rec_labels, true_labels = _checked(reconstruction, truth)
    k = int(true_images.shape[0])

    # Evaluation is tiny next to the attack; doing it on the CPU keeps float64 available everywhere.
    rec = torch.nan_to_num(rec_images.to("cpu", torch.float32), nan=0.0, posinf=1.0, neginf=0.0)
    rec = rec.clamp(0.0, 1.0)
    gt = true_images.to("cpu", torch.float32)

    perm = match(rec, gt)
    paired = rec[perm].contiguous()
    paired_labels = rec_labels[perm]

    m = _mse(paired, gt)
    p = _psnr(paired, gt)
    s = _ssim(paired, gt)
    by_label = pair_by_label(rec_labels, true_labels)
    p_label = _psnr(rec[by_label], gt)
    s_label = _ssim(rec[by_label], gt)

    names = tuple(truth.names)
    per_image = [
        ImageScore(
            index=i,
            name=str(names[i]) if i < len(names) else str(i),
            psnr=float(p[i]),
            ssim=float(s[i]),
            mse=float(m[i]),
            label_true=int(true_labels[i]),
            label_restored=int(paired_labels[i]),
            matched_slot=int(perm[i]),
            psnr_by_label=float(p_label[i]),
            ssim_by_label=float(s_label[i]),
            slot_by_label=int(by_label[i]),
        )
        for i in range(k)
    ]
    return Evaluation(
        psnr_mean=float(p.mean()),
        ssim_mean=float(s.mean()),
        mse_mean=float(m.mean()),
        label_accuracy=label_accuracy(rec_labels, true_labels),
        per_image=per_image,
        paired_images=paired,
    )


def prior_psnr(truth: torch.Tensor) -> torch.Tensor | None:
    """[K] float64: the PSNR of the public prior image (``recognisable.prior_image``, the mean of
    the public photos: it reads nothing private) against each true image [K, C, H, W] in [0, 1];
    the leak-free yardstick beside the zero image. None where no public photo has that shape
    (non-square images)."""
    from gradleak.metrics.recognisable import prior_image, public_decoys

    gt = truth.detach().to("cpu", torch.float32)
    if gt.ndim != 4 or gt.shape[-1] != gt.shape[-2]:
        return None
    decoys = public_decoys(int(gt.shape[-1]), int(gt.shape[1]))
    if decoys.shape[0] == 0:
        return None
    return _psnr(prior_image(decoys).expand_as(gt).contiguous(), gt)
