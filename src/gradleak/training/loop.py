"""Training a victim model under a defense: the data splits and subsets, every step a defended
FedSGD client's, the model scored and checkpointed at the planned fractions, training.json and
training.png written at the end."""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from ..data import open_source
from ..data.batch import Batch
from ..data.sources import ImageSource
from ..defenses import DPSGD, Defense, client_update, dp_epsilon, parse_defenses
from ..errors import ConfigError, DataError, GradleakError, NonFiniteError
from ..fl.client import fedsgd, trainable_parameters
from ..fl.update import atomic_write_bytes
from ..models import ModelSpec, build_model, default_image_size
from .checkpoints import CHECKPOINT_FORMAT, checkpoint_bytes
from .config import CheckpointInfo, TrainConfig, TrainResult, checkpoint_name

TRAINING_FORMAT = "gradleak.training"
#: The test subset is drawn with this fixed seed, independent of ``TrainConfig.seed``, so runs with
#: different seeds (or defenses) are scored on the same images.
TEST_SUBSET_SEED = 0
_EVAL_BATCH = 1000


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



# =========================================================================== training
def _has_bn_running_stats(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats for m in module.modules())


def _checkpoint_step(fraction: float, total_steps: int) -> int:
    return min(total_steps, int(math.floor(fraction * total_steps + 0.5)))


def _save_plot(path: Path, checkpoints: Sequence[CheckpointInfo], losses: Sequence[float], title: str) -> Path:
    from matplotlib.figure import Figure

    from ..report.figures import atomic_savefig

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
    return atomic_savefig(fig, path)


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
        from ..defenses.dpsgd import check_no_batchnorm

        check_no_batchnorm(model)
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
            atomic_write_bytes(path, checkpoint_bytes(model, meta))
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


__all__ = ["TEST_SUBSET_SEED", "TRAINING_FORMAT", "evaluate_accuracy", "train"]
