"""GradInversion Table 2: add each loss term in turn on the same batch with the same budget
(iterations x seeds) and measure how close the reconstruction gets:

    noise        the N(0, I) start (0 iterations), the table's first row
    grad         L_grad only (Eq. 3): alpha_TV = alpha_l2 = alpha_BN = 0, group none
    +fidelity    + R_fidelity (Eq. 9-10): TV, L2 and BN (exact: the client shares its BN statistics)
    +group lazy  + R_group towards the pixel-wise mean of the G seeds (Eq. 11)
    +group reg   + R_group towards the registered mean (Eq. 12)

Reported per step and per image: PSNR, SSIM, FFT2D, RPSNR (and LPIPS when its weights are
cached), and per step the gradient distance (Eq. 3 without alpha_G) of the final answer (the
seeds' consensus when a group term is on, else the best seed) and of the optimised candidates
(best and mean over the G seeds).

This module also holds :func:`run_case`, the one-attack helper the GradInversion experiments
share (it passes full GradInversionSettings, which the CLI config cannot express, and can attack
a given batch instead of a drawn one).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..attacks import AttackSettings, run_attack
from ..attacks.gradinversion import GradInversionSettings, gradinversion, resolve_settings
from ..config import AttackConfig, make_config
from ..data import Batch
from ..metrics import evaluate
from ..models import build_model
from ..report import save_image_grid, save_line_plot
from ..runner import (Case, PSNRObserver, RunResult, attack_settings, build_metrics, client_update, prepare,
                      resolve_device)
from .base import ExperimentOptions, ExperimentResult, experiment, markdown_table

PAPER_KEYS = ("fft2d_mean", "rpsnr_mean", "lpips_mean", "iip")


def run_case(*, gi: GradInversionSettings | None = None, batch: Batch | None = None,
             settings_changes: dict[str, Any] | None = None, **fields: Any) -> tuple[RunResult, Case]:
    """One attack through the runner's parts (client simulation, attack settings, evaluation),
    without a run folder. ``fields`` are AttackConfig fields. ``gi``: full GradInversion
    settings (attack must be "gradinversion"); ``batch``: attack this batch instead of drawing
    one with ``seed``; ``settings_changes``: AttackSettings fields set after the config's (e.g.
    Inverting Gradients' restarts = ``seeds``). Metrics always include the paper's FFT2D,
    RPSNR, LPIPS (None without its weights) and IIP."""
    fields.setdefault("progress", False)
    if "paper_metrics" in AttackConfig.model_fields:
        fields.setdefault("paper_metrics", True)
    if gi is not None and fields.get("attack") == "gradinversion":
        fields.setdefault("bn", gi.bn)  # the simulated client shares BN statistics iff bn is exact
    cfg = make_config(**fields)
    device = resolve_device(cfg.device)
    if batch is None:
        case = prepare(cfg)
    else:
        model = build_model(cfg.model, num_classes=cfg.num_classes or len(batch.class_names) or None,
                            channels=int(batch.images.shape[1]), image_size=int(batch.images.shape[-1]),
                            seed=cfg.model_seed, width=cfg.width)
        update = client_update(cfg, model, batch, share_bn_statistics=cfg.share_bn_statistics or cfg.bn == "exact")
        case = Case(update=update, model=model, truth=batch, data=batch.source)
    settings = attack_settings(cfg, device)
    if settings_changes:
        settings = replace(settings, **settings_changes)
    observer = PSNRObserver(case.truth) if case.truth is not None else None
    if gi is not None:
        recon = gradinversion(case.update, case.model, settings, observer, gi=gi)
    else:
        recon = run_attack(cfg.attack, case.update, case.model, settings, observer)
    metrics = build_metrics(cfg, case, recon, device)
    if case.truth is not None and "fft2d_mean" not in metrics:
        from ..metrics.summary import paper_metrics
        from ..runner import iip_pool

        summary, per_image = paper_metrics(evaluate(recon, case.truth).paired_images, case.truth.images,
                                           iip_pool(cfg, case))
        metrics.update(summary)
        for row, extra in zip(metrics["per_image"], per_image):
            row.update(extra)
    history = [dict(h) for h in recon.history]
    if observer is not None:
        for h in history:
            if int(h["iteration"]) in observer.points:
                h["psnr"] = observer.points[int(h["iteration"])]
    return RunResult(run_dir=None, metrics=metrics, reconstruction=recon, history=history), case


def image_rows(res: RunResult, **common: Any) -> list[dict[str, Any]]:
    """One row per private image: ``common`` fields + the image's scores."""
    rows = []
    for p in res.metrics["per_image"]:
        rows.append({**common, "image": p["index"], "name": p.get("name", ""), "label": p["label_true"],
                     "label_restored": p["label_restored"], "psnr": p["psnr"], "ssim": p["ssim"],
                     "fft2d": p.get("fft2d"), "rpsnr": p.get("rpsnr"), "lpips": p.get("lpips"),
                     "identified": p.get("identified")})
    return rows


STEPS: dict[str, dict[str, Any]] = {
    "noise": dict(alpha_tv=0.0, alpha_l2=0.0, alpha_bn=0.0, group="none", iterations=0),
    "grad": dict(alpha_tv=0.0, alpha_l2=0.0, alpha_bn=0.0, group="none"),
    "+fidelity": dict(group="none"),
    "+group lazy": dict(group="lazy"),
    "+group registered": dict(group="registered"),
}
STEP_TEXT = {"noise": "N(0, I) start", "grad": "L_grad", "+fidelity": "+ R_fidelity (BN exact)",
             "+group lazy": "+ R_group lazy", "+group registered": "+ R_group registered"}
COLUMNS = ["step", "sample", "seed", "image", "name", "label", "psnr", "ssim", "fft2d", "rpsnr", "lpips",
           "gradient_distance", "candidate_distance_best", "candidate_distance_mean", "answer", "iterations",
           "seeds", "wall_seconds"]
SUMMARY = ["step", "gradient_distance", "candidate_distance_best", "candidate_distance_mean", "psnr", "ssim",
           "fft2d", "rpsnr", "lpips"]
LOWER_IS_BETTER = ("gradient_distance", "candidate_distance_best", "candidate_distance_mean", "fft2d", "lpips")


def budget(opt: ExperimentOptions) -> tuple[int, int]:
    """(iterations, seeds) of the GradInversion experiments: cpu preset 600 x 4; smoke 100 x 2."""
    return (opt.iterations or (100 if opt.smoke else 600)), (2 if opt.smoke else 4)


def step_settings(iterations: int, seeds: int, **changes: Any) -> GradInversionSettings:
    """The cpu preset at this budget (registration start/every scaled with the iterations), then
    ``changes`` (alphas, group, bn)."""
    base = resolve_settings(AttackSettings(preset="cpu", iterations=iterations, seeds=seeds))
    return replace(base, **changes).validate()


def mean(values: list[Any]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


@experiment("ablation", "GradInversion Table 2: L_grad, + fidelity priors, + group lazy, + group registered")
def ablation(opt: ExperimentOptions, out: Path) -> ExperimentResult:
    model = opt.model or "convnet"
    width = opt.width or 16
    data = opt.data or "cifar10-samples"
    k = (opt.batch_sizes or [4])[0]
    samples = opt.samples or 1
    iterations, seeds = budget(opt)
    rows: list[dict[str, Any]] = []
    per_step: dict[str, list[dict[str, Any]]] = {s: [] for s in STEPS}
    grid_rows: list[torch.Tensor] = []
    grid_titles: list[str] = []
    for sample in range(samples):
        seed = opt.seed + sample
        for step, changes in STEPS.items():
            ch = dict(changes)
            n_iter = ch.pop("iterations", iterations)
            gi = step_settings(iterations, seeds, bn="exact", **ch)
            gi = replace(gi, iterations=n_iter)
            res, case = run_case(attack="gradinversion", model=model, width=width, data=data, batch_size=k,
                                 seed=seed, gi=gi, log_every=max(1, iterations // 20))
            ex = res.reconstruction.extra
            cand = ex["candidate_gradient_distance"]
            common = {"step": step, "sample": sample, "seed": seed, "gradient_distance": ex["gradient_distance"],
                      "candidate_distance_best": min(cand), "candidate_distance_mean": sum(cand) / len(cand),
                      "answer": ex["answer"], "iterations": res.reconstruction.iterations, "seeds": gi.seeds,
                      "wall_seconds": round(res.reconstruction.wall_seconds, 2)}
            img_rows = image_rows(res, **common)
            rows += img_rows
            per_step[step] += img_rows
            if opt.progress:
                print(f"ablation: sample {sample} {step}: distance {ex['gradient_distance']:.3f} "
                      f"(candidates best {min(cand):.3f}), PSNR {res.metrics['psnr_mean']:.2f} dB", flush=True)
            if sample == 0:
                if not grid_rows:
                    grid_rows.append(case.truth.images)
                    grid_titles.append("original")
                grid_rows.append(evaluate(res.reconstruction, case.truth).paired_images)
                grid_titles.append(STEP_TEXT[step])
    summary = [{"step": s, **{c: mean([r[c] for r in per_step[s]]) for c in SUMMARY[1:]}} for s in STEPS]
    notes = ["Means over every image (and sample) per step:\n\n" + markdown_table(SUMMARY, summary) + "\n"]
    notes += _monotonicity_notes(summary)
    figs = ["ablation_quality.png", "ablation_distance.png", "ablation_images.png"]
    names = list(STEPS)
    save_line_plot(out / figs[0], names, {"PSNR (dB)": [r["psnr"] for r in summary],
                                          "RPSNR (dB)": [r["rpsnr"] for r in summary]},
                   xlabel="objective", ylabel="dB (higher is better)", title=f"Ablation, {model} K={k}")
    save_line_plot(out / figs[1], names, {c: [r[c] for r in summary] for c in
                                          ("gradient_distance", "candidate_distance_best", "fft2d")},
                   xlabel="objective", ylabel="lower is better", title="Gradient distance (Eq. 3) and FFT2D",
                   logy=True)
    save_image_grid(out / figs[2], grid_rows, grid_titles)
    return ExperimentResult(
        name="ablation", title="GradInversion ablation (Table 2): each loss term in turn",
        columns=COLUMNS, rows=rows, figures=figs, notes=notes,
        setup={"data": data, "model": f"{model} (width {width}, random init, seed 0; training-mode BN)",
               "batch size": k, "samples": f"{samples} batch(es), seeds {opt.seed}..{opt.seed + samples - 1}",
               "budget": f"{iterations} iterations x {seeds} seeds for every step (noise: 0 iterations)",
               "settings": step_settings(iterations, seeds).to_dict(),
               "steps": {s: STEP_TEXT[s] for s in STEPS},
               "gradient distance": "Eq. 3 without alpha_G: sum over parameter tensors of the L2 distance",
               "answer": "group steps: the seeds' consensus; otherwise the best seed by L_grad + R_fidelity",
               "lpips": "null unless the AlexNet/VGG LPIPS weights are in the torch cache",
               "smoke": opt.smoke})


def _monotonicity_notes(summary: list[dict[str, Any]]) -> list[str]:
    """Say plainly where a step did not improve a metric (the paper's Table 2 improves all)."""
    notes = []
    for prev, cur in zip(summary, summary[1:]):
        worse = []
        for c in SUMMARY[1:]:
            a, b = prev[c], cur[c]
            if a is None or b is None:
                continue
            if (b > a) if c in LOWER_IS_BETTER else (b < a):
                worse.append(f"{c} {a:.4g} -> {b:.4g}")
        if worse:
            notes.append(f"'{cur['step']}' did NOT improve on '{prev['step']}' in: " + ", ".join(worse) + ".")
    return notes
