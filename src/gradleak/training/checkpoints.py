"""Training checkpoints as files: a model's weights in safetensors with gradleak's metadata, read
back as untrusted input (metadata, names, shapes and dtypes checked before any tensor is read)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import torch

from ..errors import ModelMismatchError, NonFiniteError, UpdateFileError
from ..fl.files import FLOAT_DTYPES, open_safetensors
from ..models import ModelSpec, build_model, model_names
from ..paths import loads_json, one_line
from .config import is_int

CHECKPOINT_FORMAT = "gradleak.checkpoint"
CHECKPOINT_FORMAT_VERSION = "1"


def checkpoint_bytes(model: ModelSpec, meta: dict[str, Any]) -> bytes:
    from safetensors.torch import save

    # clone: safetensors refuses tensors sharing storage (tied weights); contiguous CPU copies
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in model.module.state_dict().items()}
    return save(tensors, metadata={"format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_FORMAT_VERSION,
                                   "meta": json.dumps(meta, allow_nan=False)})


def _validate_meta(md: dict[str, str] | None, path: Path) -> dict[str, Any]:
    md = md or {}
    if md.get("format") != CHECKPOINT_FORMAT:
        raise UpdateFileError(f"{path} is a safetensors file but not a gradleak checkpoint "
                              f"(format={one_line(repr(md.get('format')), 60)})")
    if md.get("format_version") != CHECKPOINT_FORMAT_VERSION:
        raise UpdateFileError(f"{path}: unsupported checkpoint format version {one_line(repr(md.get('format_version')), 60)}")
    # every JSON failure (syntax, deep nesting, an integer of too many digits) is one line
    meta = loads_json(md.get("meta", ""), f"{path}: checkpoint metadata", error=UpdateFileError)

    def bad(field_: str, want: str) -> UpdateFileError:
        value = meta.get(field_) if isinstance(meta, dict) else None
        return UpdateFileError(f"{path}: checkpoint metadata field {field_!r} must be {want}, "
                               f"got {one_line(repr(value), 80)}")

    if not isinstance(meta, dict):
        raise UpdateFileError(f"{path}: checkpoint metadata must be a JSON object")
    _check_meta_model(meta, bad)
    shape = _check_meta_input(meta, bad)
    frac = meta.get("fraction")
    if not isinstance(frac, (int, float)) or isinstance(frac, bool) or not 0 <= frac <= 1:
        raise bad("fraction", "a number in [0, 1]")
    if not is_int(meta.get("step")) or meta["step"] < 0:
        raise bad("step", "an integer >= 0")
    meta["input_shape"] = tuple(shape)
    meta["mean"], meta["std"] = tuple(float(x) for x in meta["mean"]), tuple(float(x) for x in meta["std"])
    return meta


def _check_meta_model(meta: dict[str, Any], bad: Callable[[str, str], UpdateFileError]) -> None:
    """model, model_kwargs (defaulted to {}) and num_classes, within the bounds of what training
    writes (and of an update file's metadata, fl.files): a file never makes gradleak build an
    absurd model."""
    if not isinstance(meta.get("model"), str) or not meta["model"]:
        raise bad("model", "a model name")
    if not isinstance(meta.get("model_kwargs", {}), dict):
        raise bad("model_kwargs", "an object")
    meta.setdefault("model_kwargs", {})
    width = meta["model_kwargs"].get("width")
    if width is not None and (not is_int(width) or not 1 <= width <= 4096):
        raise bad("model_kwargs", "an object with an integer width in 1..4096")
    if not is_int(meta.get("num_classes")) or not 2 <= meta["num_classes"] <= 100_000:
        raise bad("num_classes", "an integer in 2..100000")


def _check_meta_input(meta: dict[str, Any], bad: Callable[[str, str], UpdateFileError]) -> list[int]:
    """input_shape (a square [C, H, W]) and the per-channel normalisation mean and std; returns the shape."""
    shape = meta.get("input_shape")
    if (not isinstance(shape, list) or len(shape) != 3 or not all(is_int(s) and s >= 1 for s in shape)
            or not 1 <= shape[0] <= 4 or not all(4 <= s <= 1024 for s in shape[1:])):
        raise bad("input_shape", "[C, H, W] integers (1-4 channels, 4..1024 px)")
    if shape[1] != shape[2]:
        raise bad("input_shape", "a square image shape")
    for key in ("mean", "std"):
        v = meta.get(key)
        if (not isinstance(v, list) or len(v) != shape[0]
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v)):
            raise bad(key, f"{shape[0]} finite numbers (one per channel)")
    if min(meta["std"]) <= 0:
        raise bad("std", "positive numbers")
    return shape


def read_checkpoint_meta(path: str | Path) -> dict[str, Any]:
    """Only the validated metadata of a checkpoint (no tensor is read)."""
    p = Path(path)
    with open_safetensors(p, "checkpoint") as f:
        return _validate_meta(f.metadata(), p)


def load_checkpoint(path: str | Path, *, trust_model_code: bool = False) -> tuple[ModelSpec, dict[str, Any]]:
    """Rebuild the checkpoint's model and load its weights: (ModelSpec in eval mode, metadata).

    The file is treated as untrusted: it must exist and be safetensors (sane header length), its
    metadata must be a gradleak checkpoint, and every tensor name, shape and dtype is checked
    against the rebuilt model's state_dict before any tensor is read; no pickle is ever loaded.
    A model named ``package.module:callable`` would import and run that code, so it is refused
    unless ``trust_model_code`` is True. Raises UpdateFileError (missing, truncated, not a
    checkpoint, user code not trusted), ModelMismatchError (tensors that do not fit the model, or
    normalisation that differs from the registry's), NonFiniteError (NaN/Inf), UnknownNameError
    (unknown model name).
    """
    p = Path(path)
    with open_safetensors(p, "checkpoint") as f:
        meta = _validate_meta(f.metadata(), p)
        spec = _rebuild_model(p, meta, trust_model_code)
        state = spec.module.state_dict()
        _check_tensor_layout(p, f, state, meta["model"])
        tensors = _read_tensors(p, f, state)
    for k, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise NonFiniteError(f"{p}: checkpoint tensor {k!r} holds NaN or Inf")
    try:
        spec.module.load_state_dict({k: v.to(state[k].dtype) for k, v in tensors.items()})
    except RuntimeError as exc:
        raise ModelMismatchError(f"{p}: weights do not fit model {meta['model']}: {exc}") from None
    spec.module.eval()
    return spec, meta


def _rebuild_model(p: Path, meta: dict[str, Any], trust_model_code: bool) -> ModelSpec:
    """The model the checkpoint's metadata names, built as training built it; its kwargs and
    normalisation must be what the metadata records. A user model (``package.module:callable``)
    only where its code is trusted, since building it imports and runs that code."""
    if ":" in meta["model"] and meta["model"] not in model_names() and not trust_model_code:
        raise UpdateFileError(f"{p}: checkpoint names the user model {meta['model']!r}, which would import "
                              "and run its code; pass trust_model_code=True if you trust this file")
    c, h, _ = meta["input_shape"]
    try:
        spec = build_model(meta["model"], num_classes=meta["num_classes"], channels=c, image_size=h,
                           width=meta["model_kwargs"].get("width"))
    except ModelMismatchError as exc:
        raise ModelMismatchError(f"{p}: cannot rebuild model {meta['model']}: {exc}") from None
    if dict(spec.kwargs) != dict(meta["model_kwargs"]):
        raise ModelMismatchError(f"{p}: model_kwargs {meta['model_kwargs']} are not what {meta['model']} "
                                 f"is built with ({spec.kwargs})")
    for key in ("mean", "std"):
        if any(abs(a - b) > 1e-6 for a, b in zip(getattr(spec, key), meta[key], strict=False)):
            raise ModelMismatchError(f"{p}: checkpoint normalisation {key}={list(meta[key])} differs from "
                                     f"model {meta['model']}'s {list(getattr(spec, key))}")
    return spec


def _check_tensor_layout(p: Path, f: Any, state: dict[str, torch.Tensor], model: str) -> None:
    """Every tensor of the model's state_dict and no other, each of the model's shape and kind of
    dtype (float or integer), checked from the header before any tensor is read."""
    keys = set(f.keys())
    missing, unknown = sorted(set(state) - keys), sorted(keys - set(state))
    if missing:
        raise ModelMismatchError(f"{p}: checkpoint lacks {len(missing)} tensors of model {model} "
                                 f"(first: {missing[0]})")
    if unknown:
        raise ModelMismatchError(f"{p}: checkpoint has tensors that model {model} does not have "
                                 f"(first: {unknown[0]})")
    for k, ref in state.items():
        sl = f.get_slice(k)
        shape, dtype = tuple(int(s) for s in sl.get_shape()), str(sl.get_dtype())
        if shape != tuple(ref.shape):
            raise ModelMismatchError(f"{p}: tensor {k} has shape {list(shape)}, model {model} "
                                     f"expects {list(ref.shape)}")
        if ref.is_floating_point() != (dtype in FLOAT_DTYPES):
            want = "a float" if ref.is_floating_point() else "an integer"
            raise ModelMismatchError(f"{p}: tensor {k} has dtype {dtype}, expected {want} type")


def _read_tensors(p: Path, f: Any, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state_dict's tensors from the file; a truncated data section is an UpdateFileError."""
    tensors: dict[str, torch.Tensor] = {}
    for k in state:
        try:
            tensors[k] = f.get_tensor(k)
        except Exception as exc:  # noqa: BLE001 - truncated data section
            raise UpdateFileError(f"{p}: cannot read tensor {k!r}: {exc}") from None
    return tensors


def apply_checkpoint(model: ModelSpec, path: str | Path) -> dict[str, Any]:
    """Load the weights (and buffers) of checkpoint ``path`` into ``model.module``; returns its metadata.

    The checkpoint must be of the same architecture: model name, model kwargs, num_classes and
    input_shape, else ModelMismatchError (checked from the metadata before any tensor is read).
    """
    p = Path(path)
    meta = read_checkpoint_meta(p)
    ours = {"model": model.name, "model_kwargs": dict(model.kwargs), "num_classes": model.num_classes,
            "input_shape": tuple(model.input_shape)}
    for key, value in ours.items():
        theirs = dict(meta[key]) if key == "model_kwargs" else meta[key]
        if theirs != value:
            raise ModelMismatchError(f"{p}: checkpoint is for {key}={theirs!r}, the model has {key}={value!r}")
    spec, meta = load_checkpoint(p, trust_model_code=True)  # the caller already built this very model
    try:
        model.module.load_state_dict(spec.module.state_dict())
    except RuntimeError as exc:
        raise ModelMismatchError(f"{p}: weights do not fit model {model.name}: {exc}") from None
    return meta



__all__ = ["CHECKPOINT_FORMAT", "CHECKPOINT_FORMAT_VERSION", "apply_checkpoint", "checkpoint_bytes", "load_checkpoint",
           "read_checkpoint_meta"]
