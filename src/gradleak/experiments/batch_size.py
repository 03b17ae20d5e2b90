"""Reviewer 2 of DLG: "How do the reconstruction results vary with batch size?" and "wouldn't a
larger batch make a good defense?" The authors answered that batches only add "few artifact
pixels" given more time. Here: leakage vs batch size K for each attack, on real CIFAR-10 photos
(distinct labels per batch; cifar10-samples has 8 classes, hence K <= 8), every batch reported."""

from __future__ import annotations

from typing import Any

from ..report import save_line_plot
from .base import ExperimentOptions, ExperimentResult, experiment
from .cells import Workspace
from .common import (VERDICT_RULE, DLG_STOP, THRESHOLD_DB, BATCH_VERDICT_COLUMNS, PAIRING_COLUMNS, convergence_notes, iterations_run, leakage_rows,
                     save_grids, scored_title, series, summarize, summary_columns, trend_notes)

# The summary's values: the paper's pairing first, then pixels', then the leak-free baselines.
SUMMARY_VALUES = ("psnr_by_label", "psnr", "zero_psnr", "prior_psnr")

BATCH_SIZES = (1, 2, 4, 8)
SMOKE_BATCH_SIZES = (1, 2)
# The attacks compared, in this order (--attacks picks others; an unknown one is a failed cell).
CANDIDATES = ("dlg", "idlg", "gradinversion", "ig")
# Model (and width) per attack unless --model/--width: DLG/iDLG on the DLG paper's sigmoid LeNet
# (their setting); GradInversion and Inverting Gradients on the BN/ReLU convnet at width 16, the
# network their CPU settings were tuned on.
MODELS: dict[str, tuple[str, int | None]] = {"dlg": ("lenet-dlg", None), "idlg": ("lenet-dlg", None),
                                             "gradinversion": ("convnet", 16), "ig": ("convnet", 16)}
# Attack-specific options. DLG/iDLG: float64 L-BFGS from mid-grey pixels (DLG's N(0, 1) start
# saturates the sigmoid LeNet on many photos). GradInversion: its "cpu" preset matches the client's
# BN batch statistics (bn "exact"), so the client shares them in this threat model.
OPTIONS: dict[str, dict[str, Any]] = {"dlg": dict(dtype="float64", init="zeros", stop=DLG_STOP),
                                      "idlg": dict(dtype="float64", init="zeros", stop=DLG_STOP),
                                      "gradinversion": dict(share_bn_statistics=True)}
# Iterations (smoke, full); None = the attack's own default (GradInversion's cpu preset: 600 Adam
# steps; Inverting Gradients: 1000 signed-Adam steps, attacks/ig.py. reproduction/batch-size was
# first computed at the authors' 4800, IG's earlier default; its reading gives both).
# DLG gets more smoke iterations than iDLG: its first start can stall on a plateau and is then
# restarted (dlg.py), which the smoke budget must leave room for.
ITERATIONS: dict[str, tuple[int, int | None]] = {"dlg": (60, 300), "idlg": (30, 300), "gradinversion": (150, None),
                                                 "ig": (300, None)}
# Smoke only: GradInversion with G = 2 candidates per image instead of the cpu preset's 4.
SMOKE_OPTIONS: dict[str, dict[str, Any]] = {"gradinversion": dict(seeds=2)}


SPEC = {
    "name": "batch-size",
    "summary": "leakage vs batch size for each attack on real photos",
}


@experiment("batch-size")
def batch_size(opt: ExperimentOptions, ws: Workspace) -> ExperimentResult:
    data = opt.data or "cifar10-samples"
    attacks = opt.attacks or list(CANDIDATES)
    sizes = opt.batch_sizes or list(SMOKE_BATCH_SIZES if opt.smoke else BATCH_SIZES)
    samples = opt.samples or (1 if opt.smoke else 3)
    plan, iterations, models, options = _plan(opt, data, attacks, sizes, samples)
    # The first sample's run folders: at each K every attack gets the same batch (drawn by the seed).
    cells = ws.run(plan, run_folders=[(a, k, 0) for a in attacks for k in sizes])
    rows = leakage_rows(cells, ("attack", "batch_size", "sample"))
    by = ["attack", "batch_size"]
    summary = summarize(rows, by, values=SUMMARY_VALUES)
    fig = "psnr_vs_batch_size.png"
    save_line_plot(ws.out / fig, [str(k) for k in sizes],
                   {a: series(rows, "batch_size", sizes, attack=a) for a in attacks}, xlabel="batch size K", ylabel=f"PSNR (dB), mean of {samples} batch(es)",
                   title=f"Leakage vs batch size on {data}")
    verdicts = {(r["attack"], r["batch_size"], r["sample"]): r["verdict"] for r in rows}
    figs = [fig]
    if save_grids(ws.out / "reconstructions.png",
                  [(f"K = {k}", [(scored_title(a, cells[(a, k, 0)], verdicts.get((a, k, 0))), cells[(a, k, 0)])
                                 for a in attacks]) for k in sizes]):
        figs.append("reconstructions.png")
    return ExperimentResult(
        name="batch-size", title="Leakage vs batch size",
        columns=["attack", "batch_size", "sample", "psnr_by_label", "psnr", *PAIRING_COLUMNS[1:], "ssim", "mse", "label_accuracy", "model", "width", "seed", "psnr_min",
                 "recovered", *BATCH_VERDICT_COLUMNS, "iterations", "wall_seconds"],
        rows=rows, figures=figs, summary=summary, summary_columns=summary_columns(by, SUMMARY_VALUES),
        setup={"data": f"{data} (each batch: K photos with distinct labels)",
               "model": models,
               "attacks": attacks, "batch sizes": sizes,
               "iterations": {a: iterations_run(rows, a, v) for a, v in iterations.items()},
               "attack options": options,
               "threat": "fedsgd (one gradient of the batch's mean loss); with gradinversion the client also shares "
                         "its BN batch statistics",
               "samples": samples, "seeds": f"{opt.seed}..{opt.seed + samples - 1} (batch drawn and attack start)",
               "success threshold": f"PSNR >= {THRESHOLD_DB} dB (mean over the batch)",
               "verdict": f"leaked = recovered (or PSNR >= 20 dB, or a recognisable image); {VERDICT_RULE}",
               "smoke": opt.smoke},
        notes=["psnr/ssim/mse are means over the K images of a batch after optimal pairing; psnr_min is its worst "
               "image.", "Every batch attacked is a row; reconstructions.png shows the first batch of each K (the "
               "same for every attack) and each attack's reconstruction of it, paired with the originals."]
        + convergence_notes(cells.values())
        + trend_notes(summary, "batch_size", falls=True, within=("attack",),
                      claim="leakage falls as the batch size grows"))


def _plan(opt: ExperimentOptions, data: str, attacks: list[str], sizes: list[int], samples: int
          ) -> tuple[dict[tuple[str, int, int], dict[str, Any]], dict[str, int | None], dict[str, str],
                     dict[str, dict[str, Any]]]:
    """(the cells (attack, K, sample) -> run options; per attack its iterations, its model as the
    setup states it, its attack options)."""
    iterations: dict[str, int | None] = {}
    models: dict[str, str] = {}
    options: dict[str, dict[str, Any]] = {}
    plan: dict[tuple[str, int, int], dict[str, Any]] = {}
    for attack in attacks:
        model, width = MODELS.get(attack, ("lenet-dlg", None))
        if opt.model:
            model, width = opt.model, None
        width = opt.width or width
        smoke_iter, full_iter = ITERATIONS.get(attack, (100, None))
        n_iter = opt.iterations or (smoke_iter if opt.smoke else full_iter)
        iterations[attack] = n_iter
        models[attack] = model + (f" width {width}" if width else "")
        options[attack] = {**OPTIONS.get(attack, {}), **(SMOKE_OPTIONS.get(attack, {}) if opt.smoke else {})}
        for k in sizes:
            for s in range(samples):
                plan[(attack, k, s)] = dict(attack=attack, model=model, width=width, data=data, batch_size=k,
                                            seed=opt.seed + s, iterations=n_iter,
                                            log_every=max(1, (n_iter or 200) // 10), **options[attack])
    return plan, iterations, models, options
