"""Train a victim model under a defense, with checkpoints, so that "accuracy under a defense" and
"attacks at a stage of training" are measured, not guessed."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

from .config import MAX_SEED, check_path_text
from .data import open_source
from .data.batch import Batch
from .data.sources import ImageSource
from .defenses import DPSGD, Defense, client_update, dp_epsilon, parse_defenses
from .defenses.base import as_float
from .errors import (ConfigError, DataError, GradleakError, ModelMismatchError, NonFiniteError,
                     UpdateFileError)
from .fl.client import fedsgd, trainable_parameters
from .fl.files import open_safetensors
from .fl.update import atomic_write_bytes
from .models import ModelSpec, build_model, default_image_size, model_names
from .paths import loads_json, one_line

__all__ = ["CHECKPOINT_FORMAT", "CheckpointInfo", "TrainConfig", "TrainResult", "apply_checkpoint",
           "checkpoint_name", "evaluate_accuracy", "load_checkpoint", "read_checkpoint_meta", "train"]

CHECKPOINT_FORMAT = "gradleak.checkpoint"
CHECKPOINT_FORMAT_VERSION = "1"
TRAINING_FORMAT = "gradleak.training"
#: The test subset is drawn with this fixed seed, independent of ``TrainConfig.seed``, so runs with
#: different seeds (or defenses) are scored on the same images.
TEST_SUBSET_SEED = 0
_FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}
_EVAL_BATCH = 1000


# =========================================================================== configuration
def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _finite(name: str, value: Any) -> float:
    x = as_float(value)
    if x is None:
        raise ConfigError(f"training: {name} must be a number, got {value!r}")
    if not math.isfinite(x):
        raise ConfigError(f"training: {name} must be finite, got {value!r}")
    return x


MAX_EPOCHS = 1000.0  # a bound on absurd requests (1e12 epochs would never end)


@dataclass(frozen=True)
class TrainConfig:
    """What to train, on what, under which defense, and where to checkpoint.

    model, width:   registry name (``build_model``) and optional width (convnet).
    data:           a data source with a test split (``fashion-mnist`` or a folder of its IDX files);
                    data_root overrides its folder.
    image_size:     side of the model input; None = the model's default (32 for lenet-dlg).
    epochs:         passes over the training images, fractions allowed (0.2 = a fifth of one).
    batch_size, lr, momentum: SGD. Every step uses a full batch (the last partial batch of an
                    epoch is dropped), so DP-SGD's sample rate is batch_size / train images.
    defense:        defense specs (``parse_defenses`` grammar) applied to every gradient step.
    checkpoints:    fractions of the total number of steps at which the model is saved and scored
                    (0 = before the first step, 1 = the end).
    train_subset:   only the first N images of a permutation of the train split seeded with ``seed``.
    test_subset:    score on N test images drawn with the fixed seed TEST_SUBSET_SEED (None: all).
    seed:           data subset, shuffling, defense noise, global RNG; model_seed: initial weights.
    """

    model: str = "lenet-dlg"
    width: int | None = None
    data: str = "fashion-mnist"
    data_root: str | None = None
    image_size: int | None = None
    epochs: float = 1.0
    batch_size: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    defense: tuple[str, ...] = ()
    checkpoints: tuple[float, ...] = (0.0, 0.3, 0.7, 1.0)
    train_subset: int | None = None
    test_subset: int | None = 2000
    seed: int = 0
    model_seed: int = 0

    def __post_init__(self) -> None:
        self._check_model_and_data()
        self._normalise_run_length()
        self._normalise_sgd()
        self._normalise_defense()
        self._normalise_checkpoints()
        self._check_subsets_and_seeds()
        self._check_paths()
        parse_defenses(list(self.defense))  # ConfigError / UnknownNameError for a bad spec, now

    def _check_model_and_data(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError(f"training: model must be a model name, got {self.model!r}")
        if not isinstance(self.data, str) or not self.data.strip():
            raise ConfigError(f"training: data must be a data source name or folder, got {self.data!r}")
        if self.width is not None and (not _is_int(self.width) or self.width < 1):
            raise ConfigError(f"training: width must be a positive integer or None, got {self.width!r}")
        if self.image_size is not None and (not _is_int(self.image_size) or not 4 <= self.image_size <= 1024):
            raise ConfigError(f"training: image_size must be an integer in 4..1024 or None, got {self.image_size!r}")

    def _normalise_run_length(self) -> None:
        """epochs (a float), batch_size, and the width's upper bound."""
        epochs = _finite("epochs", self.epochs)
        if not 0 < epochs <= MAX_EPOCHS:
            raise ConfigError(f"training: epochs must be in (0, {MAX_EPOCHS}], got {self.epochs!r}")
        object.__setattr__(self, "epochs", epochs)
        if not _is_int(self.batch_size) or not 1 <= self.batch_size <= 65536:
            raise ConfigError(f"training: batch_size must be an integer in 1..65536, got {self.batch_size!r}")
        if self.width is not None and self.width > 4096:
            raise ConfigError(f"training: width must be at most 4096, got {self.width!r}")

    def _normalise_sgd(self) -> None:
        """lr and momentum as floats."""
        lr = _finite("lr", self.lr)
        if lr <= 0:
            raise ConfigError(f"training: lr must be > 0, got {self.lr!r}")
        object.__setattr__(self, "lr", lr)
        momentum = _finite("momentum", self.momentum)
        if not 0 <= momentum < 1:
            raise ConfigError(f"training: momentum must be in [0, 1), got {self.momentum!r}")
        object.__setattr__(self, "momentum", momentum)

    def _normalise_defense(self) -> None:
        """defense as a tuple of spec strings (one string is one spec)."""
        defense = (self.defense,) if isinstance(self.defense, str) else self.defense
        try:
            defense = tuple(defense)
        except TypeError:
            raise ConfigError(f"training: defense must be a list of spec strings, got {self.defense!r}") from None
        if not all(isinstance(d, str) for d in defense):
            raise ConfigError(f"training: defense must be a list of spec strings, got {self.defense!r}")
        object.__setattr__(self, "defense", defense)

    def _normalise_checkpoints(self) -> None:
        """checkpoints as sorted distinct fractions in [0, 1] whose file names differ."""
        cps = (self.checkpoints,) if isinstance(self.checkpoints, (int, float)) else self.checkpoints
        try:
            cps = tuple(_finite("checkpoints", c) for c in cps)
        except TypeError:
            raise ConfigError(f"training: checkpoints must be a list of fractions, got {self.checkpoints!r}") from None
        bad = [c for c in cps if not 0.0 <= c <= 1.0]
        if bad:
            raise ConfigError(f"training: checkpoints are fractions of training in [0, 1], got {bad[0]!r}")
        cps = tuple(sorted(set(cps)))
        names = [checkpoint_name(c) for c in cps]
        clash = sorted({n for n in names if names.count(n) > 1})
        if clash:
            raise ConfigError(f"training: checkpoints {list(cps)} give the same file name {clash[0]} "
                              "(fractions are written with 2 decimals)")
        object.__setattr__(self, "checkpoints", cps)

    def _check_subsets_and_seeds(self) -> None:
        for name in ("train_subset", "test_subset"):
            v = getattr(self, name)
            if v is not None and (not _is_int(v) or v < 1):
                raise ConfigError(f"training: {name} must be an integer >= 1 or None, got {v!r}")
        for name in ("seed", "model_seed"):
            v = getattr(self, name)
            if not _is_int(v) or not 0 <= v <= MAX_SEED:
                shown = f"an integer of {v.bit_length()} bits" if _is_int(v) and v > 10**30 else repr(v)
                raise ConfigError(f"training: {name} must be an integer in 0..{MAX_SEED}, got {shown}")

    def _check_paths(self) -> None:
        """data and data_root must be text a path can hold."""
        for name in ("data", "data_root"):
            v = getattr(self, name)
            if v is not None:
                try:
                    check_path_text(v)
                except (TypeError, ValueError) as exc:
                    raise ConfigError(f"training: {name} {one_line(repr(v), 80)} {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["defense"], d["checkpoints"] = list(self.defense), list(self.checkpoints)
        return d


def checkpoint_name(fraction: float) -> str:
    """``checkpoint-0.30.safetensors`` for fraction 0.3."""
    return f"checkpoint-{fraction:.2f}.safetensors"


@dataclass(frozen=True)
class CheckpointInfo:
    fraction: float
    step: int
    path: Path
    test_accuracy: float


@dataclass
class TrainResult:
    """What :func:`train` did. ``model`` is the trained network (eval mode)."""

    config: TrainConfig
    out: Path
    model: ModelSpec
    checkpoints: list[CheckpointInfo]
    final_accuracy: float
    total_steps: int
    steps_per_epoch: int
    train_images: int
    test_images: int
    losses: list[float]
    wall_seconds: float
    epsilon: float | None = None  # DP-SGD only, at the spec's delta (default 1e-5); inf -> None in JSON
    summary_path: Path | None = None
    plot_path: Path | None = None
    defenses: list[str] = field(default_factory=list)


# =========================================================================== data
def _derive_seed(seed: int, purpose: str) -> int:
    """Independent 63-bit seeds per purpose (shuffle, noise, ...) from one user seed."""
    digest = hashlib.sha256(f"gradleak.training:{seed}:{purpose}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@dataclass
class _Images:
    pixels: torch.Tensor  # [N, C, S, S] uint8 (exact: every source decodes to k/255)
    labels: torch.Tensor  # [N] int64

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def batch(self, idx: torch.Tensor, name: str) -> Batch:
        return Batch(images=self.pixels[idx].to(torch.float32).div_(255.0), labels=self.labels[idx], source=name)


def _decode(source: ImageSource, indices: list[int], size: int, channels: int) -> _Images:
    pixels = torch.empty(len(indices), channels, size, size, dtype=torch.uint8)
    for row, i in enumerate(indices):
        pixels[row] = source.load(i, size, channels).mul_(255.0).round_().to(torch.uint8)
    labels = torch.tensor([source.label(i) for i in indices], dtype=torch.int64)
    return _Images(pixels, labels)


def _open_split(cfg: TrainConfig, split: str) -> ImageSource:
    source = open_source(cfg.data, root=cfg.data_root, split=split)
    if getattr(source, "split", None) != split:
        raise ConfigError(f"training: data {cfg.data!r} has no separate train/test splits (needed to measure "
                          "test accuracy); use fashion-mnist or a folder holding its IDX files")
    return source


# =========================================================================== evaluation
def evaluate_accuracy(model: ModelSpec, images: torch.Tensor, labels: torch.Tensor, *,
                      batch_size: int = _EVAL_BATCH) -> float:
    """Top-1 accuracy of ``model`` (eval mode) on pixels [N, C, H, W] in [0, 1] (float or uint8 * 255)."""
    module = model.module
    was_training = module.training
    module.eval()
    correct = 0
    try:
        with torch.no_grad():
            for start in range(0, int(labels.shape[0]), batch_size):
                x = images[start:start + batch_size]
                x = x.to(torch.float32).div_(255.0) if x.dtype == torch.uint8 else x.to(torch.float32)
                pred = module(model.normalize(x)).argmax(1)
                correct += int((pred == labels[start:start + batch_size]).sum())
    finally:
        module.train(was_training)
    return correct / max(1, int(labels.shape[0]))


# =========================================================================== checkpoints
def _checkpoint_bytes(model: ModelSpec, meta: dict[str, Any]) -> bytes:
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
    if not _is_int(meta.get("step")) or meta["step"] < 0:
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
    if width is not None and (not _is_int(width) or not 1 <= width <= 4096):
        raise bad("model_kwargs", "an object with an integer width in 1..4096")
    if not _is_int(meta.get("num_classes")) or not 2 <= meta["num_classes"] <= 100_000:
        raise bad("num_classes", "an integer in 2..100000")


def _check_meta_input(meta: dict[str, Any], bad: Callable[[str, str], UpdateFileError]) -> list[int]:
    """input_shape (a square [C, H, W]) and the per-channel normalisation mean and std; returns the shape."""
    shape = meta.get("input_shape")
    if (not isinstance(shape, list) or len(shape) != 3 or not all(_is_int(s) and s >= 1 for s in shape)
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
        if ref.is_floating_point() != (dtype in _FLOAT_DTYPES):
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


# =========================================================================== training
def _has_bn_running_stats(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats for m in module.modules())


def _checkpoint_step(fraction: float, total_steps: int) -> int:
    return min(total_steps, int(math.floor(fraction * total_steps + 0.5)))


def _save_plot(path: Path, checkpoints: Sequence[CheckpointInfo], losses: Sequence[float], title: str) -> Path:
    from matplotlib.figure import Figure

    from .report.figures import _atomic_savefig

    fig = Figure(figsize=(10.0, 4.0), dpi=100, facecolor="white", layout="constrained")
    ax_acc, ax_loss = fig.subplots(1, 2)
    ax_acc.plot([c.fraction for c in checkpoints], [c.test_accuracy for c in checkpoints], marker="o", ms=4, lw=1.4)
    ax_acc.set_xlabel("fraction of training")
    ax_acc.set_ylabel("test accuracy")
    ax_acc.set_ylim(0.0, 1.0)
    ax_acc.set_xlim(-0.02, 1.02)
    ax_acc.set_title("test accuracy at checkpoints", fontsize=10)
    ax_acc.grid(True, alpha=0.3)
    steps = list(range(1, len(losses) + 1))
    ax_loss.plot(steps, losses, lw=0.8, alpha=0.4, label="per step")
    window = max(1, len(losses) // 50)
    if window > 1:
        smooth = [sum(losses[max(0, i - window + 1):i + 1]) / len(losses[max(0, i - window + 1):i + 1])
                  for i in range(len(losses))]
        ax_loss.plot(steps, smooth, lw=1.6, label=f"mean of {window} steps")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("training loss (mini-batch cross-entropy)")
    ax_loss.set_title("training loss", fontsize=10)
    ax_loss.grid(True, alpha=0.3)
    if losses:
        ax_loss.legend(loc="best", fontsize=8)
    fig.suptitle(title, fontsize=10)
    return _atomic_savefig(fig, path)


def _json_float(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _open_splits(cfg: TrainConfig) -> tuple[ImageSource, ImageSource]:
    """The train and test splits of ``cfg.data``, which must agree on the classes."""
    train_src, test_src = _open_split(cfg, "train"), _open_split(cfg, "test")
    if train_src.num_classes != test_src.num_classes:
        raise DataError(f"train and test splits of {cfg.data} disagree on the number of classes")
    return train_src, test_src


def _dp_defense(defenses: list[Defense], model: ModelSpec) -> DPSGD | None:
    """The DP-SGD defense when it leads the chain; refused on a BN model now, not after the
    first checkpoint."""
    dp = defenses[0] if defenses and isinstance(defenses[0], DPSGD) else None
    if dp is not None:
        from .defenses.dpsgd import _check_no_batchnorm

        _check_no_batchnorm(model)
    return dp


def _train_indices(cfg: TrainConfig, source: ImageSource) -> list[int]:
    """The first ``train_subset`` images of a permutation of the train split seeded with ``cfg.seed``."""
    n_all = len(source)
    if cfg.train_subset is not None and cfg.train_subset > n_all:
        raise ConfigError(f"training: train_subset={cfg.train_subset} but {cfg.data} has {n_all} train images")
    perm = torch.randperm(n_all, generator=torch.Generator().manual_seed(_derive_seed(cfg.seed, "subset")))
    idx = perm[: cfg.train_subset or n_all].tolist()
    if len(idx) < cfg.batch_size:
        raise ConfigError(f"training: batch_size={cfg.batch_size} is larger than the {len(idx)} training images")
    return idx


def _test_indices(cfg: TrainConfig, source: ImageSource) -> list[int]:
    """All test images, or ``test_subset`` of them drawn with the fixed TEST_SUBSET_SEED, so runs
    with different seeds or defenses are scored on the same images."""
    n_all = len(source)
    n = n_all if cfg.test_subset is None else min(cfg.test_subset, n_all)
    if n == n_all:
        return list(range(n_all))
    perm = torch.randperm(n_all, generator=torch.Generator().manual_seed(TEST_SUBSET_SEED))
    return sorted(perm[:n].tolist())


def _privacy(dp: DPSGD | None, sample_rate: float, total_steps: int) -> tuple[float | None, dict[str, Any] | None]:
    """DP-SGD's epsilon over the whole run and the record training.json keeps of it (None, None
    without DP-SGD)."""
    if dp is None:
        return None, None
    epsilon = dp_epsilon(dp.noise, sample_rate=sample_rate, steps=total_steps, delta=dp.delta)
    return epsilon, {"epsilon": _json_float(epsilon), "delta": dp.delta, "noise_multiplier": dp.noise,
                     "clip": dp.clip, "sample_rate": sample_rate, "steps": total_steps,
                     "accountant": "opacus RDP (assumes Poisson sampling; training uses shuffled fixed-size batches)"}


@dataclass
class _Schedule:
    """How many steps the run takes, and which checkpoint fractions fall on each step."""

    steps_per_epoch: int
    total_steps: int
    plan: dict[int, list[float]]

    @classmethod
    def of(cls, cfg: TrainConfig, n_train: int) -> _Schedule:
        steps_per_epoch = n_train // cfg.batch_size  # full batches only: a fixed batch size every step
        total_steps = max(1, int(math.floor(cfg.epochs * steps_per_epoch + 0.5)))
        plan: dict[int, list[float]] = {}
        for frac in cfg.checkpoints:
            plan.setdefault(_checkpoint_step(frac, total_steps), []).append(frac)
        return cls(steps_per_epoch, total_steps, plan)


@dataclass
class _Checkpointer:
    """Scores the model and writes its checkpoint(s) at the steps the schedule plans them."""

    cfg: TrainConfig
    out: Path
    model: ModelSpec
    test_data: _Images
    schedule: _Schedule
    specs: list[str]
    data_meta: dict[str, Any]
    saved: list[CheckpointInfo] = field(default_factory=list)

    def __call__(self, step: int) -> None:
        fracs = self.schedule.plan.get(step)
        if not fracs:
            return
        model, cfg = self.model, self.cfg
        acc = evaluate_accuracy(model, self.test_data.pixels, self.test_data.labels)
        for frac in fracs:
            path = self.out / checkpoint_name(frac)
            meta = {"format": CHECKPOINT_FORMAT, "model": model.name, "model_kwargs": dict(model.kwargs),
                    "num_classes": model.num_classes, "input_shape": list(model.input_shape),
                    "mean": list(model.mean), "std": list(model.std), "fraction": frac, "step": step,
                    "total_steps": self.schedule.total_steps, "epochs": step / self.schedule.steps_per_epoch,
                    "test_accuracy": acc, "test_images": len(self.test_data), "defenses": self.specs,
                    "data": self.data_meta, "seed": cfg.seed, "model_seed": cfg.model_seed}
            atomic_write_bytes(path, _checkpoint_bytes(model, meta))
            self.saved.append(CheckpointInfo(fraction=frac, step=step, path=path, test_accuracy=acc))


@dataclass
class _ClientSteps:
    """One defended FedSGD client's step per mini-batch, applied by ``torch.optim.SGD`` through
    ``p.grad``; keeps the loss of every step."""

    cfg: TrainConfig
    model: ModelSpec
    defenses: list[Defense]
    params: dict[str, torch.Tensor]
    update_bn: bool
    losses: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.optimizer = torch.optim.SGD(list(self.params.values()), lr=self.cfg.lr, momentum=self.cfg.momentum)
        self.noise_gen = torch.Generator().manual_seed(_derive_seed(self.cfg.seed, "defense"))

    def __call__(self, batch: Batch, step: int, total_steps: int) -> float:
        model, cfg = self.model, self.cfg
        if self.defenses:
            update = client_update(model, batch, self.defenses, self.noise_gen)
        else:
            update = fedsgd(model, batch)
        loss = float(update.meta.loss)
        if not math.isfinite(loss):
            raise NonFiniteError(f"training diverged: the loss is {loss} at step {step + 1}/{total_steps}; "
                                 f"lower lr (now {cfg.lr})")
        if self.update_bn:  # fedsgd ran on cloned buffers: move the module's running stats here
            with torch.no_grad():
                model.module(model.normalize(batch.images))
        for name, p in self.params.items():
            p.grad = update.gradients[name].to(dtype=p.dtype, device=p.device)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.losses.append(loss)
        if not all(bool(torch.isfinite(p).all()) for p in self.params.values()):
            raise NonFiniteError(f"training diverged: weights hold NaN/Inf after step {step + 1}/{total_steps}; "
                                 f"lower lr (now {cfg.lr})")
        return loss


def _progress_bar(model: ModelSpec, specs: list[str], total_steps: int) -> tuple[Any, Any]:
    """A started rich progress bar over the steps, and its task."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    bar = Progress(TextColumn("[bold]training[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TimeRemainingColumn(), transient=False)
    task = bar.add_task(f"{model.name} {' '.join(specs) or 'no defense'}", total=total_steps)
    bar.start()
    return bar, task


def _run_steps(client: _ClientSteps, train_data: _Images, schedule: _Schedule, save: _Checkpointer,
               progress: bool) -> None:
    """Every step of the schedule over reshuffled epochs of ``train_data``, with the checkpoints
    (step 0: before the first step). Global RNG draws (dropout etc. in user models) come from a
    seed of their own and leave the caller's RNG as it was."""
    cfg, model, total_steps = client.cfg, client.model, schedule.total_steps
    shuffle_gen = torch.Generator().manual_seed(_derive_seed(cfg.seed, "shuffle"))
    bar, task = _progress_bar(model, save.specs, total_steps) if progress else (None, None)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_derive_seed(cfg.seed, "global"))
            model.module.train()
            save(0)
            order = torch.empty(0, dtype=torch.int64)
            for step in range(total_steps):
                pos = step % schedule.steps_per_epoch
                if pos == 0:
                    order = torch.randperm(len(train_data), generator=shuffle_gen)
                batch = train_data.batch(order[pos * cfg.batch_size:(pos + 1) * cfg.batch_size], cfg.data)
                loss = client(batch, step, total_steps)
                save(step + 1)
                if bar is not None:
                    bar.update(task, advance=1, description=f"{model.name} loss {loss:.3f}")
    finally:
        if bar is not None:
            bar.stop()


def _summary(result: TrainResult, data_meta: dict[str, Any], parameters: int, update_bn: bool,
             privacy: dict[str, Any] | None) -> dict[str, Any]:
    """training.json: the run's config, model, data, schedule, checkpoints, losses and privacy."""
    model = result.model
    return {
        "format": TRAINING_FORMAT, "config": result.config.to_dict(), "defenses": result.defenses,
        "model": {"name": model.name, "kwargs": dict(model.kwargs), "num_classes": model.num_classes,
                  "input_shape": list(model.input_shape), "mean": list(model.mean), "std": list(model.std),
                  "parameters": parameters},
        "data": {**data_meta, "test_subset_seed": TEST_SUBSET_SEED},
        "steps_per_epoch": result.steps_per_epoch, "total_steps": result.total_steps,
        "bn_running_stats": "updated by a no-grad train-mode forward per step" if update_bn else None,
        "checkpoints": [{"fraction": c.fraction, "step": c.step, "path": c.path.name,
                         "test_accuracy": c.test_accuracy} for c in result.checkpoints],
        "final_test_accuracy": result.final_accuracy, "wall_seconds": round(result.wall_seconds, 3),
        "privacy": privacy, "loss": [_json_float(x) for x in result.losses],
        "plot": result.plot_path.name if result.plot_path else None,
    }


def _plot_or_none(result: TrainResult) -> Path | None:
    """training.png, or None where drawing it failed: a figure must never lose a finished run."""
    specs = result.defenses
    title = f"{result.model.name} on {result.config.data}, {' + '.join(specs) or 'no defense'}"
    try:
        return _save_plot(result.out / "training.png", result.checkpoints, result.losses, title)
    except GradleakError:
        raise
    except Exception:  # noqa: BLE001 - a figure must never lose a finished training run
        return None


def train(cfg: TrainConfig, out: str | Path, *, progress: bool = False) -> TrainResult:
    """Train ``cfg.model`` on ``cfg.data`` with every gradient step defended; write checkpoints,
    ``training.json`` and ``training.png`` to ``out``. See the docs notes.

    Raises ConfigError (bad values, dpsgd on a BN model, a data source without a test split,
    subsets larger than the data), DataError / UnknownNameError (data, model),
    NonFiniteError (the loss or the weights became NaN/Inf: lower lr).
    """
    if not isinstance(cfg, TrainConfig):
        raise ConfigError(f"train() needs a TrainConfig, got {type(cfg).__name__}")
    started = time.perf_counter()
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"training: output {out} exists and is not a folder")
    defenses: list[Defense] = parse_defenses(list(cfg.defense))

    train_src, test_src = _open_splits(cfg)
    channels = int(train_src.native_channels) if train_src.native_channels in (1, 3) else 3
    size = cfg.image_size or default_image_size(cfg.model)
    model = build_model(cfg.model, num_classes=train_src.num_classes, channels=channels, image_size=size,
                        seed=cfg.model_seed, width=cfg.width)
    dp = _dp_defense(defenses, model)
    train_idx, test_idx = _train_indices(cfg, train_src), _test_indices(cfg, test_src)
    train_data = _decode(train_src, train_idx, size, channels)
    test_data = _decode(test_src, test_idx, size, channels)

    n_train, n_test = len(train_data), len(test_data)
    schedule = _Schedule.of(cfg, n_train)
    epsilon, privacy = _privacy(dp, cfg.batch_size / n_train, schedule.total_steps)
    params = trainable_parameters(model.module)
    client = _ClientSteps(cfg, model, defenses, params, _has_bn_running_stats(model.module))
    data_meta = {"source": cfg.data, "train_images": n_train, "test_images": n_test,
                 "image_size": size, "channels": channels}
    specs = [d.spec for d in defenses]
    out.mkdir(parents=True, exist_ok=True)
    save = _Checkpointer(cfg, out, model, test_data, schedule, specs, data_meta)
    _run_steps(client, train_data, schedule, save, progress)

    model.module.eval()
    checkpoints = save.saved
    final = next((c.test_accuracy for c in checkpoints if c.step == schedule.total_steps), None)
    if final is None:
        final = evaluate_accuracy(model, test_data.pixels, test_data.labels)
    checkpoints.sort(key=lambda c: c.fraction)
    wall = time.perf_counter() - started

    result = TrainResult(config=cfg, out=out, model=model, checkpoints=checkpoints, final_accuracy=final,
                         total_steps=schedule.total_steps, steps_per_epoch=schedule.steps_per_epoch,
                         train_images=n_train, test_images=n_test, losses=client.losses, wall_seconds=wall,
                         epsilon=epsilon, defenses=specs)
    result.plot_path = _plot_or_none(result)
    summary = _summary(result, data_meta, sum(p.numel() for p in params.values()), client.update_bn, privacy)
    result.summary_path = out / "training.json"
    atomic_write_bytes(result.summary_path, (json.dumps(summary, indent=1, allow_nan=False) + "\n").encode())
    return result
