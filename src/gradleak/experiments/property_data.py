"""The property of property-inference (DLG rebuttal Table 2): "an image in the brightest quartile
of its own class", per-class thresholds from the train split, and the target batches drawn with and
without it by rejection sampling (bounded, refused up front when the data cannot hold one)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..data import FashionMNISTSource
from ..data import idx as idx_files
from ..errors import DataError

QUANTILE = 75.0            # the property: mean intensity above this percentile of the image's class
MAX_DRAWS = 100_000        # rejection sampling of a batch with / without the property
MAX_ITEM_DRAWS = 1_000_000  # items drawn for one batch, all its attempts together (~3 s)


@dataclass(frozen=True)
class Brightness:
    """The property "an image in the brightest quartile of its own class": per-class thresholds on
    the mean intensity of the 8-bit image (in [0, 1]), from the train split."""

    thresholds: np.ndarray   # [classes] float64

    def scores(self, images: torch.Tensor, labels: Sequence[int]) -> np.ndarray:
        """Per image: mean intensity - its class's threshold (> 0: the image has the property).
        Pixels are clamped to [0, 1] and rounded to 8 bits as the data set stores them, so the true
        images score exactly as the train-split table that set the thresholds."""
        return intensity(images) - self.thresholds[np.asarray(list(labels), dtype=np.int64)]

    def score(self, images: torch.Tensor, labels: Sequence[int]) -> float:
        """The batch's score: the largest image score (> 0: the batch has the property)."""
        return float(self.scores(images, labels).max())


def intensity(images: torch.Tensor) -> np.ndarray:
    """Mean pixel intensity per image [K, C, H, W] -> [K] float64, of the pixels clamped to [0, 1]
    and rounded to 8 bits (exact for the data set's own images)."""
    x = torch.nan_to_num(images.detach().double().cpu(), nan=0.0).clamp(0.0, 1.0)
    levels = torch.round(x * 255.0).flatten(1).sum(1)
    return (levels / (255.0 * x[0].numel())).numpy()


def intensity_table(source: FashionMNISTSource) -> tuple[np.ndarray, np.ndarray]:
    """(mean intensity [N], labels [N]) of every image of an IDX source, from its 8-bit pixels."""
    images, labels = idx_files.load_idx_pair(source.images_path, source.labels_path)
    sums = images.reshape(len(images), -1).sum(axis=1, dtype=np.int64)
    return sums / (255.0 * images[0].size), labels.astype(np.int64)


def class_thresholds(values: np.ndarray, labels: np.ndarray, num_classes: int, q: float = QUANTILE) -> np.ndarray:
    """The ``q``-th percentile of ``values`` within each class (numpy's linear interpolation)."""
    out = np.empty(num_classes, dtype=np.float64)
    for c in range(num_classes):
        sel = values[labels == c]
        if sel.size == 0:
            raise DataError(f"class {c} has no image in the train split: no brightness threshold for it")
        out[c] = np.percentile(sel, q)
    return out


def has_property(values: np.ndarray, labels: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Per image: mean intensity strictly above its class's threshold."""
    return values > thresholds[labels]


def draw_batch(labels: np.ndarray, bright: np.ndarray, k: int, want: bool, rng: np.random.Generator) -> list[int]:
    """A random batch of ``k`` items with distinct labels (items drawn uniformly, a repeated label
    skipped, as the project's batches are drawn), redrawn until it holds an image with the
    property (``want``) or none (not ``want``). At most MAX_DRAWS batches and MAX_ITEM_DRAWS items
    are drawn (DataError past either: data too unbalanced to draw such batches by rejection);
    plan_batches first refuses data that cannot hold such a batch at all."""
    n = len(labels)
    if n == 0 or k < 1:
        raise DataError(f"cannot draw a batch of {k} from {n} images")
    items = 0
    for _ in range(MAX_DRAWS):
        chosen: list[int] = []
        seen: set[int] = set()
        while len(chosen) < k:
            items += 1
            if items > MAX_ITEM_DRAWS:
                raise DataError(f"no batch of {k} images with distinct labels {'with' if want else 'without'} the "
                                f"property in {MAX_ITEM_DRAWS} random draws: the labels are too unbalanced")
            i = int(rng.integers(n))
            if int(labels[i]) in seen:
                continue
            chosen.append(i)
            seen.add(int(labels[i]))
        if bool(bright[chosen].any()) == want:
            return chosen
    raise DataError(f"no batch of {k} {'with' if want else 'without'} the property in {MAX_DRAWS} draws")


def check_drawable(labels: np.ndarray, bright: np.ndarray, k: int, what: str = "the data") -> None:
    """DataError unless ``labels``/``bright`` can hold a batch of ``k`` distinct labels both with
    and without the property (a split of one label, or without a dark image of k labels, would
    make the rejection sampling draw forever)."""
    labels, bright = np.asarray(labels), np.asarray(bright, dtype=bool)
    present = np.unique(labels)
    if present.size < k:
        shown = ", ".join(str(int(v)) for v in present[:10]) + (", ..." if present.size > 10 else "")
        raise DataError(f"{what} holds {present.size} distinct label(s) ({shown or 'no image'}); a batch of {k} "
                        f"needs {k} distinct labels")
    if not bright.any():
        raise DataError(f"{what} holds no image with the property: no batch with it can be drawn")
    dark = np.unique(labels[~bright])
    if dark.size < k:
        raise DataError(f"{what}: the images without the property carry {dark.size} distinct label(s); a batch of "
                        f"{k} without the property needs {k}")


def plan_batches(labels: np.ndarray, bright: np.ndarray, k: int, count: int, seed: int,
                 stream: int, what: str = "the data") -> list[tuple[list[int], bool]]:
    """``count`` batches, batch i with the property iff i is odd (half of them), each drawn from
    its own random stream (seed, stream, i): growing ``count`` keeps the earlier batches.
    ``what`` names the data in a refusal (check_drawable)."""
    check_drawable(labels, bright, k, what)
    return [(draw_batch(labels, bright, k, i % 2 == 1, np.random.default_rng([seed, stream, i])), i % 2 == 1)
            for i in range(count)]
