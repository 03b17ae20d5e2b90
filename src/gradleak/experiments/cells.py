"""An experiment's attacks as cells of the sweep engine."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Hashable, Iterable, Mapping, TypeVar

from ..errors import ConfigError, DataError, GradleakError
from ..paths import check_output_dir, loads_json, one_line
from ..sweep import ResultStore, cells_spec, run_sweep
from ..sweep.store import STORE_NAME, FolderLock, check_sweep_folder

CELLS = "cells"               # DIR/cells: the sweep folder of the experiment's cells
TRAINING = "training"         # DIR/training: models trained by the experiment
# Config fields that say how a cell runs, not what it computes: not part of its identity.
RUN_ONLY = frozenset({"threads"})
_STAGE_PREFIX = ".outputs-partial-"
OUTPUT_MARKER = "experiment.json"  # written last: its presence says the outputs are complete

K = TypeVar("K", bound=Hashable)

if TYPE_CHECKING:
    import torch


@dataclass
class CellResult:
    """One cell as the experiment reads it. ``status``: "ok", "failed" (``error`` says why) or
    "lost" (its worker died; not recorded, the next run computes it)."""

    key: Any
    cell_id: str
    config: dict[str, Any]
    status: str
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    run_dir: Path | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def tensors(self) -> dict[str, "torch.Tensor"]:
        """reconstruction.safetensors of the run folder: images, labels (and candidates)."""
        from safetensors.torch import load_file

        path = self._run_file("reconstruction.safetensors")
        try:
            tensors = load_file(str(path))
        except Exception as exc:  # noqa: BLE001 - safetensors raises several types
            raise DataError(f"{path}: cannot read the cell's reconstruction: {one_line(str(exc), 120)}") from None
        if "images" not in tensors or tensors["images"].ndim != 4:
            raise DataError(f"{path}: the cell's reconstruction holds no [K, C, H, W] images")
        return tensors

    def history(self) -> list[dict[str, Any]]:
        """The observed points of the attack: {"iteration", "loss", "psnr" (None if not observed)},
        from metrics["history"] when the run records it there, else the run folder's history.csv."""
        if isinstance(self.metrics.get("history"), list):
            return [dict(h) for h in self.metrics["history"]]
        rows = []
        path = self._run_file("history.csv")
        try:
            with io.StringIO(path.read_text(encoding="utf-8")) as f:
                for r in csv.DictReader(f):
                    rows.append({"iteration": int(r["iteration"]), "loss": float(r["loss"]),
                                 "psnr": float(r["psnr"]) if r.get("psnr") else None})
        except (OSError, UnicodeDecodeError, csv.Error, KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{path}: the cell's history cannot be read ({one_line(str(exc), 80)}); "
                            "it was changed outside gradleak") from None
        return rows

    def truth(self) -> Any:
        """The client's private batch of this cell, loaded from its data source as the run drew it
        (``indices`` if given, else ``sample_batch`` with its seed)."""
        from ..data import open_source, sample_batch
        from ..models import default_image_size

        c = self.config
        source = open_source(c["data"], root=c.get("data_root"), split=c.get("split", "train"))
        size = c.get("image_size") or default_image_size(c["model"])
        channels = source.native_channels
        clients = int(c.get("clients", 1)) if c.get("threat") == "aggregate" else 1
        total = int(c["batch_size"]) * clients
        if c.get("indices"):
            from ..data import batch_of

            return batch_of(source, list(c["indices"]), size, channels)
        return sample_batch(source, total, int(c["seed"]), image_size=size, channels=channels,
                            allow_repeats=bool(c.get("allow_repeats")), clients=clients)

    def paired_images(self, truth: Any | None = None) -> "torch.Tensor":
        """The reconstruction reordered to pair the truth's images (as the evaluation pairs them:
        minimum total MSE, pixels clamped to [0, 1]), for side-by-side figures."""
        import torch

        from ..metrics import match

        truth = self.truth() if truth is None else truth
        rec = torch.nan_to_num(self.tensors()["images"].float(), nan=0.0, posinf=1.0, neginf=0.0).clamp(0.0, 1.0)
        return rec[match(rec, truth.images.float())].contiguous()

    def _run_file(self, name: str) -> Path:
        if self.run_dir is None:
            raise ConfigError(f"cell {self.key!r} ({self.cell_id}) has no run folder; ask for it with run_folders")
        return self.run_dir / name


# --------------------------------------------------------------------------- stored cells
STORE_CHANGED = "the store was changed outside gradleak; move DIR/cells away to compute the cells again"


class StoredDict(dict):
    """A JSON object read from the cell store (a cell's metrics or config). A key the
    experiment reads but the stored object lacks raises DataError naming the store, the cell
    and the key (``__missing__``), not KeyError: a store edited by hand is an input error."""

    def __init__(self, data: dict[str, Any], where: str, path: str):
        super().__init__((k, stored(v, where, f"{path}.{k}")) for k, v in data.items())
        self._where, self._path = where, path

    def __missing__(self, key: Any) -> Any:
        raise DataError(f"{self._where}: the stored {self._path} has no {one_line(repr(key), 60)} ({STORE_CHANGED})")

    def __reduce__(self) -> Any:  # pickled (e.g. to a worker) as the plain dict it holds
        return (dict, (dict(self),))


def stored(value: Any, where: str, path: str) -> Any:
    """``value`` (parsed JSON) with every object a :class:`StoredDict`."""
    if isinstance(value, dict):
        return StoredDict(value, where, path)
    if isinstance(value, list):
        return [stored(v, where, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


# metrics.json values the experiments compute with: number (or null) scalars, the per-image rows
_NUMBERS = ("psnr_mean", "ssim_mean", "mse_mean", "label_accuracy", "wall_seconds", "iterations", "gradient_distance",
            "lpips_mean", "fft2d_mean", "rpsnr_mean", "iip")
_IMAGE_NUMBERS = ("psnr", "ssim", "mse", "fft2d", "rpsnr", "lpips")
_IMAGE_INTEGERS = ("index", "label_true", "label_restored")


def _is_number(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def check_stored_metrics(metrics: dict[str, Any], where: str) -> None:
    """DataError when a finished cell's stored metrics hold a value of a type the pipeline never
    writes where the experiments compute with it (a number that is text, rows that are no list)."""
    def bad(name: str, v: Any, want: str) -> DataError:
        return DataError(f"{where}: the stored metrics.{name} is {one_line(repr(v), 40)}, not {want} ({STORE_CHANGED})")

    for name in _NUMBERS:
        if name in metrics and not _is_number(metrics[name]):
            raise bad(name, metrics[name], "a number")
    for name in ("per_image", "history"):
        rows = metrics.get(name, [])
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise bad(name, rows, "a list of objects")
    if metrics.get("per_image"):  # scored against the truth: the pipeline writes these as numbers
        for name in ("psnr_mean", "ssim_mean", "mse_mean"):
            if name in metrics and metrics[name] is None:
                raise bad(name, None, "a number")
    for i, row in enumerate(metrics.get("per_image", [])):
        _check_image_row(row, f"per_image[{i}]", bad)
    for name in ("convergence", "update", "settings"):
        if name in metrics and not isinstance(metrics[name], dict):
            raise bad(name, metrics[name], "an object")


def _check_image_row(row: dict[str, Any], prefix: str, bad: Callable[[str, Any, str], DataError]) -> None:
    """One per-image row: its scores numbers (PSNR and SSIM never null), its indices and labels integers."""
    for name in _IMAGE_NUMBERS:
        if name in row and not _is_number(row[name]):
            raise bad(f"{prefix}.{name}", row[name], "a number")
    for name in ("psnr", "ssim"):
        if name in row and row[name] is None:
            raise bad(f"{prefix}.{name}", None, "a number")
    for name in _IMAGE_INTEGERS:
        if name in row and (isinstance(row[name], bool) or not isinstance(row[name], int)):
            raise bad(f"{prefix}.{name}", row[name], "an integer")


@dataclass
class CellsReport:
    """What the cells of one experiment run did (experiment.json "cells")."""

    total: int = 0
    reused: int = 0
    computed: int = 0
    failed: list[dict[str, Any]] = field(default_factory=list)   # {"key", "cell_id", "error"}

    def to_dict(self) -> dict[str, Any]:
        return {"store": f"{CELLS}/{STORE_NAME}", "total": self.total, "reused": self.reused,
                "computed": self.computed, "failed": self.failed}

    def notes(self) -> list[str]:
        if not self.failed:
            return []
        lines = "\n".join(f"  - {f['key']} (cell {f['cell_id']}): {f['error']}" for f in self.failed)
        return [f"{len(self.failed)} of {self.total} cells FAILED and are missing from the table "
                f"(rerun with --retry-failed to compute them again):\n\n{lines}\n"]


class Workspace:
    """The experiment's folder while it runs: ``folder`` is DIR (cells, trained models), ``out``
    the staging folder its outputs are written to (moved into DIR when complete)."""

    def __init__(self, name: str, opt: Any, folder: Path, out: Path):
        self.name, self.opt, self.folder, self.out = name, opt, folder, out
        self.report = CellsReport()

    @property
    def cells_dir(self) -> Path:
        return self.folder / CELLS

    def threads(self) -> int:
        """torch threads per cell: --threads, else this process's threads shared by the workers."""
        import torch

        return int(self.opt.threads or max(1, torch.get_num_threads() // max(1, int(self.opt.workers))))

    def run(self, cells: Mapping[K, Mapping[str, Any]], *, run_folders: Iterable[K] = ()) -> dict[K, CellResult]:
        """Run the cells not finished yet; return every cell of ``cells`` by its key.

        ``run_folders``: keys whose run folders the experiment reads (images, history); a
        finished cell whose run folder is missing is computed again."""
        from rich.console import Console

        keys = list(cells)
        threads = self.threads()
        configs = [{**dict(cells[k]), "threads": threads} for k in keys]
        spec, ids = cells_spec(configs, description=f"experiment {self.name}", exclude=RUN_ONLY)
        by_key = dict(zip(keys, ids, strict=True))
        wanted = {by_key[k] for k in run_folders}
        runs = self.cells_dir / "runs"
        with ResultStore(self.cells_dir) as store:
            done = {r.cell_id: r.status for r in store.records() if r.cell_id in by_key.values()}
        redo = {c for c in wanted if done.get(c) == "ok" and not (runs / c).is_dir()}
        opt = self.opt
        summary = run_sweep(spec, self.cells_dir, executor=opt.executor, workers=opt.workers,
                            retry_failed=opt.retry_failed, save_runs=wanted, redo=redo, progress=opt.progress,
                            console=Console(stderr=True, quiet=not opt.progress))
        with ResultStore(self.cells_dir, create=False) as store:
            records = {r.cell_id: r for r in store.records() if r.cell_id in by_key.values()}
        out: dict[K, CellResult] = {}
        for k, cid in by_key.items():
            rec = records.get(cid)
            if rec is None:
                res = CellResult(key=k, cell_id=cid, config=dict(spec_config(spec, cid)), status="lost",
                                 error="lost to the infrastructure (its worker died); rerun to compute it")
            else:
                # What the experiment reads of a stored cell is checked: a store changed outside
                # gradleak is one DataError naming it, never a KeyError/TypeError in a table.
                where = f"experiment cell store {self.cells_dir / STORE_NAME}: cell {cid}"
                metrics = stored(rec.metrics or {}, where, "metrics")
                if rec.status == "ok":
                    check_stored_metrics(metrics, where)
                res = CellResult(key=k, cell_id=cid, config=stored(rec.config, where, "config"), status=rec.status,
                                 metrics=metrics, error=rec.error,
                                 run_dir=(runs / cid) if cid in wanted and (runs / cid).is_dir() else None)
            out[k] = res
            if not res.ok:
                self.report.failed.append({"key": _shown_key(k), "cell_id": cid, "error": res.error or res.status})
        self.report.total += len(spec.cells)
        self.report.reused += summary.skipped
        self.report.computed += len(summary.computed)
        return out

    def trained(self, cfg: Any, name: str = "model") -> "Trained":
        """``gradleak.training.train(cfg)`` into DIR/training/<name>-<digest of cfg>/, or the model
        already trained there with this very config (its training.json is written last)."""
        from ..training import train

        digest = hashlib.sha256(json.dumps(cfg.to_dict(), sort_keys=True).encode()).hexdigest()[:10]
        folder = (self.folder / TRAINING / f"{name}-{digest}").absolute()
        summary = _training_summary(folder)
        if summary is not None and summary.get("config") == json.loads(json.dumps(cfg.to_dict())):
            return Trained.from_summary(folder, summary)
        if folder.exists():
            shutil.rmtree(folder)  # an interrupted training: start it again
        result = train(cfg, folder, progress=bool(self.opt.progress))
        return Trained.from_summary(folder, _training_summary(folder) or {}, wall_seconds=result.wall_seconds)


@dataclass(frozen=True)
class Checkpoint:
    fraction: float
    path: Path
    test_accuracy: float


@dataclass
class Trained:
    """A finished training as the experiments read it (from its training.json)."""

    folder: Path
    checkpoints: list[Checkpoint]
    final_accuracy: float
    epsilon: float | None
    train_images: int
    test_images: int
    total_steps: int
    wall_seconds: float

    @classmethod
    def from_summary(cls, folder: Path, s: dict[str, Any], wall_seconds: float | None = None) -> "Trained":
        cps = sorted((Checkpoint(fraction=float(c["fraction"]), path=folder / str(c["path"]),
                                 test_accuracy=float(c["test_accuracy"])) for c in s.get("checkpoints", [])),
                     key=lambda c: c.fraction)
        privacy = s.get("privacy") or {}
        data = s.get("data") or {}
        return cls(folder=folder, checkpoints=cps, final_accuracy=float(s["final_test_accuracy"]),
                   epsilon=privacy.get("epsilon"), train_images=int(data.get("train_images", 0)),
                   test_images=int(data.get("test_images", 0)), total_steps=int(s.get("total_steps", 0)),
                   wall_seconds=float(wall_seconds if wall_seconds is not None else s.get("wall_seconds", 0.0)))


def _training_summary(folder: Path) -> dict[str, Any] | None:
    """The finished training's training.json, or None (not finished, or a file that is not what
    training writes: the model is then trained again)."""
    path = folder / "training.json"
    if not path.is_file():
        return None
    try:
        summary = loads_json(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, GradleakError):
        return None

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if not isinstance(summary, dict) or not number(summary.get("final_test_accuracy")):
        return None
    cps = summary.get("checkpoints", [])
    if not isinstance(cps, list) or not all(
            isinstance(c, dict) and number(c.get("fraction")) and number(c.get("test_accuracy"))
            and isinstance(c.get("path"), str) and c["path"] and "\0" not in c["path"] for c in cps):
        return None
    for name in ("privacy", "data"):
        if not isinstance(summary.get(name) or {}, dict):
            return None
    if not isinstance((summary.get("privacy") or {}).get("epsilon", 0.0), (int, float, type(None))):
        return None
    if not all(number(v) for v in ((summary.get("data") or {}).get(k, 0) for k in ("train_images", "test_images"))):
        return None
    if not number(summary.get("total_steps", 0)) or not number(summary.get("wall_seconds", 0.0)):
        return None
    return summary


def spec_config(spec: Any, cell_id: str) -> dict[str, Any]:
    return next(c.config for c in spec.cells if c.cell_id == cell_id)


def _shown_key(key: Any) -> str:
    if isinstance(key, tuple):
        return " ".join(str(k) for k in key)
    return str(key)


# --------------------------------------------------------------------------- the folder
@dataclass
class NewFolder:
    """What a new DIR took to create: DIR itself (if it was absent) and its missing parents."""

    folders: list[Path] = field(default_factory=list)   # outermost first

    def undo(self, folder: Path) -> None:
        """Leave the file system as it was: DIR emptied (removed if this run made it), then the
        parents this run made, innermost first, while they are empty."""
        for entry in (folder.iterdir() if folder.is_dir() else ()):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        for made in reversed(self.folders):
            try:
                made.rmdir()
            except OSError:
                return


def open_folder(out: str, name: str) -> tuple[Path, NewFolder | None]:
    """DIR for experiment ``name``: a new folder (absent or empty; created with its cell store,
    which records the experiment's name), or an earlier run's folder of the same experiment to
    resume (then None). Raises ConfigError before any work."""
    p = Path(out)
    new: NewFolder | None = None
    if not os.path.lexists(p) or (p.is_dir() and not p.is_symlink() and not any(p.iterdir())):
        check_output_dir(p)
        missing, q = [], p.absolute()
        while not q.exists():
            missing.append(q)
            q = q.parent
        new = NewFolder()
        try:
            for folder in reversed(missing):
                folder.mkdir()
                new.folders.append(folder)
        except OSError as exc:
            new.undo(p.absolute())
            raise ConfigError(f"--out {p}: cannot create it: {exc.strerror or exc}") from None
    else:
        if p.is_symlink():
            raise ConfigError(f"--out {p} is a symbolic link; give the experiment's folder itself")
        if not p.is_dir():
            raise ConfigError(f"--out {p} exists and is not a folder; choose another --out")
        if not (p / CELLS / STORE_NAME).is_file():
            raise ConfigError(f"output {p} already exists and is not empty, and holds no experiment cells "
                              f"({CELLS}/{STORE_NAME}); choose another --out, or an earlier run's --out to resume it")
        check_sweep_folder(p / CELLS, save_runs=True, what="experiment cells")
        with ResultStore(p / CELLS, create=False) as store:
            owner = store.get_meta("experiment")
        if owner != name:
            raise ConfigError(f"--out {p} holds the cells of experiment {owner!r}, not {name!r}; choose another --out")
    folder = p.absolute()
    if new is not None:
        try:
            with ResultStore(folder / CELLS) as store:
                store.set_meta("experiment", name)
        except BaseException:
            new.undo(folder)
            raise
    return folder, new


def folder_lock(folder: Path) -> FolderLock:
    """One experiment at a time in DIR (the engine locks DIR/cells itself while cells run)."""
    return FolderLock(folder)


def stage_outputs(folder: Path) -> Path:
    """A fresh staging folder in DIR for this run's outputs (stale ones of killed runs removed;
    the caller holds the folder lock)."""
    for old in folder.glob(_STAGE_PREFIX + "*"):
        shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(dir=folder, prefix=_STAGE_PREFIX))


def commit_outputs(stage: Path, folder: Path) -> None:
    """Move the staged outputs into DIR, replacing the previous run's: experiment.json (the
    marker of complete outputs) is removed first and moved in last."""
    marker = folder / OUTPUT_MARKER
    if marker.exists():
        marker.unlink()
    for entry in sorted(stage.iterdir()):
        if entry.name == OUTPUT_MARKER:
            continue
        target = folder / entry.name
        if target.name in (CELLS, TRAINING):
            raise ConfigError(f"an experiment output may not be named {target.name!r}")
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(entry, target)
    if (stage / OUTPUT_MARKER).exists():
        os.replace(stage / OUTPUT_MARKER, marker)
    shutil.rmtree(stage, ignore_errors=True)


def remove_new_folder(folder: Path, new: NewFolder) -> None:
    """Undo a new DIR whose experiment failed before any cell finished (nothing to resume)."""
    try:
        with ResultStore(folder / CELLS, create=False) as store:
            if len(store):
                return
    except Exception:  # noqa: BLE001 - a store we cannot read is kept for the user to see
        return
    new.undo(folder)
