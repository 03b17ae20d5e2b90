"""The client's check of the model it received (``gradleak inspect``)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import torch

from ..errors import GradleakError, InputFileError, ModelMismatchError, NonFiniteError, UpdateFileError
from ..paths import atomic_write_files, check_input_file, one_line

FORMAT = "gradleak.received-model"

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
# Scale: a layer's gain over the median gain of ARCH's own layers of its family (weight layers:
# RMS row norm; BatchNorm: median |gamma| / sqrt(running_var + eps)). Honest maximum 3.9 (the
# pretrained EfficientNet-Lite0's BatchNorms; its stem's weights 3.6; the trained convnet 2.6),
# so 20 leaves a factor 5. A block's last BatchNorm scaled by 30 or more is found (x 10 is not:
# ratio 10-15); the imprint block's second layer at its default gain 100 has ratio 566 (64 bins),
# the trap block's 71.
SCALE_RATIO = 20.0
BN_EPS = 1e-5

MAX_MODEL_FILE = 4 * 1024 ** 3   # bytes of a received model file read at most
# The cost of a check is bounded by what the tensors hold: every check is linear in a layer's
# entries (the group search too: hashing, no pairs), and a file may hold ARCH's
# tensors plus at most MAX_EXTRA_TENSORS more (a block in front of the network has a few: the
# imprint and trap blocks 4), refused before any tensor is read.
MAX_EXTRA_TENSORS = 256
# Floating types the checks read (float8 has no arithmetic in torch); integer and bool tensors
# (a BatchNorm's num_batches_tracked) are counted, not read.
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MAX_VALUE = 1e100   # |entry| at most: squared and summed over 10^9 entries it stays finite in float64
                   # (float32 stops at 3.4e38: only a float64 file can go beyond)


# ---------------------------------------------------------------- results
@dataclass(frozen=True)
class Finding:
    """One suspicious structure: the ``check`` that found it, its ``score`` against the
    ``threshold`` (the direction is the check's), and why it is suspicious."""

    check: str
    score: float
    threshold: float
    reason: str


@dataclass
class LayerReport:
    """One layer (a module: the tensors sharing a name prefix) of the received model."""

    name: str
    kind: str                        # linear, conv, batchnorm, norm, other
    shape: list[int]                 # the weight's shape ([] when the layer has none)
    in_arch: bool                    # False: ARCH has no such layer
    reads_image: bool                # its input is the (normalised) image
    stats: dict[str, float] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    @property
    def suspicious(self) -> bool:
        return bool(self.findings)


@dataclass
class Inspection:
    """What :func:`inspect_model` found: every layer with its statistics and findings."""

    arch: str
    prefix: str                      # the name prefix of ARCH's tensors in the file ("" or e.g. "net.")
    input_shape: tuple[int, int, int]
    layers: list[LayerReport]
    path: str | None = None

    @property
    def findings(self) -> list[tuple[str, Finding]]:
        return [(layer.name, f) for layer in self.layers for f in layer.findings]

    @property
    def suspicious(self) -> bool:
        return any(layer.findings for layer in self.layers)

    def to_dict(self) -> dict[str, Any]:
        return {"format": "gradleak.inspection", "file": self.path, "arch": self.arch, "prefix": self.prefix,
                "input_shape": list(self.input_shape), "suspicious": self.suspicious,
                "findings": [{"layer": name, **asdict(f)} for name, f in self.findings],
                "layers": [{"name": layer.name, "kind": layer.kind, "shape": layer.shape, "in_arch": layer.in_arch,
                            "reads_image": layer.reads_image, "stats": layer.stats,
                            "findings": [asdict(f) for f in layer.findings]} for layer in self.layers],
                "thresholds": thresholds(), "null": NULL_MEANS}

    def to_json(self) -> str:
        """:meth:`to_dict` as strict JSON (RFC 8259: no NaN or Infinity, which standard parsers
        refuse); a statistic that is not finite is written null (``NULL_MEANS``)."""
        return json.dumps(json_safe(self.to_dict()), indent=2, allow_nan=False)


NULL_MEANS = ("a statistic written null could not be computed as a finite number: its layer's values overflow "
              "float64 (a gain or norm beyond 1.8e308) or the ratio is undefined (0/0)")


def json_safe(value: Any) -> Any:
    """``value`` (dicts, lists, numbers, strings) with every non-finite float replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def thresholds() -> dict[str, float]:
    """Every threshold of the checks, by name (the JSON report records them)."""
    return {"parallel": PARALLEL_THRESHOLD, "parallel_min_group": PARALLEL_MIN_GROUP, "trap_t": TRAP_T, "trap_mean_z": TRAP_MEAN_Z,
            "trap_negative_fraction": TRAP_NEGATIVE, "trap_count_t": TRAP_COUNT_T,
            "trap_count_share": TRAP_COUNT_SHARE, "scale_ratio": SCALE_RATIO}


# ---------------------------------------------------------------- writing (share --model-out)
def received_model_bytes(state: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> bytes:
    """The safetensors bytes of the model the client received (its state dict, parameters and
    buffers, as the server sent it). ``metadata`` is recorded for the reader's information;
    :func:`inspect_model` never relies on it."""
    from safetensors.torch import save

    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in state.items()}
    return save(tensors, metadata={"format": FORMAT, **{str(k): str(v) for k, v in (metadata or {}).items()}})


def save_received_model(state: Mapping[str, torch.Tensor], path: str | Path, *, force: bool = False,
                        metadata: Mapping[str, str] | None = None) -> None:
    """Write :func:`received_model_bytes` to ``path`` atomically (a temporary file renamed into
    place; nothing half-written). ConfigError if it exists and not ``force``."""
    atomic_write_files({Path(path): received_model_bytes(state, metadata)}, force=force,
                       what={Path(path): "--model-out"})


# ---------------------------------------------------------------- reading
def read_state(path: str | Path, *, max_tensors: int | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, checked: a readable regular file, a sane header, at
    most ``max_tensors`` tensors (counted from the header, before any is read), each readable,
    of a type the checks read, not empty, floating ones finite. UpdateFileError /
    NonFiniteError otherwise."""
    from .files import open_safetensors

    try:
        p = check_input_file(path, "model file", max_bytes=MAX_MODEL_FILE)
    except InputFileError as exc:
        raise UpdateFileError(str(exc)) from None
    handle = open_safetensors(p, "model")  # a sane header first; one UpdateFileError otherwise
    state: dict[str, torch.Tensor] = {}
    with handle as f:
        keys = list(f.keys())
        if max_tensors is not None and len(keys) > max_tensors:
            raise UpdateFileError(f"model file {p} holds {len(keys)} tensors, more than the {max_tensors} the "
                                  f"model and a block in front of it can have; refusing to read them")
        for k in keys:
            try:
                state[k] = f.get_tensor(k)
            except Exception as exc:  # noqa: BLE001 - a truncated data section
                raise UpdateFileError(f"model file {p}: cannot read tensor {one_line(repr(k), 80)}: "
                                      f"{one_line(str(exc), 200)}") from None
    if not state:
        raise UpdateFileError(f"model file {p} holds no tensors")
    check_tensors(state, f"model file {p}: ", UpdateFileError)
    return state


def check_tensors(state: Mapping[str, torch.Tensor], where: str = "",
                  error: type[GradleakError] = ModelMismatchError) -> None:
    """Refuse, before any statistic, a tensor the checks cannot read: a floating type other
    than float16/bfloat16/float32/float64 (float8, complex), an empty one (a layer of no
    values), NaN or Inf (NonFiniteError), values beyond MAX_VALUE (their squares would overflow
    and the statistics read NaN as "nothing found"). ``where`` starts the message; ``error`` is
    its type."""
    for k, t in state.items():
        name = one_line(repr(k), 80)
        if (t.is_floating_point() and t.dtype not in FLOAT_DTYPES) or t.is_complex():
            raise error(f"{where}tensor {name} has dtype {str(t.dtype).removeprefix('torch.')}; a model's "
                        "floating tensors must be float16, bfloat16, float32 or float64")
        if t.numel() == 0:
            raise error(f"{where}tensor {name} is empty (shape {list(t.shape)}); a model's tensors hold values")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise NonFiniteError(f"{where}tensor {name} holds NaN or Inf")
        if t.is_floating_point() and float(t.abs().max()) > MAX_VALUE:
            raise error(f"{where}tensor {name} holds values up to {float(t.abs().max()):.3g}; the checks square a "
                        f"model's values in float64, so they must stay within {MAX_VALUE:g}")


def _check_layer(module: str, t: Mapping[str, torch.Tensor], arch_keys: set[str]) -> None:
    """Refuse a bias or BatchNorm statistic whose shape does not fit its layer's weight (one
    value per output: [weight.shape[0]]); ARCH's own tensors are already checked against ARCH."""
    w = t.get("weight")
    if w is None or w.dim() == 0:
        return
    for name in ("bias", "running_mean", "running_var"):
        x = t.get(name)
        key = f"{module}.{name}" if module else name
        if x is not None and key not in arch_keys and list(x.shape) != [w.shape[0]]:
            raise ModelMismatchError(f"tensor {one_line(repr(key), 80)} has shape {list(x.shape)}; its layer's "
                                     f"weight {list(w.shape)} needs [{w.shape[0]}] (one value per output)")


# ---------------------------------------------------------------- ARCH and the file
def _align(state: Mapping[str, torch.Tensor], arch: Mapping[str, torch.Tensor], name: str) -> str:
    """The prefix under which the file holds every ARCH tensor ("" or e.g. "net."), shapes and
    kinds checked; ModelMismatchError naming the first problem."""
    first = next(iter(arch))
    candidates = [""] + sorted({k[:-len(first)] for k in state if k.endswith("." + first)}, key=len)
    prefix = next((c for c in candidates if all(c + k in state for k in arch)), None)
    if prefix is None:
        missing = sorted(k for k in arch if k not in state)
        raise ModelMismatchError(f"the file does not hold the tensors of model {name} ({len(missing)} missing, "
                                 f"first: {missing[0]}); is --model right?")
    for k, ref in arch.items():
        t = state[prefix + k]
        if tuple(t.shape) != tuple(ref.shape):
            raise ModelMismatchError(f"tensor {prefix + k} has shape {list(t.shape)}, model {name} expects "
                                     f"{list(ref.shape)} (check --num-classes, --channels, --image-size, --width)")
        if t.is_floating_point() != ref.is_floating_point():
            raise ModelMismatchError(f"tensor {prefix + k} has dtype {t.dtype}, model {name} expects "
                                     f"{'a float' if ref.is_floating_point() else 'an integer'} type")
    return prefix


def _module(key: str) -> str:
    return key.rpartition(".")[0]


def _group(keys: Iterable[str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for k in keys:
        groups.setdefault(_module(k), []).append(k)
    return groups


def _kind(tensors: Mapping[str, torch.Tensor]) -> str:
    w = tensors.get("weight")
    if w is None or not w.is_floating_point():
        return "other"
    if w.dim() == 2:
        return "linear"
    if w.dim() >= 3:
        return "conv"
    if w.dim() == 1:
        return "batchnorm" if "running_var" in tensors else "norm"
    return "other"


# ---------------------------------------------------------------- statistics
CHUNK = 1 << 22   # entries converted to float64 at a time (32 MiB): a 224 px trap layer has 10^8


def _chunks(rows: torch.Tensor, scale: torch.Tensor | None = None) -> Iterator[torch.Tensor]:
    """``rows`` [n, m] in float64 blocks of whole rows, each times ``scale`` [m] if given."""
    step = max(1, CHUNK // max(1, rows.shape[1]))
    for i in range(0, rows.shape[0], step):
        block = rows[i:i + step].double()
        yield block if scale is None else block * scale


def _parallel(vectors: torch.Tensor) -> float | None:
    """Median over the non-zero vectors (rows of ``vectors``) of |cos| with their common
    direction (the sign-aligned sum of the unit vectors, aligned on the longest vector); None
    when there are too few or too short vectors to say."""
    if vectors.shape[1] < MIN_VECTOR:
        return None
    norms = torch.cat([c.norm(dim=1) for c in _chunks(vectors)])
    live = norms > 0
    if int(live.sum()) < MIN_VECTORS:
        return None
    ref = vectors[int(torch.argmax(norms))].double()
    ref = ref / ref.norm()
    common = torch.zeros_like(ref)
    start = 0
    for c in _chunks(vectors):
        n = norms[start:start + c.shape[0]]
        start += c.shape[0]
        unit = c[n > 0] / n[n > 0, None]
        signs = torch.where(unit @ ref < 0, -1.0, 1.0).to(unit.dtype)
        common += (unit * signs[:, None]).sum(0)
    if float(common.norm()) == 0:
        return 0.0
    common = common / common.norm()
    cos = torch.cat([(c @ common).abs() for c in _chunks(vectors)])[live] / norms[live]
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


def _parallel_group(vectors: torch.Tensor) -> torch.Tensor | None:
    """The indices of the largest group of PARALLEL_MIN_GROUP or more rows of ``vectors`` [n, m]
    (anti-)parallel to one of them (|cos| >= PARALLEL_THRESHOLD with it, verified on the rows
    themselves), or of one row when there is none; None when too
    few or too short rows. Candidates come from sign hashes of the sketch (:func:`_buckets`):
    n m k work, then n m per candidate verified (at most 2 GROUP_SEEDS)."""
    if vectors.shape[1] < MIN_VECTOR:
        return None
    norms = torch.cat([c.norm(dim=1) for c in _chunks(vectors)])
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


def _trap(rows: torch.Tensor, scale: torch.Tensor | None = None) -> dict[str, float] | None:
    """The trap statistics of ``rows`` [n, d] times ``scale`` [d] (pixel space for a layer
    reading the image), over its non-zero rows."""
    if rows.shape[1] < TRAP_MIN_ROW:
        return None
    z, count, ratio = [], [], []
    for r in _chunks(rows, scale):
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


def _pixel_scale(kind: str, weight: torch.Tensor, input_shape: tuple[int, int, int],
                 std: tuple[float, ...]) -> torch.Tensor:
    """The column scale [m] that puts the flattened rows of a layer reading the normalised image
    into pixel space: x_norm = (x_pix - mean) / std, so w . x_norm = (w / std) . x_pix - const."""
    c, h, wd = input_shape
    inv = 1.0 / torch.tensor(std, dtype=torch.float64)
    if kind == "linear":
        return inv.repeat_interleave(h * wd)
    return inv.repeat_interleave(int(torch.tensor(weight.shape[2:]).prod()) if weight.dim() > 2 else 1)


def _gain(kind: str, t: Mapping[str, torch.Tensor]) -> float | None:
    w = t["weight"]
    if kind in ("linear", "conv"):
        rows = w.flatten(1)
        if not rows.numel():
            return None
        return math.sqrt(sum(float(c.pow(2).sum()) for c in _chunks(rows)) / rows.shape[0])
    w = w.double()
    if kind == "batchnorm":
        var = t["running_var"].double().clamp(min=0)
        return float((w.abs() / (var + BN_EPS).sqrt()).median())
    if kind == "norm":
        return float(w.abs().median())
    return None


def _bias_order(bias: torch.Tensor | None) -> str | None:
    if bias is None or bias.numel() < 2:
        return None
    d = bias.double().diff()
    if bool((d > 0).all()):
        return "increasing"
    if bool((d < 0).all()):
        return "decreasing"
    return "distinct" if int(torch.unique(bias).numel()) == bias.numel() else None


# ---------------------------------------------------------------- the checks
def _group_stats(layer: LayerReport, vectors: torch.Tensor, what: str) -> torch.Tensor | None:
    """Record the largest parallel group of ``vectors`` (``what``: rows, columns) in
    ``layer.stats``; its indices when it is a finding (PARALLEL_MIN_GROUP or more)."""
    group = _parallel_group(vectors)
    if group is None:
        return None
    layer.stats[f"parallel_{what}_group"] = float(group.numel())
    layer.stats[f"parallel_{what}_group_share"] = group.numel() / vectors.shape[0]
    return group if group.numel() >= PARALLEL_MIN_GROUP else None


def _row_findings(layer: LayerReport, rows: torch.Tensor, bias: torch.Tensor | None) -> None:
    """parallel-rows: the whole layer (median) or a group of its rows (the imprint's bins)."""
    image = " (the image)" if layer.reads_image else ""
    par = _parallel(rows)
    if par is not None:
        layer.stats["parallel_rows"] = par
    group = _group_stats(layer, rows, "rows")
    if par is not None and par >= PARALLEL_THRESHOLD:
        order = _bias_order(bias)
        bins = (f"; with {rows.shape[0]} distinct biases ({order} in row order) they cut that projection "
                "into bins: Robbing the Fed's imprint layer, whose gradients hold single inputs"
                if order else "")
        layer.findings.append(Finding(
            "parallel-rows", par, PARALLEL_THRESHOLD,
            f"its {rows.shape[0]} rows are parallel (median |cos| {par:.4f}): every neuron measures the same "
            f"projection of its input{image}{bins}"))
    elif group is not None:
        order = _bias_order(bias[group]) if bias is not None else None
        bins = (f"; with {group.numel()} distinct biases ({order} in row order) they cut that projection into "
                "bins: Robbing the Fed's imprint block hidden among honest rows" if order else "")
        layer.findings.append(Finding(
            "parallel-rows", float(group.numel()), float(PARALLEL_MIN_GROUP),
            f"{group.numel()} of its {rows.shape[0]} rows (first: row {int(group[0])}) are parallel (|cos| >= "
            f"{PARALLEL_THRESHOLD} with one of them): those neurons measure the same projection of their "
            f"input{image}{bins}"))


def _column_findings(layer: LayerReport, w: torch.Tensor) -> None:
    """parallel-columns: the whole layer (median) or a group of its columns."""
    cols = _parallel(w.T)
    if cols is not None:
        layer.stats["parallel_columns"] = cols
    group = _group_stats(layer, w.T, "columns")
    why = ("so the gradients of the neurons feeding it are one scalar per sample times the same vector (the "
           "imprint block's second layer is built so)")
    if cols is not None and cols >= PARALLEL_THRESHOLD:
        layer.findings.append(Finding(
            "parallel-columns", cols, PARALLEL_THRESHOLD,
            f"its {w.shape[1]} columns are parallel (median |cos| {cols:.4f}): every input writes the same "
            f"pattern to the outputs, {why}"))
    elif group is not None:
        layer.findings.append(Finding(
            "parallel-columns", float(group.numel()), float(PARALLEL_MIN_GROUP),
            f"{group.numel()} of its {w.shape[1]} columns (first: column {int(group[0])}) are parallel (|cos| >= "
            f"{PARALLEL_THRESHOLD} with one of them): those inputs write the same pattern to the outputs, {why}"))


def _findings(layer: LayerReport, t: Mapping[str, torch.Tensor], std: tuple[float, ...],
              input_shape: tuple[int, int, int]) -> None:
    """Fill ``layer.stats`` and ``layer.findings`` (all but the scale check)."""
    if layer.kind not in ("linear", "conv"):
        return
    w = t["weight"]
    rows = w.flatten(1)
    _row_findings(layer, rows, t.get("bias"))
    if layer.kind == "linear":
        _column_findings(layer, w)
    if layer.reads_image:
        trap = _trap(rows, _pixel_scale(layer.kind, w, input_shape, std))
        if trap is not None:
            layer.stats.update(trap)
            signs_kept = trap["trap_count_t"] > TRAP_COUNT_T or trap["trap_count_share"] <= TRAP_COUNT_SHARE
            if (trap["trap_t"] <= TRAP_T and trap["trap_mean_z"] <= TRAP_MEAN_Z
                    and trap["trap_negative"] >= TRAP_NEGATIVE and signs_kept):
                layer.findings.append(Finding(
                    "trap-rows", trap["trap_t"], TRAP_T,
                    f"its rows are shifted negative in pixel space: {trap['trap_negative']:.0%} of the row sums are "
                    f"negative, mean standardised row sum {trap['trap_mean_z']:.2f} (z-test over rows "
                    f"{trap['trap_t']:.1f}), positive entries {trap['trap_magnitude_ratio']:.3f} times the negative "
                    "ones in magnitude: trap weights (Boenisch et al.), each neuron fires for few images"))


def _scale_findings(layers: list[LayerReport], gains: dict[str, float]) -> None:
    """Compare each layer's gain with the median gain of ARCH's own layers of its family."""
    family = {"linear": "weights", "conv": "weights", "batchnorm": "batchnorm", "norm": "norm"}
    for fam in set(family.values()):
        ref = sorted(gains[layer.name] for layer in layers
                     if layer.in_arch and family.get(layer.kind) == fam and gains.get(layer.name))
        if not ref:
            continue
        median = ref[len(ref) // 2] if len(ref) % 2 else (ref[len(ref) // 2 - 1] + ref[len(ref) // 2]) / 2
        for layer in layers:
            g = gains.get(layer.name)
            if family.get(layer.kind) != fam or not g or median <= 0:
                continue
            ratio = g / median
            layer.stats["gain"], layer.stats["gain_ratio"] = g, ratio
            if ratio >= SCALE_RATIO:
                what = "BatchNorm scale |gamma|/sqrt(var)" if layer.kind == "batchnorm" else "RMS row norm"
                layer.findings.append(Finding(
                    "scale", ratio, SCALE_RATIO,
                    f"its output is scaled far out of line: {what} {g:.3g} is {ratio:.0f} times the median of the "
                    f"network's {len(ref)} {layer.kind if fam != 'weights' else 'weight'} layers ({median:.3g}): "
                    "it makes its gradients (and those behind it) loud"))


def _arch_state(arch: str, num_classes: int, channels: int, image_size: int | None,
                width: int | None) -> tuple[dict[str, torch.Tensor], int]:
    """ARCH's state dict as meta tensors (shapes only) and its input size."""
    from ..models import default_image_size, model_shapes

    size = image_size or default_image_size(arch)
    arch_state, _ = model_shapes(arch, num_classes=num_classes, channels=channels, image_size=size, width=width)
    return arch_state, size


def inspect_model(state: Mapping[str, torch.Tensor], arch: str, *, num_classes: int, channels: int = 3,
                  image_size: int | None = None, width: int | None = None, path: str | None = None) -> Inspection:
    """Check the received model ``state`` (name -> tensor) against architecture ``arch``.

    Raises UnknownNameError (unknown ``arch``), ModelMismatchError (the file does not hold ARCH's
    tensors, or with other shapes; more than MAX_EXTRA_TENSORS others; a tensor of an unread
    type, empty, or whose shape does not fit its layer), NonFiniteError (NaN/Inf)."""
    from ..models.registry import normalisation

    arch_state, size = _arch_state(arch, num_classes, channels, image_size, width)
    if len(state) > len(arch_state) + MAX_EXTRA_TENSORS:
        raise ModelMismatchError(f"the model holds {len(state)} tensors; model {arch} has {len(arch_state)}, and a "
                                 f"block in front of it at most {MAX_EXTRA_TENSORS} more")
    check_tensors(state)
    mean_std = normalisation(arch, channels)
    prefix = _align(state, arch_state, arch)
    input_shape = (channels, size, size)
    arch_keys = {prefix + k for k in arch_state}
    groups = _group(state)
    arch_modules = list(dict.fromkeys(_module(prefix + k) for k in arch_state))
    extra = set(groups) - set(arch_modules)
    local = {m: _local(state, groups[m], m) for m in groups}
    for m, t in local.items():
        _check_layer(m, t, arch_keys)
    # ARCH's first weight layer reads the image; an added layer does when its input has the image's size
    first = next((m for m in arch_modules if _kind(local[m]) in ("linear", "conv")), None)
    layers, gains = [], {}
    for m in sorted(extra) + arch_modules:
        layer = _layer(m, local[m], arch, in_arch=m not in extra, first=m == first, input_shape=input_shape,
                       added=sorted(k for k in groups[m] if k not in arch_keys), state=state)
        _findings(layer, local[m], mean_std[1], input_shape)
        g = _gain(layer.kind, local[m]) if layer.kind != "other" else None
        if g is not None:
            gains[m] = g
        layers.append(layer)
    _scale_findings(layers, gains)
    return Inspection(arch=arch, prefix=prefix, input_shape=input_shape, layers=layers, path=path)


def _layer(m: str, t: Mapping[str, torch.Tensor], arch: str, *, in_arch: bool, first: bool,
           input_shape: tuple[int, int, int], added: list[str], state: Mapping[str, torch.Tensor]) -> LayerReport:
    """The report of module ``m`` (its tensors ``t`` by local name), with its ``extra`` finding
    when the file holds tensors ARCH lacks (``added``)."""
    channels, h, w_ = input_shape
    kind = _kind(t)
    w = t.get("weight") if kind != "other" else None
    reads = (not in_arch or first) and (
        (kind == "linear" and w.shape[1] == channels * h * w_) or (kind == "conv" and w.shape[1] == channels))
    layer = LayerReport(m, kind, list(w.shape) if w is not None else [], in_arch, bool(reads))
    if added:
        n = sum(int(state[k].numel()) for k in added)
        what = "no such layer" if not in_arch else f"no tensor {', '.join(k[len(m) + 1:] for k in added)} in this layer"
        layer.findings.append(Finding(
            "extra", float(n), 0.0, f"model {arch} has {what} ("
            + (", ".join(sorted(t)) + "; " if not in_arch else "") + f"{n} values)"
            + (": a block in front of the network, reading the image" if reads else "")))
    return layer


def _local(state: Mapping[str, torch.Tensor], keys: list[str], module: str) -> dict[str, torch.Tensor]:
    cut = len(module) + 1 if module else 0
    return {k[cut:]: state[k] for k in keys}


def inspect_file(path: str | Path, arch: str, *, num_classes: int, channels: int = 3, image_size: int | None = None,
                 width: int | None = None) -> Inspection:
    """:func:`inspect_model` on a safetensors file (:func:`read_state`). Raises UpdateFileError
    (missing, truncated, not safetensors), NonFiniteError, ModelMismatchError, UnknownNameError."""
    p = Path(path)
    arch_state, _ = _arch_state(arch, num_classes, channels, image_size, width)
    state = read_state(p, max_tensors=len(arch_state) + MAX_EXTRA_TENSORS)
    try:
        return inspect_model(state, arch, num_classes=num_classes, channels=channels, image_size=image_size,
                             width=width, path=str(p))
    except ModelMismatchError as exc:
        raise ModelMismatchError(f"model file {p}: {exc}") from None


__all__ = ["Finding", "Inspection", "LayerReport", "check_tensors", "inspect_file", "inspect_model", "json_safe",
           "read_state", "received_model_bytes", "save_received_model", "thresholds"]
