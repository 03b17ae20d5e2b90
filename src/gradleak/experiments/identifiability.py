"""GradInversion Fig. 8: Image Identifiability Precision (IIP) vs batch size, and the
"vulnerable population"."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from ..data import open_source
from ..metrics.identifiability import per_sample_gradient_norms
from ..models import build_model, default_image_size
from ..report import save_line_plot
from .base import ExperimentOptions, ExperimentResult, experiment, markdown_table
from .cells import Workspace
from .common import (VERDICT_RULE, refuse_attacks, trained_victim, IMAGE_VERDICT_COLUMNS, budget, convergence_notes, gradinversion_cell, image_rows, mean,
                     save_grids, summarize, summary_columns, trend_notes, verdict_fields, victim)

# the summary's values: the paper's pairing, the oracle's, then the leak-free baselines (zero, public prior image)
SUMMARY_VALUES = ("psnr_by_label", "psnr", "identified", "zero_psnr", "prior_psnr")
COLUMNS = ["batch_size", "population", "sample", "seed", "image", "name", "label", "label_restored", "grad_norm",
           "psnr_by_label", "psnr", "ssim", "ssim_by_label", "zero_psnr", "prior_psnr", "rpsnr", "fft2d", "lpips", "identified",
           "batch_iip", *IMAGE_VERDICT_COLUMNS, "iterations", "wall_seconds"]


def vulnerable_indices(source: Any, norms: torch.Tensor, k: int) -> list[int]:
    """Per class, the image with the largest gradient norm; then the ``k`` largest of those
    (distinct labels by construction): the items of the "vulnerable" batch, in this order."""
    best: dict[int, int] = {}
    for i in range(len(source)):
        y = source.label(i)
        if y not in best or norms[i] > norms[best[y]]:
            best[y] = i
    chosen = sorted(best.values(), key=lambda i: -float(norms[i]))[:k]
    if len(chosen) < k:
        raise ValueError(f"only {len(chosen)} classes in {source.name}; no vulnerable batch of {k}")
    return chosen


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's rank correlation, tied values given their average rank (scipy's definition; the
    vulnerable batches repeat the same images in every seed, so their norms tie); None below 3
    pairs, when either side is constant or when a value is not finite."""
    import math

    from scipy.stats import spearmanr

    if len(x) < 3 or not all(math.isfinite(v) for v in (*x, *y)) or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    return float(spearmanr(x, y).statistic)


def _train_victim(opt: ExperimentOptions, ws: Workspace, spec: Any, model: str, width: Any,
                  data: str) -> tuple[str | None, str]:
    """(checkpoint, how the victim's weights came about): with ``--trained`` the victim is trained
    first (common.trained_victim) and its weights applied to ``spec``, since the paper's vulnerable
    population is defined on a trained network; else its random initial weights."""
    checkpoint, state = trained_victim(opt, ws, model, width, data)
    if checkpoint is not None:
        from ..training import apply_checkpoint

        apply_checkpoint(spec, checkpoint)
    return checkpoint, state


def _plan(opt: ExperimentOptions, base_cell: Callable[[int], dict[str, Any]], batch_sizes: list[int], samples: int,
          vulnerable_sizes: list[int],
          vulnerable: Callable[[int], list[int]]) -> dict[tuple[int, str, int], dict[str, Any]]:
    """The attack cells: ``samples`` random batches per size, and at ``vulnerable_sizes`` the one
    vulnerable batch, attacked from as many starts."""
    plan: dict[tuple[int, str, int], dict[str, Any]] = {}
    for k in batch_sizes:
        base = base_cell(k)
        for s in range(samples):
            plan[(k, "random", s)] = {**base, "seed": opt.seed + s}
        if k in vulnerable_sizes:  # one fixed batch; the samples differ in the attack's start
            for s in range(samples):
                plan[(k, "vulnerable", s)] = {**base, "seed": opt.seed + s, "indices": vulnerable(k)}
    return plan


def _attacked_images(cells: dict[Any, Any], spec: Any) -> tuple[list[dict[str, Any]], Any, Any]:
    """One row per attacked image (with its per-sample gradient norm and verdict), and the IIP
    feature space and pool size the cells report."""
    rows: list[dict[str, Any]] = []
    feature_space, pool_size = None, None
    for (k, population, sample), cell in cells.items():
        if not cell.ok:
            continue
        m = cell.metrics
        feature_space, pool_size = m.get("iip_feature_space"), m.get("iip_pool_size")
        batch_norms = per_sample_gradient_norms(spec, cell.truth())
        img = image_rows(cell, batch_size=k, population=population, sample=sample, seed=cell.config["seed"],
                         batch_iip=m.get("iip"), iterations=m["iterations"],
                         wall_seconds=round(float(m["wall_seconds"]), 2))
        for r in img:
            r["grad_norm"] = float(batch_norms[r["image"]])
            r.update(verdict_fields(cell, bool(r["identified"]) if r["identified"] is not None else None, image=r["image"]))
        rows += img
    return rows, feature_space, pool_size


def _iip_rows(rows: list[dict[str, Any]], batch_sizes: list[int]) -> list[dict[str, Any]]:
    """IIP, mean PSNR and mean gradient norm per batch size and population."""
    iip_rows = []
    for k in batch_sizes:
        for population in ("random", "vulnerable"):
            sel = [r for r in rows if r["batch_size"] == k and r["population"] == population]
            if sel:
                iip_rows.append({"batch_size": k, "population": population, "images": len(sel),
                                 "iip": mean([float(bool(r["identified"])) for r in sel]),
                                 "psnr_by_label": mean([r["psnr_by_label"] for r in sel]),
                                 "psnr": mean([r["psnr"] for r in sel]),
                                 "prior_psnr": mean([r["prior_psnr"] for r in sel]),
                                 "grad_norm": mean([r["grad_norm"] for r in sel])})
    return iip_rows


def _iip_notes(rows: list[dict[str, Any]], iip_rows: list[dict[str, Any]], pool_size: Any) -> list[str]:
    """The IIP table, the rank correlation of gradient norm and PSNR, and IIP's chance level."""
    rho = spearman([r["grad_norm"] for r in rows], [r["psnr"] for r in rows])
    rho_random = spearman([r["grad_norm"] for r in rows if r["population"] == "random"],
                          [r["psnr"] for r in rows if r["population"] == "random"])
    return ["IIP per batch size and population (share of images whose nearest neighbour is their original):\n\n"
            + markdown_table(["batch_size", "population", "images", "iip", "psnr_by_label", "psnr", "prior_psnr",
                             "grad_norm"], iip_rows) + "\n",
            f"Spearman rank correlation of per-sample gradient norm and reconstruction PSNR: "
            f"{'n/a' if rho is None else f'{rho:.3f}'} over all {len(rows)} images; "
            f"{'n/a' if rho_random is None else f'{rho_random:.3f}'} over the random batches only.",
            f"Chance level of IIP is about 1/{pool_size} (candidates searched)."]


def _figures(out: Path, cells: dict[Any, Any], rows: list[dict[str, Any]], iip_rows: list[dict[str, Any]],
             batch_sizes: list[int], title: str) -> list[str]:
    """IIP vs batch size, gradient norm vs PSNR and (where any) the reconstructions."""
    figs = ["iip_vs_batch_size.png", "grad_norm_vs_psnr.png"]
    series = {p: [next((r["iip"] for r in iip_rows if r["batch_size"] == k and r["population"] == p), None)
                  for k in batch_sizes] for p in ("random", "vulnerable")}
    save_line_plot(out / figs[0], batch_sizes, series, xlabel="batch size K", ylabel="IIP", title=title)
    _scatter(out / figs[1], rows)
    if save_grids(out / "reconstructions.png",
                  [(f"K = {k}, {population}", [(_grid_title(cells[(k, population, 0)], rows), cells[(k, population, 0)])])
                   for k in batch_sizes for population in ("random", "vulnerable") if (k, population, 0) in cells]):
        figs.append("reconstructions.png")
    return figs


SPEC = {
    "name": "identifiability",
    "summary": ("GradInversion Fig. 8: IIP vs batch size, and gradient norm vs reconstruction quality (--trained: on a "
                "victim trained first)"),
    "accepts": ["trained"],
}


@experiment("identifiability")
def identifiability(opt: ExperimentOptions, ws: Workspace) -> ExperimentResult:
    refuse_attacks(opt, "identifiability", "GradInversion")
    model, width, data = victim(opt)
    batch_sizes = opt.batch_sizes or ([1, 4] if opt.smoke else [1, 2, 4, 8])
    samples = opt.samples or (1 if opt.smoke else 3)
    iterations, seeds = budget(opt)
    source = open_source(data)
    size, channels = default_image_size(model), source.native_channels
    spec = build_model(model, num_classes=source.num_classes, channels=channels, image_size=size, seed=0, width=width)
    checkpoint, victim_state = _train_victim(opt, ws, spec, model, width, data)
    all_images = torch.stack([source.load(i, size, channels) for i in range(len(source))])
    all_labels = torch.tensor([source.label(i) for i in range(len(source))], dtype=torch.int64)
    norms = per_sample_gradient_norms(spec, all_images, all_labels)  # the same weights as the attacked model
    vulnerable_sizes = batch_sizes[-1:] if opt.smoke else batch_sizes

    def base_cell(k: int) -> dict[str, Any]:
        return gradinversion_cell(iterations, seeds, model=model, width=width, data=data,
                                  num_classes=source.num_classes, batch_size=k,
                                  **({"checkpoint": checkpoint} if checkpoint else {}))
    plan = _plan(opt, base_cell, batch_sizes, samples, vulnerable_sizes,
                 lambda k: vulnerable_indices(source, norms, k))
    # The first sample's run folders: the pictures show each size's first random and vulnerable batch.
    cells = ws.run(plan, run_folders=[key for key in plan if key[2] == 0])
    rows, feature_space, pool_size = _attacked_images(cells, spec)
    by = ["batch_size", "population"]
    spread = summarize(rows, by, values=SUMMARY_VALUES, images=True)
    iip_rows = _iip_rows(rows, batch_sizes)
    notes = _iip_notes(rows, iip_rows, pool_size)
    notes += convergence_notes(cells.values())
    notes += trend_notes(spread, "batch_size", falls=True, within=("population",), value="identified", unit="",
                         claim="identifiability (IIP) falls as the batch size grows (GradInversion Fig. 8)")
    figs = _figures(ws.out, cells, rows, iip_rows, batch_sizes,
                    title=f"IIP, {model}{' (trained)' if opt.trained else ''} on {data}, {feature_space}")
    return ExperimentResult(
        name="identifiability", title="Image Identifiability Precision vs batch size; the vulnerable population",
        columns=COLUMNS, rows=rows, figures=figs, notes=notes, summary=spread,
        summary_columns=summary_columns(by, SUMMARY_VALUES, images=True),
        setup={"data": f"{data} ({len(source)} images)", "model": f"{model} (width {width}, {victim_state})",
               "attack": f"gradinversion, cpu preset at {iterations} iterations x {seeds} seeds, BN exact",
               "batch sizes": batch_sizes, "random batches per size": samples,
               "seeds": f"{opt.seed}..{opt.seed + samples - 1} (sample_batch seed; the attack uses the same seed)",
               "vulnerable batches": f"batch sizes {vulnerable_sizes}: per class the image with the largest "
                                     "per-sample gradient norm, then the K largest of those; attacked once per "
                                     "seed (the same batch, another start)",
               "success threshold": f"leaked = identified (IIP hit), or PSNR >= 20 dB; {VERDICT_RULE}; "
                                    "identified_mean = IIP",
               "iip feature space": feature_space, "iip candidates": pool_size,
               "iip pool": "the data source's real images (up to 256, evenly spaced; originals de-duplicated)",
               "grad norm": "||d CE(f(x_k), y_k) / d W||_2 per image, eval-mode BN (per_sample_gradient_norms)",
               "identified": "nearest neighbour (cosine) is the image's own original, strictly",
               "pictures": "reconstructions.png: each batch size's first random and (where attacked) vulnerable "
                           "batch, originals above their reconstructions (paired), with PSNR and IIP",
               "smoke": opt.smoke})


def _grid_title(cell: Any, rows: list[dict[str, Any]]) -> str:
    """A reconstruction row's title: mean PSNR, IIP hits of the batch and its verdicts."""
    if not cell.ok:
        return "reconstruction (failed)"
    key = cell.key
    sel = [r for r in rows if (r["batch_size"], r["population"], r["sample"]) == tuple(key)]
    hits = sum(bool(r["identified"]) for r in sel)
    verdicts = sorted({str(r["verdict"]) for r in sel})
    return (f"reconstruction, {cell.metrics['psnr_mean']:.1f} dB, identified {hits}/{len(sel)}, "
            f"{'/'.join(verdicts)}")


def _scatter(path: Path, rows: list[dict[str, Any]]) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0), dpi=100, facecolor="white", layout="constrained")
    ax = fig.add_subplot()
    keys = sorted({(r["population"], r["batch_size"]) for r in rows})
    for pop, k in keys:
        sel = [r for r in rows if r["population"] == pop and r["batch_size"] == k]
        hit = [r for r in sel if r["identified"]]
        miss = [r for r in sel if not r["identified"]]
        marker = "o" if pop == "random" else "^"
        pts = ax.scatter([r["grad_norm"] for r in hit], [r["psnr"] for r in hit], marker=marker, s=30,
                         label=f"{pop} K={k}")
        ax.scatter([r["grad_norm"] for r in miss], [r["psnr"] for r in miss], marker=marker, s=30,
                   facecolors="none", edgecolors=pts.get_facecolor())
    ax.set_xlabel("per-sample gradient l2 norm")
    ax.set_ylabel("reconstruction PSNR (dB)")
    ax.set_title("Vulnerable population: filled = identified (IIP hit)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.savefig(path)
