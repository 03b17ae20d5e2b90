"""Reading and writing shared updates and truth files (safetensors + JSON metadata) of every
modality through one API, without executing code, every declared shape checked against the
model before a tensor is loaded. A modality's own parts are its :class:`UpdateFiles` hooks."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from pydantic import TypeAdapter, ValidationError
from safetensors import safe_open
from safetensors.torch import save

from ..data.batch import Batch
from ..errors import (ConfigError, GradleakError, InputFileError, ModelMismatchError, NonFiniteError, UnknownNameError,
                      UpdateFileError)
from ..models import ModelSpec, build_model, model_shapes
from ..paths import atomic_write_files, check_input_file, loads_json, one_line
from .threats import ThreatModel
from .update import FORMAT, FORMAT_VERSION, SharedUpdate, UpdateMeta, atomic_write_bytes, is_finite_dict

TRUTH_FORMAT = "gradleak.truth"
_MAX_HEADER = 64 * 1024 * 1024
FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}


# ---------------------------------------------------------------- the modalities' hooks
@dataclass(frozen=True, eq=False)
class UpdateFiles:
    """One modality's update and truth files: what the shared reading and writing code cannot
    know. The image modality's is :data:`IMAGE_FILES`; another modality's module registers its
    own (:func:`register_update_files`) when it is imported.

    update_format, truth_format: the metadata ``format`` of its update and truth files.
    update_name, version_name:   how errors name its update ("not a gradleak {update_name}",
                                 "unsupported {version_name} format version").
    check_meta:     (meta, path): UpdateFileError for metadata it cannot hold (after validation).
    build_model:    (handle, path, meta, user_model) -> (what load_update returns as the model,
                    its nn.Module), built from the metadata alone (no tensor read yet).
    bn_statistics:  its updates may hold ``bn/<layer>/mean|var`` tensors.
    batch_type, truth_record: its truth batch class; batch -> (tensors, metadata but ``format``).
    truth_kind, truth_keys, truth_holds: "not a gradleak {truth_kind} file", the exact tensors of
                    a truth file, and how the error says so.
    read_truth:     (path, handle, metadata, meta or None, model or None) -> batch, the header
                    format and tensor names already checked.
    """

    modality: str
    update_format: str
    truth_format: str
    update_name: str
    version_name: str
    check_meta: Callable[[UpdateMeta, Path], None]
    build_model: Callable[[Any, Path, UpdateMeta, str | None], tuple[Any, torch.nn.Module]]
    batch_type: type
    truth_record: Callable[[Any], tuple[dict[str, torch.Tensor], dict[str, str]]]
    truth_kind: str
    truth_keys: tuple[str, ...]
    truth_holds: str
    read_truth: Callable[..., Any]
    bn_statistics: bool = False
    format_version: str = str(FORMAT_VERSION)


_FILES: dict[str, UpdateFiles] = {}


def register_update_files(files: UpdateFiles) -> UpdateFiles:
    """Declare a modality's update files (the first registered, image, is the default)."""
    _FILES[files.modality] = files
    return files


def update_files(modality: str) -> UpdateFiles:
    """The registered update files of ``modality`` (UnknownNameError naming the known ones)."""
    try:
        return _FILES[modality]
    except (KeyError, TypeError):
        raise UnknownNameError(f"no update file format for modality {modality!r}; known: {', '.join(_FILES)}") from None


def _default() -> UpdateFiles:
    return next(iter(_FILES.values()))


def meta_modality(meta: UpdateMeta) -> str:
    """The modality an update's metadata names (``model_kwargs.modality``; none: the default)."""
    name = meta.model_kwargs.get("modality")
    return name if isinstance(name, str) and name in _FILES else _default().modality


def _of_format(fmt: object, key: str) -> UpdateFiles | None:
    return next((files for files in _FILES.values() if getattr(files, key) == fmt), None)


# ---------------------------------------------------------------- writing
def update_bytes(update: SharedUpdate, *, modality: str | None = None) -> bytes:
    """The safetensors bytes of ``update`` of any modality (``modality``, default the one its
    metadata names): tensors under grad/, weights/, bn/; metadata JSON; the modality's format."""
    files = update_files(modality if modality is not None else meta_modality(update.meta))
    tensors: dict[str, torch.Tensor] = {}
    for k, v in update.gradients.items():
        tensors[f"grad/{k}"] = v.detach().cpu().contiguous()
    for k, v in update.global_weights.items():
        tensors[f"weights/{k}"] = v.detach().cpu().contiguous()
    for k, (mean, var) in update.bn_statistics.items():
        tensors[f"bn/{k}/mean"] = mean.detach().cpu().contiguous()
        tensors[f"bn/{k}/var"] = var.detach().cpu().contiguous()
    meta = {"format": files.update_format, "format_version": files.format_version,
            "meta": json.dumps(update.meta.to_dict(), allow_nan=False)}
    return save(tensors, metadata=meta)


def truth_bytes(batch: Any) -> bytes:
    """The safetensors bytes of the client's true batch of any modality (for later evaluation
    only): the tensors and metadata its modality's ``truth_record`` gives, under its format."""
    files = next((f for f in reversed(_FILES.values()) if isinstance(batch, f.batch_type)), None)
    if files is None:
        raise UnknownNameError(f"no truth file format for a {type(batch).__name__}")
    tensors, md = files.truth_record(batch)
    return save(tensors, metadata={"format": files.truth_format, **md})


def save_update(update: SharedUpdate, path: str | Path, *, modality: str | None = None) -> None:
    """Write ``update`` (any modality, as :func:`update_bytes`) to ``path`` atomically (replacing
    a file there). To write an update and its truth file together, all or none, see :func:`save_shared`."""
    atomic_write_bytes(path, update_bytes(update, modality=modality))


def save_truth(batch: Any, path: str | Path) -> None:
    """Write the client's true batch of any modality (for later evaluation only), atomically."""
    atomic_write_bytes(path, truth_bytes(batch))


def save_shared(update_data: bytes, update_path: str | Path, truth_data: bytes | None = None,
                truth_path: str | Path | None = None, *, force: bool = False,
                names: tuple[str, str] = ("--out", "--truth")) -> None:
    """``gradleak share``'s files: the update (and its truth file) written all or none, each
    through a temporary file beside it, renamed into place with SIGINT/SIGTERM held
    (paths.atomic_write_files). ``force`` False: an existing file is never replaced (ConfigError
    "``names[i]`` PATH exists; pass --force to replace it", nothing written)."""
    files = {Path(update_path): update_data}
    what = {Path(update_path): names[0]}
    if truth_path is not None and truth_data is not None:
        files[Path(truth_path)] = truth_data
        what[Path(truth_path)] = names[1]
    atomic_write_files(files, force=force, what=what)


# ---------------------------------------------------------------- reading
def open_safetensors(path: str | Path, what: str):  # noqa: ANN201 - safetensors handle
    """A safetensors handle on ``path`` (``what``: "update", "truth", "checkpoint"), opened only
    after the path is a readable regular file and its declared header length is sane; every
    failure is one UpdateFileError. Nothing is unpickled, nothing executed."""
    try:
        p = check_input_file(path, f"{what} file")
    except InputFileError as exc:
        raise UpdateFileError(str(exc)) from None
    size = p.stat().st_size
    with p.open("rb") as fh:
        head = fh.read(8)
    if len(head) < 8:
        raise UpdateFileError(f"{what} {p} is not a safetensors file (only {size} bytes)")
    (n,) = struct.unpack("<Q", head)
    if n > _MAX_HEADER or n + 8 > size:
        raise UpdateFileError(f"{what} {p} is not a valid safetensors file (declared header of {n} bytes, "
                              f"file has {size})")
    try:
        return safe_open(str(p), framework="pt", device="cpu")
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types
        raise UpdateFileError(f"{what} {p} is not a valid safetensors file: {exc}") from None


def tensor_shape_dtype(handle: Any, key: str) -> tuple[tuple[int, ...], str]:
    """A tensor's shape and safetensors dtype name, read from the header without loading it."""
    sl = handle.get_slice(key)
    return tuple(int(s) for s in sl.get_shape()), str(sl.get_dtype())


def read_tensor(handle: Any, key: str, path: Path) -> torch.Tensor:
    """One tensor of an open file; a truncated data section is an UpdateFileError."""
    try:
        return handle.get_tensor(key)
    except Exception as exc:  # noqa: BLE001 - truncated data section
        raise UpdateFileError(f"{path}: cannot read tensor {key!r}: {exc}") from None


def read_update_meta(path: str | Path, *, modality: str | None = None) -> UpdateMeta:
    """Only the public metadata of an update file (validated); ``modality`` as :func:`load_update`."""
    with open_safetensors(path, "update") as f:
        return _meta(f, Path(path), modality)[1]


def _files_of_update(md: dict[str, str], path: Path, modality: str | None) -> UpdateFiles:
    """The modality whose update ``md`` is: the one asked for, else the one its ``format`` names
    (an unknown format is the default modality's error)."""
    fmt = md.get("format")
    found = _of_format(fmt, "update_format")
    if modality is None:
        return found if found is not None else _default()
    files = update_files(modality)
    declared = _declared_modality(fmt)
    if found is None and declared is not None and declared != files.modality:   # its module not imported
        raise UpdateFileError(f"{path} is {'an' if declared[0] in 'aeiou' else 'a'} {declared} update; attack it with "
                              f"--modality {declared}")
    if found is not None and found is not files and found is _default():
        raise UpdateFileError(f"{path} is {'an' if found.modality[0] in 'aeiou' else 'a'} {found.modality} update; "
                              f"attack it without --modality {files.modality}")
    return files


def _declared_modality(fmt: object) -> str | None:
    """The modality whose MODALITY_SPEC declares ``fmt`` as its update files' format (read without
    importing the modality: specs.declarations), or None."""
    from ..specs import declarations

    return next((name for name, d in declarations("modality").items() if d.get("update_format") == fmt), None)


def _meta(f: Any, path: Path, modality: str | None = None) -> tuple[UpdateFiles, UpdateMeta]:
    """The file's modality and its validated metadata, checked by that modality's ``check_meta``."""
    md = f.metadata() or {}
    files = _files_of_update(md, path, modality)
    if md.get("format") != files.update_format:
        raise UpdateFileError(f"{path} is a safetensors file but not a gradleak {files.update_name} "
                              f"(format={one_line(repr(md.get('format')), 60)})")
    if md.get("format_version") != files.format_version:
        raise UpdateFileError(f"{path}: unsupported {files.version_name} format version "
                              f"{one_line(repr(md.get('format_version')), 60)}")
    # every JSON failure (syntax, deep nesting, an integer of too many digits) is one line
    raw = loads_json(md.get("meta", ""), f"{path}: metadata", error=UpdateFileError)
    try:
        meta = TypeAdapter(UpdateMeta).validate_python(raw, strict=False)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"]) or "meta"
        raise UpdateFileError(f"{path}: metadata field {field!r}: {err['msg']}") from None
    files.check_meta(meta, path)
    return files, meta


def _check_image_meta(meta: UpdateMeta, path: Path) -> None:
    """An image update's metadata: a (C, H, W) input in bounds, its normalisation, no BN buffers."""
    if len(meta.input_shape) != 3 or min(meta.input_shape) < 1:
        raise UpdateFileError(f"{path}: metadata input_shape {meta.input_shape} is not (C, H, W)")
    check_meta_bounds(meta, path)
    if meta.bn_buffers_shared:
        raise UpdateFileError(f"{path}: metadata says BN buffers are shared, but an update file holds no buffers")
    if len(meta.mean) != meta.input_shape[0] or len(meta.std) != meta.input_shape[0] or min(meta.std) <= 0:
        raise UpdateFileError(f"{path}: metadata normalisation does not fit {meta.input_shape[0]} channels")


# The bounds of `gradleak attack`'s own flags: a file may not ask for more than a user could.
MAX_BATCH, MAX_CLASSES, MAX_WIDTH = 4096, 100_000, 4096
MAX_BATCH_ELEMENTS = 1 << 27  # K x C x H x W of the batch an attack rebuilds (512 MiB in float32)


def check_meta_bounds(meta: UpdateMeta, path: Path, *, image: bool = True) -> None:
    """Well-typed but absurd metadata (a batch of 10**9, 10**12 classes, a FedAvg run of 10**9
    local steps, 5 clients over 1 sample) is refused before anything is built or allocated."""
    if not 1 <= meta.batch_size <= MAX_BATCH:
        raise UpdateFileError(f"{path}: metadata batch_size {meta.batch_size} is out of range (1..{MAX_BATCH})")
    if not 2 <= meta.num_classes <= MAX_CLASSES:
        raise UpdateFileError(f"{path}: metadata num_classes {meta.num_classes} is out of range (2..{MAX_CLASSES})")
    width = meta.model_kwargs.get("width")
    if width is not None and (isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= MAX_WIDTH):
        raise UpdateFileError(f"{path}: metadata model_kwargs.width {width!r} is not an integer in 1..{MAX_WIDTH}")
    unknown = sorted(set(meta.model_kwargs) - {"width", "server"})
    if image and unknown:
        raise UpdateFileError(f"{path}: metadata model_kwargs has unknown key {unknown[0]!r}")
    server = meta.model_kwargs.get("server")
    if image and server is not None:
        from ..server_spec import parse_server  # what the server sent (models/server.py builds it)

        if not isinstance(server, str):
            raise UpdateFileError(f"{path}: metadata model_kwargs.server {server!r} is not text")
        try:
            parse_server(server)
        except GradleakError as exc:
            raise UpdateFileError(f"{path}: metadata model_kwargs.server: {exc}") from None
    if not image:  # text: (tokens per sentence, 1, 1)
        if len(meta.input_shape) != 3 or not 1 <= meta.input_shape[0] <= 4096:
            raise UpdateFileError(f"{path}: metadata input_shape {list(meta.input_shape)} is out of range")
    elif len(meta.input_shape) == 3:
        c, h, w = meta.input_shape
        if not (1 <= c <= 4 and 4 <= h <= 1024 and 4 <= w <= 1024):
            raise UpdateFileError(f"{path}: metadata input_shape {list(meta.input_shape)} is out of range "
                                  "(1-4 channels, 4..1024 px)")
        if meta.batch_size * c * h * w > MAX_BATCH_ELEMENTS:
            raise UpdateFileError(f"{path}: metadata asks for a batch of {meta.batch_size} x {list(meta.input_shape)}, "
                                  f"more than {MAX_BATCH_ELEMENTS} values to rebuild")
    try:
        cbs = meta.threat.get("client_batch_size") if isinstance(meta.threat, dict) else None
        if cbs is not None and (isinstance(cbs, bool) or not isinstance(cbs, int)):
            raise ConfigError("client_batch_size is not an integer")
        ThreatModel.from_record(meta.threat).check_batch(meta.batch_size, cbs)
    except GradleakError as exc:
        raise UpdateFileError(f"{path}: metadata threat: {exc}") from None


def check_update_header(f: Any, p: Path, model_name: str, state: dict[str, torch.Tensor],
                        params: dict[str, torch.Tensor], *, ignore: set[str] = frozenset()) -> set[str]:
    """Check an open update file's tensor names, shapes and dtypes against the model from the
    header alone, before any tensor is read: one ``weights/<name>`` per state entry and one
    ``grad/<name>`` per trainable parameter (keys in ``ignore`` are checked by the caller).
    Returns the expected keys; raises ModelMismatchError naming the first problem."""
    keys = set(f.keys())
    expected = {f"weights/{k}" for k in state} | {f"grad/{k}" for k in params}
    missing, unknown = sorted(expected - keys), sorted(keys - expected - set(ignore))
    if missing:
        raise ModelMismatchError(f"{p}: update lacks {len(missing)} tensors of model {model_name} (first: {missing[0]})")
    if unknown:
        raise ModelMismatchError(f"{p}: update has tensors that model {model_name} does not have (first: {unknown[0]})")
    for k in sorted(expected):
        kind, _, name = k.partition("/")
        ref = state[name] if kind == "weights" else params[name]
        shape, dtype = tensor_shape_dtype(f, k)
        if shape != tuple(ref.shape):
            raise ModelMismatchError(f"{p}: tensor {k} has shape {list(shape)}, model {model_name} expects {list(ref.shape)}")
        if ref.is_floating_point() and dtype not in FLOAT_DTYPES:
            raise ModelMismatchError(f"{p}: tensor {k} has dtype {dtype}, expected a float type")
        if not ref.is_floating_point() and dtype in FLOAT_DTYPES:
            raise ModelMismatchError(f"{p}: tensor {k} has dtype {dtype}, expected an integer type")
    return expected


def _check_model_names(meta: UpdateMeta, p: Path, user_model: str | None) -> tuple[int, int]:
    """(C, H) of the update's square input, once its model name is one gradleak may build: a
    ``module:callable`` only when the caller chose that same model (UpdateFileError otherwise)."""
    if ":" in meta.model and meta.model != user_model:
        raise UpdateFileError(f"{p}: the update names the user model {meta.model!r}; gradleak never imports "
                              f"code a file names (to use your own model, pass --model {meta.model} yourself)")
    if user_model is not None and ":" in user_model and meta.model != user_model:
        raise UpdateFileError(f"{p}: the update is for model {meta.model!r}, not --model {user_model}")
    c, h, w = meta.input_shape
    if h != w:
        raise UpdateFileError(f"{p}: only square inputs are supported, got {meta.input_shape}")
    return c, h


def _read_bn_statistics(f: Any, p: Path, model: str, module: torch.nn.Module, keys: set[str],
                        bn_keys: set[str]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{BatchNorm layer: (mean, var)} from the file's ``bn/<layer>/mean|var`` tensors, each checked
    to name a BatchNorm layer of ``module`` and fit its features before any is read."""
    bn_modules = {n: m for n, m in module.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)}
    bn_stats: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for k in sorted(bn_keys):
        _, _, rest = k.partition("/")
        mod, _, stat = rest.rpartition("/")
        if mod not in bn_modules or stat not in ("mean", "var"):
            raise ModelMismatchError(f"{p}: {k} names no BatchNorm layer of model {model}")
        shape, dtype = tensor_shape_dtype(f, k)
        if shape != (bn_modules[mod].num_features,) or dtype not in FLOAT_DTYPES:
            raise ModelMismatchError(f"{p}: {k} has shape {list(shape)}/{dtype}, expected [{bn_modules[mod].num_features}] float")
    for mod in {k.partition('/')[2].rpartition('/')[0] for k in bn_keys}:
        if f"bn/{mod}/mean" not in keys or f"bn/{mod}/var" not in keys:
            raise ModelMismatchError(f"{p}: BN statistics of {mod} need both mean and var")
        bn_stats[mod] = (read_tensor(f, f"bn/{mod}/mean", p), read_tensor(f, f"bn/{mod}/var", p))
    return bn_stats


def _image_model(f: Any, p: Path, meta: UpdateMeta, user_model: str | None) -> tuple[ModelSpec, torch.nn.Module]:
    """The image update's model: first on torch's meta device (no memory), the file's tensor
    shapes checked against it, then built for real (the global weights are loaded by the caller)."""
    c, h = _check_model_names(meta, p, user_model)
    kw = dict(num_classes=meta.num_classes, channels=c, image_size=h, width=meta.model_kwargs.get("width"),
              server=meta.model_kwargs.get("server"))
    shapes_state, shapes_params = model_shapes(meta.model, **kw)
    check_update_header(f, p, meta.model, shapes_state, shapes_params,
                        ignore={k for k in f.keys() if k.startswith("bn/")})
    spec = build_model(meta.model, **kw)
    return spec, spec.module


def load_update(path: str | Path, *, modality: str | None = None,
                user_model: str | None = None) -> tuple[SharedUpdate, Any]:
    """Load and validate a shared update of any modality; rebuild its model with the global
    weights loaded. Returns (update, model): an image update's ModelSpec, a text update's
    TextModel (whatever the modality's ``build_model`` hook builds).

    ``modality``: the modality the caller expects (a file of another one is refused, naming what
    it is); None: the one the file's ``format`` names. A file never makes gradleak import or call
    code: an image update naming a ``module:callable`` model is refused unless the caller itself
    chose that model (``user_model``, e.g. the command line's ``--model``), and the names must then
    be equal. The file's tensor names, shapes and dtypes are checked against the model before a
    tensor is read.

    Raises UpdateFileError (not safetensors, truncated, wrong metadata, code named by the file),
    ModelMismatchError (tensors that do not fit the model), NonFiniteError (NaN/Inf),
    UnknownNameError (model).
    """
    p = Path(path)
    with open_safetensors(p, "update") as f:
        files, meta = _meta(f, p, modality)
        model, module = files.build_model(f, p, meta, user_model)
        keys = set(f.keys())
        state = module.state_dict()
        params = {n: q for n, q in module.named_parameters() if q.requires_grad}
        bn_keys = {k for k in keys if k.startswith("bn/")} if files.bn_statistics else set()
        check_update_header(f, p, meta.model, state, params, ignore=bn_keys)  # the real model too
        bn_stats = _read_bn_statistics(f, p, meta.model, module, keys, bn_keys) if bn_keys else {}
        weights = {k: read_tensor(f, f"weights/{k}", p) for k in state}
        grads = {k: read_tensor(f, f"grad/{k}", p) for k in params}
    for what, tensors in (("weights", weights), ("gradient", grads),
                          ("BN statistics", {k: torch.stack(v) for k, v in bn_stats.items()})):
        bad = is_finite_dict(tensors)
        if bad is not None:
            raise NonFiniteError(f"{p}: {what} tensor {bad!r} holds NaN or Inf")
    if bn_stats and not meta.bn_statistics_shared:
        meta.bn_statistics_shared = True
    try:
        module.load_state_dict({k: v.to(state[k].dtype) for k, v in weights.items()})
    except RuntimeError as exc:
        raise ModelMismatchError(f"{p}: weights do not fit model {meta.model}: {exc}") from None
    grads = {k: v.to(params[k].dtype) for k, v in grads.items()}
    return SharedUpdate(gradients=grads, global_weights=weights, meta=meta, bn_statistics=bn_stats), model


def _files_of_truth(fmt: object, meta: UpdateMeta | None, modality: str | None) -> UpdateFiles:
    """The modality of a truth file: the one asked for, else its update's, else its ``format``'s."""
    if modality is not None:
        return update_files(modality)
    if meta is not None:
        return update_files(meta_modality(meta))
    found = _of_format(fmt, "truth_format")
    return found if found is not None else _default()


def load_truth(path: str | Path, meta: UpdateMeta | None = None, *, model: Any = None,
               modality: str | None = None) -> Any:
    """Load a truth file of any modality (``modality``, else ``meta``'s, else the file's
    ``format``'s); if ``meta`` is given, check that it fits that update, and with ``model`` (what
    :func:`load_update` returned) what the modality checks against it (text: the token ids
    against its vocabulary). Its header (format, tensor names) is checked before a tensor is read."""
    p = Path(path)
    with open_safetensors(p, "truth") as f:
        md = f.metadata() or {}
        files = _files_of_truth(md.get("format"), meta, modality)
        if md.get("format") != files.truth_format:
            raise UpdateFileError(f"{p} is not a gradleak {files.truth_kind} file (format={one_line(repr(md.get('format')), 60)})")
        if set(f.keys()) != set(files.truth_keys):
            raise UpdateFileError(f"{p}: a {files.truth_kind} file holds exactly {files.truth_holds}")
        return files.read_truth(p, f, md, meta, model)


def _image_truth_record(batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    tensors = {"images": batch.images.detach().cpu().float().contiguous(),
               "labels": batch.labels.detach().cpu().long().contiguous()}
    return tensors, {"names": json.dumps(list(batch.names)), "source": batch.source,
                     "class_names": json.dumps(list(batch.class_names))}


def _read_image_truth(p: Path, f: Any, md: dict[str, str], meta: UpdateMeta | None, model: Any) -> Batch:
    """An image truth: images [K, C, H, W] in [0, 1] and labels [K], fitting ``meta``'s batch."""
    ishape, idt = tensor_shape_dtype(f, "images")
    lshape, ldt = tensor_shape_dtype(f, "labels")
    if len(ishape) != 4 or lshape != (ishape[0],) or idt not in FLOAT_DTYPES or ldt not in {"I64", "I32"}:
        raise UpdateFileError(f"{p}: images must be [K,C,H,W] float and labels [K] integer")
    if meta is not None and (ishape[0] != meta.batch_size or tuple(ishape[1:]) != tuple(meta.input_shape)):
        raise ModelMismatchError(f"{p}: truth holds {list(ishape)} but the update is a batch of "
                                 f"{meta.batch_size} x {list(meta.input_shape)}")
    images = read_tensor(f, "images", p).float()
    labels = read_tensor(f, "labels", p).long()
    lists = [loads_json(md.get(k, "[]"), f"{p}: metadata {k}", error=UpdateFileError) for k in ("names", "class_names")]
    if not all(isinstance(v, list) for v in lists):
        raise UpdateFileError(f"{p}: metadata names are not a JSON list")
    names, class_names = (tuple(str(x) for x in v) for v in lists)
    if not bool(torch.isfinite(images).all()):
        raise NonFiniteError(f"{p}: truth images hold NaN or Inf")
    if meta is not None and (labels.min() < 0 or labels.max() >= meta.num_classes):
        raise UpdateFileError(f"{p}: truth labels outside 0..{meta.num_classes - 1}")
    return Batch(images=images.clamp(0, 1), labels=labels, names=names, source=md.get("source", ""),
                 class_names=class_names)


#: The image modality's update and truth files (the default: an update whose metadata names no modality).
IMAGE_FILES = register_update_files(UpdateFiles(
    modality="image", update_format=FORMAT, truth_format=TRUTH_FORMAT, update_name="shared update",
    version_name="update", check_meta=_check_image_meta, build_model=_image_model, bn_statistics=True,
    batch_type=Batch, truth_record=_image_truth_record, truth_kind="truth", truth_keys=("images", "labels"),
    truth_holds="'images' and 'labels'", read_truth=_read_image_truth))


__all__ = ["IMAGE_FILES", "UpdateFiles", "load_truth", "load_update", "meta_modality", "read_update_meta",
           "register_update_files", "save_shared", "save_truth", "save_update", "truth_bytes", "update_bytes",
           "update_files", "GradleakError"]
