"""GradInversion Table 2: add each loss term in turn on the same batch with the same budget
(iterations x seeds) and measure how close the reconstruction gets."""

from __future__ import annotations

from typing import Any

from ..report import save_line_plot
from .base import ExperimentOptions, ExperimentResult, experiment, markdown_table
from .cells import Workspace
from .common import (VERDICT_RULE, THRESHOLD_DB, IMAGE_VERDICT_COLUMNS, convergence_notes, gradinversion_cell, image_rows, mean,
                     one_batch_victim, save_grid, settings_of, summarize, summary_columns, verdict_fields, victim_setup)

# Each step's fields on top of the cpu preset (BN exact: the client shares its BN statistics).
STEPS: dict[str, dict[str, Any]] = {
    "noise": dict(alpha_tv=0.0, alpha_l2=0.0, alpha_bn=0.0, group="none", iterations=0),
    "grad": dict(alpha_tv=0.0, alpha_l2=0.0, alpha_bn=0.0, group="none"),
    "+fidelity": dict(group="none"),
    "+group lazy": dict(group="lazy"),
    "+group registered": dict(group="registered"),
}
STEP_TEXT = {"noise": "N(0, I) start", "grad": "L_grad", "+fidelity": "+ R_fidelity (BN exact)",
             "+group lazy": "+ R_group lazy", "+group registered": "+ R_group registered"}
COLUMNS = ["step", "sample", "seed", "image", "name", "label", "label_restored", "psnr_by_label", "psnr", "ssim", "ssim_by_label", "zero_psnr", "prior_psnr",
           "fft2d", "rpsnr", "lpips", "gradient_distance", "candidate_distance_best", "candidate_distance_mean", "answer",
           *IMAGE_VERDICT_COLUMNS,
           "iterations", "seeds", "wall_seconds"]
SUMMARY = ["step", "gradient_distance", "candidate_distance_best", "candidate_distance_mean", "psnr_by_label",
           "psnr", "ssim", "fft2d", "rpsnr", "lpips", "zero_psnr", "prior_psnr"]
LOWER_IS_BETTER = ("gradient_distance", "candidate_distance_best", "candidate_distance_mean", "fft2d", "lpips")


SPEC = {
    "name": "ablation",
    "summary": "GradInversion Table 2: L_grad, + fidelity priors, + group lazy, + group registered",
}


@experiment("ablation")
def ablation(opt: ExperimentOptions, ws: Workspace) -> ExperimentResult:
    model, width, data, k, samples, iterations, seeds = one_batch_victim(opt, "ablation", "GradInversion with each term added in turn")
    plan = {(step, sample): {**gradinversion_cell(iterations, seeds, model=model, width=width, data=data,
                                                  batch_size=k, seed=opt.seed + sample), **changes}
            for sample in range(samples) for step, changes in STEPS.items()}
    cells = ws.run(plan, run_folders=[(step, 0) for step in STEPS])
    rows: list[dict[str, Any]] = []
    per_step: dict[str, list[dict[str, Any]]] = {s: [] for s in STEPS}
    for (step, sample), cell in cells.items():
        if not cell.ok:
            continue
        m = cell.metrics
        cand = m.get("candidate_gradient_distance") or []
        common = {"step": step, "sample": sample, "seed": opt.seed + sample,
                  "gradient_distance": m["gradient_distance"],
                  "candidate_distance_best": min(cand) if cand else None,
                  "candidate_distance_mean": sum(cand) / len(cand) if cand else None,
                  "answer": m.get("answer"), "iterations": m["iterations"], "seeds": seeds,
                  "wall_seconds": round(float(m["wall_seconds"]), 2)}
        img_rows = image_rows(cell, **common)
        for r in img_rows:
            r.update(verdict_fields(cell, r["psnr"] >= THRESHOLD_DB, image=r["image"]))
        rows += img_rows
        per_step[step] += img_rows
    summary = [{"step": s, **{c: mean([r[c] for r in per_step[s]]) for c in SUMMARY[1:]}} for s in STEPS]
    notes = ["Means over every image (and sample) per step:\n\n" + markdown_table(SUMMARY, summary) + "\n"]
    spread = summarize(rows, ["step"], values=("psnr_by_label", "psnr", "rpsnr", "zero_psnr", "prior_psnr"), images=True)
    notes += _monotonicity_notes(summary, {r["step"]: r for r in spread})
    notes += convergence_notes(cells.values())
    figs = ["ablation_quality.png", "ablation_distance.png", "ablation_images.png"]
    names = list(STEPS)
    save_line_plot(ws.out / figs[0], names, {"PSNR (dB)": [r["psnr"] for r in summary],
                                          "RPSNR (dB)": [r["rpsnr"] for r in summary]},
                   xlabel="objective", ylabel="dB (higher is better)", title=f"Ablation, {model} K={k}")
    save_line_plot(ws.out / figs[1], names, {c: [r[c] for r in summary] for c in
                                          ("gradient_distance", "candidate_distance_best", "fft2d")},
                   xlabel="objective", ylabel="lower is better", title="Gradient distance (Eq. 3) and FFT2D",
                   logy=True)
    if not save_grid(ws.out / figs[2], [(STEP_TEXT[step], cells[(step, 0)]) for step in STEPS]):
        figs.remove("ablation_images.png")
    return ExperimentResult(
        name="ablation", title="GradInversion ablation (Table 2): each loss term in turn",
        columns=COLUMNS, rows=rows, figures=figs, notes=notes, summary=spread,
        summary_columns=summary_columns(["step"], ("psnr_by_label", "psnr", "rpsnr", "zero_psnr", "prior_psnr"), images=True),
        setup={**victim_setup(model, width, data, k, samples, opt.seed),
               "success threshold": f"leaked = the image's PSNR >= {THRESHOLD_DB} dB (or a recognisable image); "
                                    f"{VERDICT_RULE}",
               "budget": f"{iterations} iterations x {seeds} seeds for every step (noise: 0 iterations)",
               "settings": settings_of(c for (step, _), c in cells.items() if step == "+group registered"),
               "steps": {s: STEP_TEXT[s] for s in STEPS},
               "gradient distance": "Eq. 3 without alpha_G: sum over parameter tensors of the L2 distance",
               "answer": "group steps: the seeds' consensus; otherwise the best seed by L_grad + R_fidelity",
               "lpips": "null unless the AlexNet/VGG LPIPS weights are in the torch cache",
               "smoke": opt.smoke})


def _monotonicity_notes(summary: list[dict[str, Any]], spread: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """Say plainly where a step did not improve a metric (the paper's Table 2 improves all), with
    how many of each step's samples did not converge and its images' inconclusive verdicts."""
    notes = []
    for prev, cur in zip(summary, summary[1:], strict=False):
        worse = []
        for c in SUMMARY[1:]:
            a, b = prev[c], cur[c]
            if a is None or b is None:
                continue
            if (b > a) if c in LOWER_IS_BETTER else (b < a):
                worse.append(f"{c} {a:.4g} -> {b:.4g}")
        if worse:
            counts = ""
            if spread and prev["step"] in spread and cur["step"] in spread:
                a, b = spread[prev["step"]], spread[cur["step"]]
                counts = (f" (non-converged samples {a['non_converged']}/{a['samples']} -> "
                          f"{b['non_converged']}/{b['samples']}; inconclusive images {a['inconclusive']}/{a['images']}"
                          f" -> {b['inconclusive']}/{b['images']}; PSNR std {_num(a['psnr_std'])} -> "
                          f"{_num(b['psnr_std'])})")
            notes.append(f"'{cur['step']}' did NOT improve on '{prev['step']}' in: " + ", ".join(worse) + counts + ".")
    return notes


def _num(v: Any) -> str:
    return "n/a" if v is None else f"{float(v):.2f}"
