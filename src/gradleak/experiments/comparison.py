"""GradInversion Table 4: DLG vs Inverting Gradients vs GradInversion (BN approx) vs
GradInversion (BN exact) on the same private batches, at the same budget of gradient
evaluations.

Budget: T iterations x G seeds. GradInversion optimises G seeds for T Adam steps; Inverting
Gradients gets G restarts for T signed-Adam steps (its best restart by objective is its answer);
DLG (L-BFGS, up to 20 function evaluations per step, float64, as its authors ran it) gets
T * G / 20 steps, i.e. at most the same number of gradient evaluations. Wall time is reported
for each. The rows give every image of every batch; the notes give means per method.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..metrics import evaluate
from ..report import save_image_grid, save_line_plot
from .ablation import budget, image_rows, mean, run_case, step_settings
from .base import ExperimentOptions, ExperimentResult, experiment, markdown_table

METHODS = ("dlg", "ig", "gradinversion-bn-approx", "gradinversion-bn-exact")
COLUMNS = ["method", "sample", "seed", "image", "name", "label", "label_restored", "psnr", "ssim", "fft2d", "rpsnr",
           "lpips", "identified", "label_accuracy", "gradient_distance", "iterations", "wall_seconds"]
SUMMARY = ["method", "psnr", "ssim", "fft2d", "rpsnr", "lpips", "label_accuracy", "gradient_distance", "wall_seconds"]


def _run(method: str, iterations: int, seeds: int, **fields: Any):  # noqa: ANN202
    if method == "dlg":
        return run_case(attack="dlg", iterations=max(1, round(iterations * seeds / 20)), **fields)
    if method == "ig":
        return run_case(attack="ig", iterations=iterations, settings_changes={"seeds": seeds}, **fields)
    bn = method.rsplit("-", 1)[-1]
    return run_case(attack="gradinversion", gi=step_settings(iterations, seeds, bn=bn), **fields)


@experiment("comparison", "GradInversion Table 4: DLG vs Inverting Gradients vs GradInversion BN approx / exact")
def comparison(opt: ExperimentOptions, out: Path) -> ExperimentResult:
    model = opt.model or "convnet"
    width = opt.width or 16
    data = opt.data or "cifar10-samples"
    k = (opt.batch_sizes or [4])[0]
    samples = opt.samples or (1 if opt.smoke else 3)
    iterations, seeds = budget(opt)
    methods = [m for m in METHODS if not opt.attacks or m in opt.attacks or m.split("-")[0] in opt.attacks]
    rows: list[dict[str, Any]] = []
    grid, titles = [], []
    for sample in range(samples):
        seed = opt.seed + sample
        for method in methods:
            res, case = _run(method, iterations, seeds, model=model, width=width, data=data, batch_size=k, seed=seed,
                             log_every=max(1, iterations // 20))
            m, rec = res.metrics, res.reconstruction
            rows += image_rows(res, method=method, sample=sample, seed=seed, label_accuracy=m["label_accuracy"],
                               gradient_distance=rec.extra.get("gradient_distance"), iterations=rec.iterations,
                               wall_seconds=round(rec.wall_seconds, 2))
            if opt.progress:
                print(f"comparison: sample {sample} {method}: PSNR {m['psnr_mean']:.2f} dB, labels "
                      f"{m['label_accuracy']:.2f}, {rec.wall_seconds:.1f} s", flush=True)
            if sample == 0:
                if not grid:
                    grid.append(case.truth.images)
                    titles.append("original")
                grid.append(evaluate(rec, case.truth).paired_images)
                titles.append(method)
    summary = [{"method": mt, **{c: mean([r[c] for r in rows if r["method"] == mt]) for c in SUMMARY[1:]}}
               for mt in methods]
    notes = ["Means over every image of every batch:\n\n" + markdown_table(SUMMARY, summary) + "\n"]
    if all(r["lpips"] is None for r in rows):
        notes.append("LPIPS is null: its AlexNet/VGG weights are not in the torch cache (no random backbone is used).")
    if "gradinversion-bn-approx" in methods:
        notes.append("BN approx regularises towards the model's running statistics; for a randomly initialised "
                     "model these are the initial 0/1, not statistics learnt from the data as in the paper.")
    best = max(summary, key=lambda r: r["psnr"] if r["psnr"] is not None else -1.0)
    notes.append(f"Highest mean PSNR: {best['method']} ({best['psnr']:.2f} dB).")
    figs = ["comparison_quality.png", "comparison_images.png"]
    save_line_plot(out / figs[0], [r["method"] for r in summary],
                   {"PSNR (dB)": [r["psnr"] for r in summary], "RPSNR (dB)": [r["rpsnr"] for r in summary]},
                   xlabel="method", ylabel="dB (higher is better)", title=f"{model} K={k}, {samples} batch(es)")
    save_image_grid(out / figs[1], grid, titles)
    return ExperimentResult(
        name="comparison", title="DLG vs Inverting Gradients vs GradInversion (Table 4)",
        columns=COLUMNS, rows=rows, figures=figs, notes=notes,
        setup={"data": data, "model": f"{model} (width {width}, random init, seed 0; training-mode BN)",
               "batch size": k, "samples": f"{samples} batch(es), seeds {opt.seed}..{opt.seed + samples - 1}",
               "budget": f"{iterations} iterations x {seeds} seeds/restarts; "
                         f"DLG {max(1, round(iterations * seeds / 20))} "
                         "L-BFGS steps (<= 20 evaluations each)",
               "methods": {"dlg": "DLG: L-BFGS, float64, joint soft labels",
                           "ig": "Inverting Gradients: cosine + TV 0.1, signed Adam, step decay, restarts",
                           "gradinversion-bn-approx": "cpu preset, BN prior towards the running statistics",
                           "gradinversion-bn-exact": "cpu preset, BN prior towards the client's shared batch "
                                                     "statistics"},
               "gradinversion settings": step_settings(iterations, seeds).to_dict(),
               "labels": "restored from the gradient (Eq. 8) for ig and gradinversion; DLG optimises soft labels",
               "lpips": "null unless the AlexNet/VGG LPIPS weights are in the torch cache",
               "torch threads": torch.get_num_threads(), "smoke": opt.smoke})
