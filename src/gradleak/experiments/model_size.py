"""Reviewer 2 of DLG: "How does size/complexity of W affect effectiveness of the attack?" Here:
leakage vs the width of the victim network (the ``convnet``: conv(w)-conv(2w)-pool-conv(4w)-pool-
conv(4w)-linear with BatchNorm and ReLU, so the parameter count grows ~w^2), on real CIFAR-10
photos, one photo per sample, every sample reported."""

from __future__ import annotations

from typing import Any

from ..models import build_model
from ..report import save_line_plot
from .base import ExperimentOptions, ExperimentResult, experiment
from .cells import Workspace
from .common import (VERDICT_RULE, DLG_STOP, THRESHOLD_DB, BATCH_VERDICT_COLUMNS, PAIRING_COLUMNS, convergence_notes, iterations_run, leakage_rows,
                     save_grids, scored_title, series, summarize, summary_columns, trend_notes)

# The summary's values: the paper's pairing first, then pixels', then the leak-free baselines.
SUMMARY_VALUES = ("psnr_by_label", "psnr", "zero_psnr", "prior_psnr")

WIDTHS = (4, 8, 16, 32, 64)
SMOKE_WIDTHS = (4, 16)
# Iterations (smoke, full); None = the attack's default (Inverting Gradients: 1000 signed-Adam
# steps, its step decay at 3/8, 5/8 and 7/8 of them; attacks/ig.py). reproduction/model-size was
# first computed at the authors' 4800, IG's earlier default; its reading gives both.
ITERATIONS: dict[str, tuple[int, int | None]] = {"ig": (300, None)}
OPTIONS: dict[str, dict[str, Any]] = {"dlg": dict(dtype="float64", stop=DLG_STOP), "idlg": dict(dtype="float64", stop=DLG_STOP)}


SPEC = {
    "name": "model-size",
    "summary": "leakage vs model width (convnet) with Inverting Gradients on real photos",
}


@experiment("model-size")
def model_size(opt: ExperimentOptions, ws: Workspace) -> ExperimentResult:
    data = opt.data or "cifar10-samples"
    model = opt.model or "convnet"
    attacks = opt.attacks or ["ig"]
    widths = [opt.width] if opt.width else list(SMOKE_WIDTHS if opt.smoke else WIDTHS)
    samples = opt.samples or (1 if opt.smoke else 3)
    iterations: dict[str, int | None] = {}
    params = {w: _parameters(model, w, data) for w in widths}
    plan: dict[tuple[str, int, int], dict[str, Any]] = {}
    for attack in attacks:
        smoke_iter, full_iter = ITERATIONS.get(attack, (100, None))
        n_iter = opt.iterations or (smoke_iter if opt.smoke else full_iter)
        iterations[attack] = n_iter
        for w in widths:
            for s in range(samples):
                plan[(attack, w, s)] = dict(attack=attack, model=model, width=w, data=data, batch_size=1,
                                            seed=opt.seed + s, iterations=n_iter,
                                            log_every=max(1, (n_iter or 1000) // 10), **OPTIONS.get(attack, {}))
    # The first sample's run folders: its photo is the same at every width (drawn by the seed).
    cells = ws.run(plan, run_folders=[(a, w, 0) for a in attacks for w in widths])
    rows = leakage_rows(cells, ("attack", "width", "sample"))
    for r in rows:
        r["parameters"] = params[r["width"]]
    by = ["attack", "width"]
    summary = summarize(rows, by, values=SUMMARY_VALUES)
    fig = "psnr_vs_width.png"
    save_line_plot(ws.out / fig, [f"{w}\n({params[w]:,})" for w in widths],
                   {a: series(rows, "width", widths, attack=a) for a in attacks},
                   xlabel="width w (trainable parameters)", ylabel=f"PSNR (dB), mean of {samples}",
                   title=f"Leakage vs model size, {model} on {data}")
    verdicts = {(r["attack"], r["width"], r["sample"]): r["verdict"] for r in rows}
    figs = [fig]
    if save_grids(ws.out / "reconstructions.png",
                  [(a, [(scored_title(f"width {w}", cells[(a, w, 0)], verdicts.get((a, w, 0))), cells[(a, w, 0)])
                        for w in widths]) for a in attacks]):
        figs.append("reconstructions.png")
    return ExperimentResult(
        name="model-size", title="Leakage vs model size",
        columns=["attack", "model", "width", "parameters", "sample", "seed", "psnr_by_label", "psnr",
                 *PAIRING_COLUMNS[1:], "ssim", "mse", "label_accuracy",
                 "recovered", *BATCH_VERDICT_COLUMNS, "iterations", "wall_seconds"],
        rows=rows, figures=figs, summary=summary, summary_columns=summary_columns(by, SUMMARY_VALUES),
        setup={"data": data, "model": f"{model}, widths {widths}, random weights (model seed 0), train-mode BN",
               "parameters": {str(w): p for w, p in params.items()},
               "attack": {a: f"{a}, {iterations_run(rows, a, iterations[a])} iterations"
                          + (f", {OPTIONS[a]}" if a in OPTIONS else "") for a in attacks},
               "threat": "fedsgd, batch 1 (one gradient of one photo)",
               "samples": samples, "seeds": f"{opt.seed}..{opt.seed + samples - 1} (photo drawn and attack start)",
               "success threshold": f"recovered = PSNR >= {THRESHOLD_DB} dB",
               "verdict": f"leaked = recovered (or PSNR >= 20 dB, or a recognisable image); {VERDICT_RULE}",
               "smoke": opt.smoke},
        notes=["parameters: trainable parameters of the model as built for this data.",
               "Every sample attacked is a row; the line figure shows means; reconstructions.png shows the "
               "first sample's photo (the same at every width) and each width's reconstruction."]
        + convergence_notes(cells.values())
        + trend_notes(summary, "width", falls=False, within=("attack",),
                      claim="leakage grows with the width: more gradient equations per unknown pixel "
                            "(Geiping et al. 2020)"))


def _parameters(name: str, width: int | None, data: str) -> int:
    from ..data import open_source

    src = open_source(data)
    spec = build_model(name, num_classes=src.num_classes, channels=src.native_channels, width=width)
    return sum(p.numel() for p in spec.module.parameters() if p.requires_grad)
