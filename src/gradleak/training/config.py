"""What a training run is asked for (``TrainConfig``, checked and normalised when built) and what it
returns (``TrainResult``, the checkpoints it wrote)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import MAX_SEED, check_path_text
from ..defenses import parse_defenses
from ..defenses.base import as_float
from ..errors import ConfigError
from ..models import ModelSpec
from ..paths import one_line


def is_int(x: Any) -> bool:
    """An int that is not a bool (JSON and YAML give both)."""
    return isinstance(x, int) and not isinstance(x, bool)


def _finite(name: str, value: Any) -> float:
    x = as_float(value)
    if x is None:
        raise ConfigError(f"training: {name} must be a number, got {value!r}")
    if not math.isfinite(x):
        raise ConfigError(f"training: {name} must be finite, got {value!r}")
    return x


MAX_EPOCHS = 1000.0  # a bound on absurd requests (1e12 epochs would never end)
# `gradleak train`'s defaults, declared once: TrainConfig's fields take them, and the CLI's --help
# reads this literal without importing the module (specs.read_literal: no torch).
TRAIN_DEFAULTS = {"model": "lenet-dlg", "data": "fashion-mnist", "epochs": 1.0, "batch_size": 64, "lr": 0.05,
                  "momentum": 0.9, "checkpoints": (0.0, 0.3, 0.7, 1.0), "test_subset": 2000, "seed": 0,
                  "model_seed": 0}


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

    model: str = TRAIN_DEFAULTS["model"]
    width: int | None = None
    data: str = TRAIN_DEFAULTS["data"]
    data_root: str | None = None
    image_size: int | None = None
    epochs: float = TRAIN_DEFAULTS["epochs"]
    batch_size: int = TRAIN_DEFAULTS["batch_size"]
    lr: float = TRAIN_DEFAULTS["lr"]
    momentum: float = TRAIN_DEFAULTS["momentum"]
    defense: tuple[str, ...] = ()
    checkpoints: tuple[float, ...] = TRAIN_DEFAULTS["checkpoints"]
    train_subset: int | None = None
    test_subset: int | None = TRAIN_DEFAULTS["test_subset"]
    seed: int = TRAIN_DEFAULTS["seed"]
    model_seed: int = TRAIN_DEFAULTS["model_seed"]

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
        if self.width is not None and (not is_int(self.width) or self.width < 1):
            raise ConfigError(f"training: width must be a positive integer or None, got {self.width!r}")
        if self.image_size is not None and (not is_int(self.image_size) or not 4 <= self.image_size <= 1024):
            raise ConfigError(f"training: image_size must be an integer in 4..1024 or None, got {self.image_size!r}")

    def _normalise_run_length(self) -> None:
        """epochs (a float), batch_size, and the width's upper bound."""
        epochs = _finite("epochs", self.epochs)
        if not 0 < epochs <= MAX_EPOCHS:
            raise ConfigError(f"training: epochs must be in (0, {MAX_EPOCHS}], got {self.epochs!r}")
        object.__setattr__(self, "epochs", epochs)
        if not is_int(self.batch_size) or not 1 <= self.batch_size <= 65536:
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
            if v is not None and (not is_int(v) or v < 1):
                raise ConfigError(f"training: {name} must be an integer >= 1 or None, got {v!r}")
        for name in ("seed", "model_seed"):
            v = getattr(self, name)
            if not is_int(v) or not 0 <= v <= MAX_SEED:
                shown = f"an integer of {v.bit_length()} bits" if is_int(v) and v > 10**30 else repr(v)
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


__all__ = ["MAX_EPOCHS", "CheckpointInfo", "TrainConfig", "TrainResult", "checkpoint_name", "is_int"]
