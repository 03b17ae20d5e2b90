"""The statistics ``gradleak inspect`` reads off a received model's layers: how parallel its rows
(columns) are, the largest parallel group among them (hashing, no pairs of rows compared), and the
trap-weights statistics in pixel space; each linear in a layer's entries, in bounded chunks. The
thresholds beside them are the ones inspect.py's findings use (measured: see the notes below)."""

from __future__ import annotations

import math
from typing import Iterator

import torch

# ---------------------------------------------------------------- thresholds (see the module's notes in docs/)
# Measured by benchmarks/inspect_models.py (inspect_models.json) on 23 honest models: pretrained
# EfficientNet-Lite0, its random build (2 seeds), ResNet-18 / ResNet-50 224 px (2 seeds each),
# ResNet-18 CIFAR, convnet, mlp, LeNet (3 seeds each), and mlp / convnet / LeNet trained on
# Fashion-MNIST with `gradleak train`; and 51 malicious ones (imprint, trap, scaled block).
#
# Parallel rows / columns: the median over a layer's rows (columns) of |cos(row, common
# direction)|. Honest maximum 0.971 (the pretrained EfficientNet-Lite0's depthwise 5x5 filters,
# all blob-like); every other honest layer <= 0.41; the imprint block's rows and columns are
# exactly parallel (1.0 to float rounding). 0.999 leaves the honest maximum 30x the distance to 1.
PARALLEL_THRESHOLD = 0.999
MIN_VECTOR = 16      # rows (columns) shorter than this are not tested: a 3x3 filter's 9 entries or a
                     # Linear(1, n)'s rows are parallel by chance or by shape
MIN_VECTORS = 3      # nor layers with fewer rows (columns): the two rows of a trained 2-class
                     # classifier become anti-parallel (softmax moves them by opposite steps)
# Parallel groups: a block that fills only some of a layer's rows (48 imprint bins among an mlp's
# 128 first-layer rows) leaves the median low. So the largest group of rows (columns) that are
# (anti-)parallel to one of them, |cos| >= PARALLEL_THRESHOLD, is counted too; a group of
# PARALLEL_MIN_GROUP or more is a finding, for the same reason as MIN_VECTORS (two anti-parallel
# rows are what a 2-class classifier trains into). Honest layers: largest group 1 on every honest
# model benchmarks/inspect_detection.py builds (random init, several seeds, and trained ones);
# two random rows of m >= 16 entries reach |cos| 0.999 with probability below 1e-20.
PARALLEL_MIN_GROUP = 3
SKETCH_DIM = 32    # the group is searched on a fixed random projection of the unit rows (n m k work);
HASH_TABLES = 8    # rows sharing a sign hash of HASH_BITS hyperplanes there are candidates, verified
HASH_BITS = 62     # exactly: parallel rows always share it, a 0.999 pair in one table with
GROUP_SEEDS = 8    # probability 0.41 (in one of 8: 0.986), rows 30 degrees apart with 1e-5
# Trap rows, on a layer reading the image (ARCH's first weight layer, or an added one), in pixel
# space; all four must hold:
#   T = mean(z) sqrt(n) <= TRAP_T: one-sided p < 3e-7 under sign-symmetric rows (z-test; honest
#     image layers measured -2.07 .. +98);
#   mean(z) <= TRAP_MEAN_Z (effect size; the trap's firing rate sets it, not the input size:
#     rate 1/8 (the server's default) gives -1.31 at 32 px and -1.33 at 224 px, rate 1/4 -0.79 and
#     -0.73, rate 0.4 -0.28; honest untrained layers lie in -0.26 .. +0.48);
#   the fraction of negative row sums >= TRAP_NEGATIVE (rate 1/4: 0.78; honest at most 0.55);
#   the shift is in the magnitudes, not the signs: the count statistic c = (n+ - n-) / sqrt(n+ +
#     n-) (N(0, 1) per row like z under sign symmetry) is insignificant (mean(c) sqrt(n) >
#     TRAP_COUNT_T) or explains at most TRAP_COUNT_SHARE of mean(z). The trap's shrink keeps every
#     sign (shares measured on the trap models -0.22 .. +0.03, within +-0.07 wherever mean z <=
#     -0.6); a trained first layer drifts as a whole, signs with magnitudes (shares 0.64 and 0.69
#     on the benchmark's two trained mlps, 0.52-0.68 on three more seeds, whose drift was
#     positive: mean z +0.8 .. +3.1), so a negative drift of that kind does not pass for a trap.
TRAP_T = -5.0
TRAP_MEAN_Z = -0.3
TRAP_NEGATIVE = 0.6
TRAP_COUNT_T = -2.5
TRAP_COUNT_SHARE = 0.4
TRAP_MIN_ROW = 64    # rows shorter than this are not tested (a 3x3 RGB stem's 27 entries)
TRAP_MIN_ROWS = 8

CHUNK = 1 << 22   # entries converted to float64 at a time (32 MiB): a 224 px trap layer has 10^8


def chunks(rows: torch.Tensor, scale: torch.Tensor | None = None) -> Iterator[torch.Tensor]:
    """``rows`` [n, m] in float64 blocks of whole rows, each times ``scale`` [m] if given."""
    step = max(1, CHUNK // max(1, rows.shape[1]))
    for i in range(0, rows.shape[0], step):
        block = rows[i:i + step].double()
        yield block if scale is None else block * scale


def parallel_median(vectors: torch.Tensor) -> float | None:
    """Median over the non-zero vectors (rows of ``vectors``) of |cos| with their common
    direction (the sign-aligned sum of the unit vectors, aligned on the longest vector); None
    when there are too few or too short vectors to say."""
    if vectors.shape[1] < MIN_VECTOR:
        return None
    norms = torch.cat([c.norm(dim=1) for c in chunks(vectors)])
    live = norms > 0
    if int(live.sum()) < MIN_VECTORS:
        return None
    ref = vectors[int(torch.argmax(norms))].double()
    ref = ref / ref.norm()
    common = torch.zeros_like(ref)
    start = 0
    for c in chunks(vectors):
        n = norms[start:start + c.shape[0]]
        start += c.shape[0]
        unit = c[n > 0] / n[n > 0, None]
        signs = torch.where(unit @ ref < 0, -1.0, 1.0).to(unit.dtype)
        common += (unit * signs[:, None]).sum(0)
    if float(common.norm()) == 0:
        return 0.0
    common = common / common.norm()
    cos = torch.cat([(c @ common).abs() for c in chunks(vectors)])[live] / norms[live]
    return float(cos.median())


def _sketch(vectors: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The unit vectors ``vectors[rows]`` projected on SKETCH_DIM fixed random directions and
    normalised again [len(rows), SKETCH_DIM]: parallel vectors keep |cos| 1 there. Built by
    blocks of rows and columns, so memory stays bounded whatever the shape."""
    n, m = len(rows), vectors.shape[1]
    gen = torch.Generator().manual_seed(0)
    out = torch.zeros(n, SKETCH_DIM, dtype=torch.float64)
    width = min(m, 1 << 16)
    step = max(1, CHUNK // width)
    for j in range(0, m, width):
        proj = torch.randn(min(width, m - j), SKETCH_DIM, generator=gen, dtype=torch.float64)
        for i in range(0, n, step):
            out[i:i + step] += vectors[rows[i:i + step], j:j + width].double() @ proj
    return out / out.norm(dim=1, keepdim=True).clamp(min=1e-300)


def _buckets(sketch: torch.Tensor) -> list[torch.Tensor]:
    """Candidate groups: the rows (indices into ``sketch`` [n, k]) sharing a bucket of one of
    HASH_TABLES sign hashes of HASH_BITS random hyperplanes each, a sign-flipped row hashed like
    the row (the bits are inverted when the first is set), buckets of PARALLEL_MIN_GROUP rows
    or more, each table's GROUP_SEEDS largest, largest first. Linear in n: no pair of rows is
    compared."""
    gen = torch.Generator().manual_seed(1)
    planes = torch.randn(sketch.shape[1], HASH_TABLES * HASH_BITS, generator=gen, dtype=torch.float64)
    half = 2.0 ** torch.arange(HASH_BITS // 2, dtype=torch.float64)   # 31 bits: exact in float64 and int64
    found = []
    for t in range(HASH_TABLES):   # each table's GROUP_SEEDS largest buckets
        bits = sketch @ planes[:, t * HASH_BITS:(t + 1) * HASH_BITS] > 0
        bits = (bits ^ bits[:, :1]).double()
        lo, hi = (bits[:, :HASH_BITS // 2] @ half).long(), (bits[:, HASH_BITS // 2:] @ half).long()
        table = hi * 2 ** (HASH_BITS // 2) + lo
        _, inverse, counts = torch.unique(table, return_inverse=True, return_counts=True)
        for bucket in torch.argsort(counts, descending=True, stable=True)[:GROUP_SEEDS].tolist():
            if int(counts[bucket]) >= PARALLEL_MIN_GROUP:
                found.append(torch.nonzero(inverse == bucket).flatten())
    return sorted(found, key=len, reverse=True)


def parallel_group(vectors: torch.Tensor) -> torch.Tensor | None:
    """The indices of the largest group of PARALLEL_MIN_GROUP or more rows of ``vectors`` [n, m]
    (anti-)parallel to one of them (|cos| >= PARALLEL_THRESHOLD with it, verified on the rows
    themselves), or of one row when there is none; None when too
    few or too short rows. Candidates come from sign hashes of the sketch (:func:`_buckets`):
    n m k work, then n m per candidate verified (at most 2 GROUP_SEEDS)."""
    if vectors.shape[1] < MIN_VECTOR:
        return None
    norms = torch.cat([c.norm(dim=1) for c in chunks(vectors)])
    live = torch.nonzero(norms > 0).flatten()
    if live.numel() < PARALLEL_MIN_GROUP:
        return None
    best = live[:0]
    step = max(1, CHUNK // vectors.shape[1])
    for bucket in _buckets(_sketch(vectors, live))[:2 * GROUP_SEEDS]:
        seed = int(live[bucket[0]])
        if bucket.numel() <= best.numel() or bool((best == seed).any()):
            continue
        ref = vectors[seed].double() / norms[seed]
        cos = torch.cat([(vectors[live[i:i + step]].double() @ ref).abs() for i in range(0, live.numel(), step)])
        members = live[cos / norms[live] >= PARALLEL_THRESHOLD]
        if members.numel() > best.numel():
            best = members
    return best if best.numel() else live[:1]   # no group: each row alone


def trap_statistics(rows: torch.Tensor, scale: torch.Tensor | None = None) -> dict[str, float] | None:
    """The trap statistics of ``rows`` [n, d] times ``scale`` [d] (pixel space for a layer
    reading the image), over its non-zero rows."""
    if rows.shape[1] < TRAP_MIN_ROW:
        return None
    z, count, ratio = [], [], []
    for r in chunks(rows, scale):
        norm = r.norm(dim=1)
        r = r[norm > 0]
        if not r.shape[0]:
            continue
        z.append(r.sum(1) / norm[norm > 0])
        npos, nneg = (r > 0).sum(1).double(), (r < 0).sum(1).double()
        # the part of the shift that fewer positive entries explain: N(0, 1) under sign symmetry
        # like z; ~0.8 z when a whole row is shifted, ~0 for trap rows (the shrink keeps every sign)
        count.append((npos - nneg) / (npos + nneg).sqrt())
        mpos = r.clamp(min=0).sum(1) / npos.clamp(min=1)
        mneg = (-r).clamp(min=0).sum(1) / nneg.clamp(min=1)
        ratio.append(mpos / mneg.clamp(min=torch.finfo(r.dtype).tiny))
    zs = torch.cat(z) if z else torch.zeros(0, dtype=torch.float64)
    n = int(zs.numel())
    if n < TRAP_MIN_ROWS:
        return None
    mean_z, count_z = float(zs.mean()), float(torch.cat(count).mean())
    return {"trap_t": mean_z * math.sqrt(n), "trap_mean_z": mean_z, "trap_negative": float((zs < 0).double().mean()),
            "trap_count_t": count_z * math.sqrt(n), "trap_count_share": count_z / mean_z if mean_z else 0.0,
            "trap_magnitude_ratio": float(torch.cat(ratio).clamp(max=1e6).median())}
