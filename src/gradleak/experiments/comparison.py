"""GradInversion Table 4: DLG vs Inverting Gradients vs GradInversion (BN approx) vs
GradInversion (BN exact) on the same private batches, at the same budget of gradient
evaluations."""

from __future__ import annotations

from typing import Any

from ..report import save_line_plot
from .base import ExperimentOptions, ExperimentResult, experiment, markdown_table
from .cells import CellResult, Workspace
from .common import (VERDICT_RULE, DLG_STOP, THRESHOLD_DB, IMAGE_VERDICT_COLUMNS, budget, convergence_notes, gradinversion_cell, image_rows, mean,
                     save_grid, settings_of, summarize, summary_columns, trained_victim, verdict_fields, victim,
                     victim_setup)

# deepinversion: Table 4's DeepInversion row (Yin et al. 2020): no gradient matching (alpha_G = 0), the fidelity
# prior towards the model's running BN statistics and DeepInversion's class term (Eq. 1, the restored labels'
# cross-entropy) at its ratio to the BN term, 1 : 0.01 (its ImageNet setting, r_feature 0.01), on the cpu
# preset's alpha_BN of 1
DEEPINVERSION_ALPHA_CE = 100.0
METHODS = ("deepinversion", "dlg", "ig", "gradinversion-bn-approx", "gradinversion-bn-exact")
COLUMNS = ["method", "sample", "seed", "image", "name", "label", "label_restored", "psnr_by_label", "psnr", "ssim", "ssim_by_label", "zero_psnr", "prior_psnr",
           "fft2d", "rpsnr", "lpips", "identified", "label_accuracy", "gradient_distance", *IMAGE_VERDICT_COLUMNS, "iterations",
           "wall_seconds"]
SUMMARY = ["method", "psnr_by_label", "psnr", "ssim", "fft2d", "rpsnr", "lpips", "label_accuracy", "gradient_distance",
           "zero_psnr", "prior_psnr", "wall_seconds"]


def dlg_steps(iterations: int, seeds: int) -> int:
    """DLG's L-BFGS steps at the budget: at most iterations x seeds gradient evaluations, 20 a step."""
    return max(1, round(iterations * seeds / 20))


def method_cell(method: str, iterations: int, seeds: int, **fields: Any) -> dict[str, Any]:
    """The cell of ``method`` at the budget (iterations x seeds) on the client's batch ``fields``."""
    log_every = max(1, iterations // 20)
    if method == "dlg":
        # one trial: the restart portfolio would run up to 4 (the budget is per method)
        return dict(attack="dlg", iterations=dlg_steps(iterations, seeds), stall_restarts=0, stop=DLG_STOP, log_every=log_every,
                    **fields)
    if method == "ig":
        return dict(attack="ig", iterations=iterations, restarts=seeds, log_every=log_every, **fields)
    if method == "deepinversion":
        return gradinversion_cell(iterations, seeds, bn="approx", alpha_g=0.0, alpha_ce=DEEPINVERSION_ALPHA_CE, **fields)
    return gradinversion_cell(iterations, seeds, bn=method.rsplit("-", 1)[-1], **fields)


SPEC = {
    "name": "comparison",
    "summary": "GradInversion Table 4: DLG vs Inverting Gradients vs GradInversion BN approx / exact",
    "accepts": ["trained"],
}


@experiment("comparison")
def comparison(opt: ExperimentOptions, ws: Workspace) -> ExperimentResult:
    model, width, data = victim(opt)
    k = (opt.batch_sizes or [4])[0]
    samples = opt.samples or (1 if opt.smoke else 3)
    iterations, seeds = budget(opt)
    methods = [m for m in METHODS if not opt.attacks or m in opt.attacks or m.split("-")[0] in opt.attacks]
    checkpoint, weights = trained_victim(opt, ws, model, width, data)
    victim_fields = {"checkpoint": checkpoint} if checkpoint else {}
    plan = {(method, sample): method_cell(method, iterations, seeds, model=model, width=width, data=data,
                                          batch_size=k, seed=opt.seed + sample, **victim_fields)
            for sample in range(samples) for method in methods}
    cells = ws.run(plan, run_folders=[(method, 0) for method in methods])
    rows = _rows(cells, opt.seed)
    spread = summarize(rows, ["method"], values=("psnr_by_label", "psnr", "rpsnr", "zero_psnr", "prior_psnr"), images=True)
    summary = [{"method": mt, **{c: mean([r[c] for r in rows if r["method"] == mt]) for c in SUMMARY[1:]}}
               for mt in methods]
    notes = _notes(cells, rows, methods, summary, spread, trained=bool(checkpoint))
    figs = ["comparison_quality.png", "comparison_images.png"]
    save_line_plot(ws.out / figs[0], [r["method"] for r in summary],
                   {"PSNR (dB)": [r["psnr"] for r in summary], "RPSNR (dB)": [r["rpsnr"] for r in summary]},
                   xlabel="method", ylabel="dB (higher is better)",
                   title=f"{model}{' (trained)' if checkpoint else ''} K={k}, {samples} batch(es)")
    if not save_grid(ws.out / figs[1], [(method, cells[(method, 0)]) for method in methods]):
        figs.remove("comparison_images.png")
    return ExperimentResult(
        name="comparison", title="DLG vs Inverting Gradients vs GradInversion (Table 4)",
        columns=COLUMNS, rows=rows, figures=figs, notes=notes, summary=spread,
        summary_columns=summary_columns(["method"], ("psnr_by_label", "psnr", "rpsnr", "zero_psnr", "prior_psnr"), images=True),
        setup={**victim_setup(model, width, data, k, samples, opt.seed, weights),
               **_method_setup(cells, iterations, seeds),
               "torch threads": ws.threads(), "smoke": opt.smoke})


def _rows(cells: dict[tuple[str, int], CellResult], seed: int) -> list[dict[str, Any]]:
    """One row per image of every finished cell, with its verdict."""
    rows: list[dict[str, Any]] = []
    for (method, sample), cell in cells.items():
        if cell.ok:
            m = cell.metrics
            img = image_rows(cell, method=method, sample=sample, seed=seed + sample,
                             label_accuracy=m["label_accuracy"], gradient_distance=m.get("gradient_distance"),
                             iterations=m["iterations"], wall_seconds=round(float(m["wall_seconds"]), 2))
            for r in img:
                r.update(verdict_fields(cell, r["psnr"] >= THRESHOLD_DB, image=r["image"]))
            rows += img
    return rows


def _notes(cells: dict[tuple[str, int], CellResult], rows: list[dict[str, Any]], methods: list[str],
           summary: list[dict[str, Any]], spread: list[dict[str, Any]], *, trained: bool) -> list[str]:
    """The table of means, convergence, LPIPS and BN-approx caveats, and the best method."""
    notes = ["Means over every image of every batch:\n\n" + markdown_table(SUMMARY, summary) + "\n"]
    notes += convergence_notes(cells.values())
    if all(r["lpips"] is None for r in rows):
        notes.append("LPIPS is null: its AlexNet/VGG weights are not in the torch cache (no random backbone is used).")
    if "gradinversion-bn-approx" in methods:
        notes.append("BN approx regularises towards the model's running statistics: " + (
            "the trained victim's, learnt from the training split (as in the paper)." if trained else
            "for a randomly initialised model these are the initial 0/1, not statistics learnt from the data as in "
            "the paper (--trained trains the victim first)."))
    best = max(summary, key=lambda r: r["psnr"] if r["psnr"] is not None else -1.0)
    if best["psnr"] is not None:
        b = next((r for r in spread if r["method"] == best["method"]), None)
        notes.append(f"Highest mean PSNR: {best['method']} ({best['psnr']:.2f} dB"
                     + (f"; {b['non_converged']} of {b['samples']} samples did not converge, "
                        f"{b['inconclusive']} of {b['images']} images inconclusive" if b else "") + ").")
    return notes


def _method_setup(cells: dict[tuple[str, int], CellResult], iterations: int, seeds: int) -> dict[str, Any]:
    """The setup's entries on the methods: threshold, budget, what each method is, labels, LPIPS."""
    return {"success threshold": f"leaked = the image's PSNR >= {THRESHOLD_DB} dB (or a recognisable image); "
                                 f"{VERDICT_RULE}",
            "budget": f"{iterations} iterations x {seeds} seeds/restarts; "
                      f"DLG {dlg_steps(iterations, seeds)} "
                      "L-BFGS steps (<= 20 evaluations each)",
            "methods": {"deepinversion": "DeepInversion (Table 4's row): no gradient matching (alpha_G = 0), the cpu "
                                         "preset's fidelity prior with the BN prior towards the running statistics, "
                                         "and DeepInversion's class term (the restored labels' cross-entropy, the "
                                         f"model in eval mode) at alpha_CE = {DEEPINVERSION_ALPHA_CE:g}, DeepInversion's "
                                         "1 : 0.01 to its BN term",
                        "dlg": "DLG: L-BFGS, float64, joint soft labels",
                        "ig": "Inverting Gradients: cosine + TV 0.1, signed Adam, step decay, restarts",
                        "gradinversion-bn-approx": "cpu preset, BN prior towards the running statistics",
                        "gradinversion-bn-exact": "cpu preset, BN prior towards the client's shared batch "
                                                  "statistics"},
            "gradinversion settings": settings_of(c for (mt, _), c in cells.items()
                                                  if mt == "gradinversion-bn-exact"),
            "labels": "restored from the gradient (Eq. 8) for ig and gradinversion; DLG optimises soft labels",
            "lpips": "null unless the AlexNet/VGG LPIPS weights are in the torch cache"}
