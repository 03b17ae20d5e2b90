"""GradInversion Table 5 (Appendix C, "L_grad cost function"): the l2 distance of Eq. 3 against
cosine similarity (Inverting Gradients' loss) as the gradient-matching loss, on the same batches
with the same budget."""

from __future__ import annotations

from typing import Any

import torch

from ..data import Batch, open_source
from ..errors import DataError
from ..fl import fedsgd
from ..models import ModelSpec, build_model, default_image_size
from ..report import save_line_plot
from .base import ExperimentOptions, ExperimentResult, experiment, markdown_table
from .cells import CellResult, Workspace
from .common import (VERDICT_RULE, THRESHOLD_DB, IMAGE_VERDICT_COLUMNS, convergence_notes, gradinversion_cell, one_batch_victim,
                     image_rows, mean, save_grid, settings_of, summarize, summary_columns,
                     verdict_fields, victim_setup)

DISTANCES = ("l2", "cosine")
# Each objective's fields on top of the cpu preset.
OBJECTIVES: dict[str, dict[str, Any]] = {
    "grad": dict(alpha_tv=0.0, alpha_l2=0.0, alpha_bn=0.0, group="none"),
    "full": {},
}
OBJECTIVE_TEXT = {"grad": "L_grad alone (no prior, no group term)",
                  "full": "cpu preset: L_grad + R_fidelity (BN exact) + R_group registered"}
# GradInversion Table 5 (ResNet-50, ImageNet, 224 px, batch 8): the final gradient vs the true one.
PAPER = {"cosine": {"gradient_l2": 5.965, "sign_match": 79.0, "cosine_distance": 0.139},
         "l2": {"gradient_l2": 3.835, "sign_match": 80.9, "cosine_distance": 0.110}}
FIT = ("gradient_l2", "gradient_l2_total", "sign_match", "cosine_distance", "relative_distance")
COLUMNS = ["objective", "distance", "sample", "seed", "image", "name", "label", "label_restored", "psnr_by_label", "psnr", "ssim", "ssim_by_label", "zero_psnr", "prior_psnr",
           "fft2d", "rpsnr", *FIT, "gradient_distance", *IMAGE_VERDICT_COLUMNS, "iterations", "seeds", "wall_seconds"]
SUMMARY = ["objective", "distance", "gradient_l2", "sign_match", "cosine_distance", "relative_distance",
           "psnr_by_label", "psnr", "ssim", "zero_psnr", "prior_psnr"]
LOWER_IS_BETTER = ("gradient_l2", "gradient_l2_total", "cosine_distance", "relative_distance")


def gradient_fit(answer: list[torch.Tensor], truth: list[torch.Tensor]) -> dict[str, float]:
    """Table 5's columns for the answer's update against the true one (lists of tensors in the same
    parameter order), in float64: ``gradient_l2`` Eq. 3 without alpha_G (sum over parameter tensors
    of the l2 norm of the difference), ``gradient_l2_total`` the l2 norm of the whole difference,
    ``sign_match`` the percentage of entries whose signs agree (sign(0) = 0: a zero matches only a
    zero), ``cosine_distance`` 1 - cosine similarity over all tensors together, and
    ``relative_distance`` ||a - t||^2 / ||t||^2 (the verdict's measure)."""
    a = [x.detach().double().flatten() for x in answer]
    t = [x.detach().double().flatten() for x in truth]
    if len(a) != len(t) or any(x.shape != y.shape for x, y in zip(a, t, strict=True)):
        raise ValueError("gradient_fit: the two updates have different tensors")
    va, vt = torch.cat(a), torch.cat(t)
    diff = va - vt
    norm_t, norm_a = float(vt.norm()), float(va.norm())
    return {"gradient_l2": float(sum(float((x - y).norm()) for x, y in zip(a, t, strict=True))),
            "gradient_l2_total": float(diff.norm()),
            "sign_match": 100.0 * float((torch.sign(va) == torch.sign(vt)).double().mean()),
            "cosine_distance": 1.0 - float(va @ vt) / max(norm_a * norm_t, 1e-300),
            "relative_distance": float(diff.pow(2).sum()) / max(norm_t ** 2, 1e-300)}


def _victim_model(cell: CellResult) -> ModelSpec:
    """The global model the cell's client trained (FedSGD, honest server, random init)."""
    c = cell.config
    source = open_source(c["data"], root=c.get("data_root"), split=c.get("split", "train"))
    size = c.get("image_size") or default_image_size(c["model"])
    return build_model(c["model"], num_classes=c.get("num_classes") or source.num_classes,
                       channels=source.native_channels, image_size=size, seed=int(c.get("model_seed", 0)),
                       width=c.get("width"))


def cell_fit(cell: CellResult, model: ModelSpec) -> dict[str, float]:
    """gradient_fit of the cell's returned answer against its client's true update (recomputed from
    the truth on ``model``, the global model)."""
    truth = cell.truth()
    rec = cell.tensors()
    answer = Batch(images=rec["images"].float(), labels=rec["labels"].long())
    true = fedsgd(model, truth)
    recorded = (cell.metrics.get("update") or {}).get("loss")
    if recorded is None or abs(true.meta.loss - float(recorded)) > 1e-6 * max(1.0, abs(float(recorded))):
        raise DataError(f"cell {cell.cell_id}: the client update rebuilt here (loss {true.meta.loss!r}) is not the "
                        f"one the attack attacked (loss {recorded!r})")
    true_update = true.gradients
    answer_update = fedsgd(model, answer).gradients
    names = list(true_update)
    return gradient_fit([answer_update[n] for n in names], [true_update[n] for n in names])


def _rows(cells: dict[tuple[str, str, int], CellResult], seed: int, seeds: int) -> list[dict[str, Any]]:
    """One row per image of every finished cell, with its cell's fit and verdict."""
    rows: list[dict[str, Any]] = []
    model: ModelSpec | None = None
    for (objective, distance, sample), cell in cells.items():
        if not cell.ok:
            continue
        model = model or _victim_model(cell)
        m = cell.metrics
        common = {"objective": objective, "distance": distance, "sample": sample, "seed": seed + sample,
                  **cell_fit(cell, model), "gradient_distance": m.get("gradient_distance"),
                  "iterations": m["iterations"], "seeds": seeds, "wall_seconds": round(float(m["wall_seconds"]), 2)}
        for r in image_rows(cell, **common):
            r.update(verdict_fields(cell, r["psnr"] >= THRESHOLD_DB, image=r["image"]))
            rows.append(r)
    return rows


def _paired_notes(rows: list[dict[str, Any]], objectives: list[str]) -> list[str]:
    """Per objective: on how many batches l2 beat cosine on each fit column and on PSNR (the
    same batch attacked by both)."""
    notes = []
    for objective in objectives:
        per = {(r["distance"], r["sample"]): r for r in rows if r["objective"] == objective and r["image"] == 0}
        samples = sorted({s for _, s in per if ("l2", s) in per and ("cosine", s) in per})
        if not samples:
            continue
        psnr = {(r["distance"], r["sample"]): [] for r in rows if r["objective"] == objective}
        for r in rows:
            if r["objective"] == objective:
                psnr[(r["distance"], r["sample"])].append(r["psnr"])
        wins = []
        for col in ("gradient_l2", "sign_match", "cosine_distance", "relative_distance"):
            better = sum((per[("l2", s)][col] < per[("cosine", s)][col]) if col in LOWER_IS_BETTER
                         else (per[("l2", s)][col] > per[("cosine", s)][col]) for s in samples)
            wins.append(f"{col} {better}/{len(samples)}")
        better_psnr = sum(mean(psnr[("l2", s)]) > mean(psnr[("cosine", s)]) for s in samples)  # type: ignore[operator]
        wins.append(f"mean PSNR of the batch {better_psnr}/{len(samples)}")
        notes.append(f"'{objective}': l2 fits the true gradient better than cosine on the same batch in "
                     + ", ".join(wins) + " batches.")
    return notes


def _clamp_notes(rows: list[dict[str, Any]]) -> list[str]:
    """Per objective and loss: the returned answer's relative distance beside the attack's own on
    its final iterate (before the pixels are clamped to [0, 1]), where they differ."""
    notes = []
    for o, d in dict.fromkeys((r["objective"], r["distance"]) for r in rows):
        sel = [r for r in rows if r["objective"] == o and r["distance"] == d]
        answer, own = mean(r["relative_distance"] for r in sel), mean(r["relative_gradient_distance"] for r in sel)
        eq3, own_eq3 = mean(r["gradient_l2"] for r in sel), mean(r["gradient_distance"] for r in sel)
        if answer is not None and own is not None and abs(answer - own) > 0.05 * max(own, 1e-12):
            notes.append(f"'{o} {d}': the returned answer (pixels clamped to [0, 1]) fits the true update worse than "
                         f"the attack's final iterate: relative distance {answer:.3f} vs {own:.3f}, Eq. 3 "
                         f"{eq3:.2f} vs {own_eq3:.2f} (columns relative_distance, gradient_l2 vs "
                         "relative_gradient_distance, gradient_distance): the iterate left the pixel box.")
    return notes


def _figures(ws: Workspace, cells: dict[tuple[str, str, int], CellResult], summary: list[dict[str, Any]],
             title: str) -> list[str]:
    figs = ["gradient_loss_fit.png", "gradient_loss_quality.png", "gradient_loss_images.png"]
    names = [f"{r['objective']} {r['distance']}" for r in summary]
    save_line_plot(ws.out / figs[0], names,
                   {"cosine distance": [r["cosine_distance"] for r in summary],
                    "sign mismatch (fraction)": [None if r["sign_match"] is None else 1 - r["sign_match"] / 100
                                                 for r in summary],
                    "relative l2 distance": [r["relative_distance"] for r in summary]},
                   xlabel="objective and gradient loss", ylabel="lower is better", title=title, logy=True)
    save_line_plot(ws.out / figs[1], names, {"PSNR (dB)": [r["psnr"] for r in summary]},
                   xlabel="objective and gradient loss", ylabel="dB (higher is better)", title=title)
    first = [(f"{o} {d}", cells[(o, d, 0)]) for o, d, s in cells if s == 0]
    if not save_grid(ws.out / figs[2], first):
        figs.remove(figs[2])
    return figs


SPEC = {
    "name": "gradient-loss",
    "summary": "GradInversion Table 5: l2 vs cosine as the gradient-matching loss (fit to the true gradient, PSNR)",
}


@experiment("gradient-loss")
def gradient_loss(opt: ExperimentOptions, ws: Workspace) -> ExperimentResult:
    model, width, data, k, samples, iterations, seeds = one_batch_victim(opt, "gradient-loss", "GradInversion with each gradient loss (l2, cosine)")
    objectives = list(OBJECTIVES)

    def cell(objective: str, distance: str, sample: int) -> dict[str, Any]:
        # l2 leaves the flag unset (the default): the same cells as the other experiments' runs
        loss = {} if distance == "l2" else {"distance": distance}
        return {**gradinversion_cell(iterations, seeds, model=model, width=width, data=data, batch_size=k,
                                     seed=opt.seed + sample), **OBJECTIVES[objective], **loss}
    plan = {(o, d, s): cell(o, d, s) for s in range(samples) for o in objectives for d in DISTANCES}
    cells = ws.run(plan, run_folders=list(plan))   # every answer: the fit is computed from its images
    rows = _rows(cells, opt.seed, seeds)
    summary = [{"objective": o, "distance": d,
                **{c: mean([r[c] for r in rows if r["objective"] == o and r["distance"] == d]) for c in SUMMARY[2:]}}
               for o in objectives for d in DISTANCES]
    paper = [{"objective": "paper (ResNet-50, ImageNet)", "distance": d, **PAPER[d]} for d in ("cosine", "l2")]
    notes = ["Means over every image of every batch (the fit columns are per batch, repeated on its images), "
             "with GradInversion Table 5's numbers below ours:\n\n" + markdown_table(SUMMARY, summary + paper) + "\n"]
    notes += _paired_notes(rows, objectives)
    notes += _clamp_notes(rows)
    notes += convergence_notes(cells.values())
    spread = summarize(rows, ["objective", "distance"], values=("psnr_by_label", "psnr", "gradient_l2", "sign_match",
                                                                 "cosine_distance", "zero_psnr", "prior_psnr"), images=True)
    figs = _figures(ws, cells, summary, f"{model} K={k}, {samples} batch(es)")
    return ExperimentResult(
        name="gradient-loss", title="GradInversion gradient loss: l2 vs cosine (Table 5)",
        columns=COLUMNS, rows=rows, figures=figs, notes=notes, summary=spread,
        summary_columns=summary_columns(["objective", "distance"], ("psnr_by_label", "psnr", "gradient_l2", "sign_match",
                                                                    "cosine_distance", "zero_psnr", "prior_psnr"),
                                        images=True),
        setup={**victim_setup(model, width, data, k, samples, opt.seed),
               "success threshold": f"leaked = the image's PSNR >= {THRESHOLD_DB} dB (or a recognisable image); "
                                    f"{VERDICT_RULE}",
               "budget": f"{iterations} iterations x {seeds} seeds for every cell",
               "objectives": {o: OBJECTIVE_TEXT[o] for o in objectives},
               "distances": {"l2": "Eq. 3: sum over parameter tensors of ||dW'_l - dW_l||_2 (the paper's)",
                             "cosine": "1 - cosine similarity of the whole gradient, all layers together "
                                       "(Inverting Gradients' Eq. 4), same alpha_G"},
               "settings": settings_of(c for (o, d, _), c in cells.items() if o == "full" and d == "l2"),
               "fit": "the update of the returned answer (its images in [0, 1], its restored labels) against "
                      "the client's true update, float64: gradient_l2 = Eq. 3 without alpha_G; "
                      "gradient_l2_total = ||difference||_2 of the concatenated update; sign_match = % of entries "
                      "with equal signs; cosine_distance = 1 - cosine similarity; relative_distance = "
                      "||difference||^2 / ||true||^2",
               "gradient_distance": "the attack's own Eq. 3 distance of its final answer before the answer's "
                                    "pixels are clamped to [0, 1] (metrics.json)",
               "paper": "GradInversion Table 5: ResNet-50 (MOCO V2), ImageNet, 224 px, batch 8, 20k iterations",
               "smoke": opt.smoke})
