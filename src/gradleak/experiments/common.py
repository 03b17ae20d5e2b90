"""Helpers shared by experiment modules: the options every experiment resolves the same way, the
cells they have in common, and reading cells back (rows per image, means, PSNR over time,
image grids)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from .base import ExperimentOptions
from .cells import CellResult

# Success threshold of the DLG-side experiments: MSE <= 0.01 on [0, 1] pixels (see local_iterations.py).
THRESHOLD_DB = 20.0
# The start of their L-BFGS attacks: mid-grey pixels (DLG's N(0, 1) start saturates the sigmoid
# LeNet on many photos; the grey start is an attacker choice that uses no ground truth).
LBFGS_INIT = "zeros"


@dataclass(frozen=True)
class Setting:
    """The options an experiment resolves from --model, --width, --data, --attacks, --samples,
    --iterations and --seed, each with the experiment's own default."""

    model: str
    width: int | None
    data: str
    attack: str
    samples: int
    iterations: int | None
    seed: int

    @property
    def seeds(self) -> range:
        return range(self.seed, self.seed + self.samples)

    @property
    def seed_text(self) -> str:
        return f"{self.seed}..{self.seed + self.samples - 1}"


def setting(opt: ExperimentOptions, *, model: str, data: str, attack: str = "dlg", width: int | None = None,
            samples: tuple[int, int] = (1, 3), iterations: tuple[int | None, int | None] = (None, None)) -> Setting:
    """Each option from the command line, else the experiment's default; ``samples`` and
    ``iterations`` are (smoke, full)."""
    pick = 0 if opt.smoke else 1
    return Setting(model=opt.model or model, width=opt.width or width, data=opt.data or data,
                   attack=(opt.attacks or [attack])[0], samples=opt.samples or samples[pick],
                   iterations=opt.iterations or iterations[pick], seed=opt.seed)


def lbfgs_cell(s: Setting, seed: int, *, log_points: int, **fields: Any) -> dict[str, Any]:
    """A DLG-family cell as the DLG-side experiments run it: float64 L-BFGS from LBFGS_INIT,
    ``log_points`` PSNR observations over the run."""
    n_iter = int(s.iterations or 1)
    return dict(attack=s.attack, model=s.model, width=s.width, data=s.data, seed=seed, iterations=s.iterations,
                dtype="float64", init=LBFGS_INIT, log_every=max(1, n_iter // log_points), **fields)


def mean(values: Iterable[Any]) -> float | None:
    """Mean of the values that are not None (None if there are none)."""
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def finite_mean(values: Sequence[Any]) -> float | None:
    """Mean for a figure: None (a gap) if a value is missing or not finite."""
    if not values or any(v is None or not math.isfinite(v) for v in values):
        return None
    return sum(values) / len(values)


def series(rows: list[dict[str, Any]], x_key: str, xs: Sequence[Any], value: str = "psnr",
           **where: Any) -> list[float | None]:
    """For each x, the mean of ``value`` over the rows with ``x_key`` == x (and ``where``)."""
    return [finite_mean([r[value] for r in rows if r[x_key] == x and all(r[k] == v for k, v in where.items())])
            for x in xs]


def quality(cell: CellResult) -> dict[str, Any]:
    """The batch-level numbers most experiments report for a cell."""
    m = cell.metrics
    return {"psnr": m["psnr_mean"], "ssim": m["ssim_mean"], "mse": m["mse_mean"],
            "label_accuracy": m["label_accuracy"], "iterations": m["iterations"],
            "wall_seconds": round(float(m["wall_seconds"]), 2)}


def leakage_rows(cells: dict[tuple[Any, ...], CellResult], names: tuple[str, ...]) -> list[dict[str, Any]]:
    """One row per finished cell: its key under ``names``, what it attacked (model, width, seed)
    and how well (quality, worst image, recovered)."""
    rows = []
    for key, cell in cells.items():
        if not cell.ok:
            continue
        c, q = cell.config, quality(cell)
        rows.append({**dict(zip(names, key)), **q, "model": c["model"], "width": c["width"], "seed": c["seed"],
                     "psnr_min": min(r["psnr"] for r in cell.metrics["per_image"]),
                     "recovered": q["psnr"] >= THRESHOLD_DB})
    return rows


def image_rows(cell: CellResult, **common: Any) -> list[dict[str, Any]]:
    """One row per private image: ``common`` fields + the image's scores."""
    rows = []
    for p in cell.metrics["per_image"]:
        rows.append({**common, "image": p["index"], "name": p.get("name", ""), "label": p["label_true"],
                     "label_restored": p["label_restored"], "psnr": p["psnr"], "ssim": p["ssim"],
                     "fft2d": p.get("fft2d"), "rpsnr": p.get("rpsnr"), "lpips": p.get("lpips"),
                     "identified": p.get("identified")})
    return rows


def image_grid(cells: Sequence[tuple[str, CellResult]]) -> tuple[list[torch.Tensor], list[str]]:
    """Rows of a figure: the private batch ("original"), then each cell's reconstruction paired
    with it, titled; cells that failed are left out."""
    done = [(title, c) for title, c in cells if c.ok and c.run_dir is not None]
    if not done:
        return [], []
    truth = done[0][1].truth()
    return [truth.images] + [c.paired_images(truth) for _, c in done], ["original"] + [t for t, _ in done]


def save_grid(path: Path, cells: Sequence[tuple[str, CellResult]]) -> bool:
    """Save :func:`image_grid` of ``cells`` as a figure; False (no figure) if every cell failed."""
    from ..report import save_image_grid

    rows, titles = image_grid(cells)
    if rows:
        save_image_grid(path, rows, titles)
    return bool(rows)


def first_reaching(cell: CellResult, psnr_threshold: float) -> tuple[int | None, float | None]:
    """(iteration, seconds) at which the observed PSNR first reached the threshold, else (None,
    None). Seconds are interpolated from the run's wall time (iterations cost about the same)."""
    total = max(1, int(cell.metrics["iterations"]))
    for h in cell.history():
        p = h.get("psnr")
        if p is not None and p >= psnr_threshold:
            it = int(h["iteration"])
            t = h.get("time")
            return it, float(t) if t is not None else float(cell.metrics["wall_seconds"]) * it / total
    return None, None


def psnr_curve(cell: CellResult) -> tuple[list[float], list[float]]:
    """(seconds, psnr) points of the observed PSNR."""
    total = max(1, int(cell.metrics["iterations"]))
    xs, ys = [], []
    for h in cell.history():
        if h.get("psnr") is not None:
            t = h.get("time")
            xs.append(float(t) if t is not None else float(cell.metrics["wall_seconds"]) * int(h["iteration"]) / total)
            ys.append(float(h["psnr"]))
    return xs, ys


# --------------------------------------------------------------------------- GradInversion experiments
def budget(opt: ExperimentOptions) -> tuple[int, int]:
    """(iterations, seeds) of the GradInversion experiments: cpu preset 600 x 4; smoke 100 x 2."""
    return (opt.iterations or (100 if opt.smoke else 600)), (2 if opt.smoke else 4)


def victim(opt: ExperimentOptions) -> tuple[str, int, str]:
    """(model, width, data) of the GradInversion experiments: --model, --width, --data, else the
    BN/ReLU convnet at width 16 (the network the cpu preset was tuned on) on the CIFAR-10 photos."""
    return opt.model or "convnet", opt.width or 16, opt.data or "cifar10-samples"


def gradinversion_cell(iterations: int, seeds: int, bn: str = "exact", **fields: Any) -> dict[str, Any]:
    """GradInversion at the cpu preset with this budget (the preset's schedule scaled to the
    iterations), then ``fields`` (alphas, group, the client's batch...). BN "exact" matches the
    batch statistics the client shares, so that client shares them; "approx" matches the model's
    running statistics (the client shares none)."""
    cell = dict(attack="gradinversion", preset="cpu", iterations=iterations, seeds=seeds, bn=bn,
                log_every=max(1, iterations // 20))
    if bn == "exact":
        cell["share_bn_statistics"] = True
    return {**cell, **fields}


def victim_setup(model: str, width: int, data: str, batch_size: int, samples: int, seed: int) -> dict[str, Any]:
    """The setup lines of the GradInversion experiments' victim: data, model, batch, samples."""
    return {"data": data, "model": f"{model} (width {width}, random init, seed 0; training-mode BN)",
            "batch size": batch_size, "samples": f"{samples} batch(es), seeds {seed}..{seed + samples - 1}"}


def settings_of(cells: Iterable[CellResult]) -> dict[str, Any] | None:
    """The attack's resolved constants as the first finished cell recorded them (metrics "settings")."""
    return next((c.metrics.get("settings") for c in cells if c.ok and c.metrics.get("settings")), None)
