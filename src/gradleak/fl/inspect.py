"""The client's check of the model it received (``gradleak inspect``)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch

from ..errors import GradleakError, InputFileError, ModelMismatchError, NonFiniteError, UpdateFileError
from ..paths import atomic_write_files, check_input_file, one_line
from .layer_statistics import (PARALLEL_MIN_GROUP, PARALLEL_THRESHOLD, TRAP_COUNT_SHARE,
                               TRAP_COUNT_T, TRAP_MEAN_Z, TRAP_NEGATIVE, TRAP_T, chunks,
                               parallel_group, parallel_median, trap_statistics)

FORMAT = "gradleak.received-model"

# ---------------------------------------------------------------- thresholds (see the module's notes in docs/)
# The parallel and trap thresholds live beside their statistics (layer_statistics.py), measured
# by benchmarks/inspect_models.py on the same models as the scale ratio here.
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
        return math.sqrt(sum(float(c.pow(2).sum()) for c in chunks(rows)) / rows.shape[0])
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
    group = parallel_group(vectors)
    if group is None:
        return None
    layer.stats[f"parallel_{what}_group"] = float(group.numel())
    layer.stats[f"parallel_{what}_group_share"] = group.numel() / vectors.shape[0]
    return group if group.numel() >= PARALLEL_MIN_GROUP else None


def _row_findings(layer: LayerReport, rows: torch.Tensor, bias: torch.Tensor | None) -> None:
    """parallel-rows: the whole layer (median) or a group of its rows (the imprint's bins)."""
    image = " (the image)" if layer.reads_image else ""
    par = parallel_median(rows)
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
    cols = parallel_median(w.T)
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
        trap = trap_statistics(rows, _pixel_scale(layer.kind, w, input_shape, std))
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
