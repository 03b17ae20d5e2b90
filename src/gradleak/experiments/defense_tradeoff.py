"""Reviewers 1 and 2 of DLG: "what is the trade-off between information leakage and accuracy loss?",
"does 8-bit precision help?", "what are the accuracies of the model when defending with these
strategies?" The authors answered with rebuttal Table 3 (accuracy and defendability for Gaussian
and Laplacian noise 1e-4..1e-1, FP16, 8-bit). Here, for each defense at several strengths:

- accuracy: the test accuracy of the DLG LeNet *trained* on Fashion-MNIST with every gradient
  step defended that way (:func:`gradleak.training.train`, the same small budget for all, plus
  the undefended baseline);
- leakage: iDLG against the defended FedSGD update of one real held-out Fashion-MNIST test image
  (per sample), and ``defended`` = the attack fails = mean PSNR below THRESHOLD_DB.

Module named ``defense_tradeoff`` (not ``defenses``) so it cannot be confused with the
:mod:`gradleak.defenses` package; the experiment's name is ``defenses``.
"""

from __future__ import annotations

import math
from typing import Any

from ..report import save_line_plot
from .base import ExperimentOptions, ExperimentResult, experiment
from .cells import Workspace
from .common import LBFGS_INIT, lbfgs_cell, mean, setting

# The attack fails below 20 dB (MSE > 0.01 on [0, 1] pixels): undefended iDLG reaches 75-90 dB on
# these images, and a reconstruction at 20 dB already shows the garment; failed runs sit at 3-10 dB.
THRESHOLD_DB = 20.0
# (defense, strength, spec). strength: sigma (gaussian), b (laplace), fraction zeroed (prune),
# bits (fp16, int8), noise multiplier Z with clip C = 1 (dpsgd).
SETTINGS: list[tuple[str, float | None, str | None]] = (
    [("none", None, None)]
    + [("gaussian", s, f"gaussian:{s:g}") for s in (1e-4, 1e-3, 1e-2, 1e-1)]
    + [("laplace", s, f"laplace:{s:g}") for s in (1e-4, 1e-3, 1e-2, 1e-1)]
    + [("prune", p, f"prune:{p:g}") for p in (0.3, 0.5, 0.7, 0.9)]
    + [("fp16", 16.0, "fp16"), ("int8", 8.0, "int8")]
    + [("dpsgd", z, f"dpsgd:clip=1,noise={z:g}") for z in (0.1, 0.5, 1.0)]
)
# Smoke: the weakest and strongest Gaussian noise plus the strongest of the others.
SMOKE_SETTINGS = [s for s in SETTINGS if s[2] in (None, "gaussian:0.0001", "gaussian:0.1", "laplace:0.1", "prune:0.9", "fp16",
                                                  "int8", "dpsgd:clip=1,noise=1")]
# SGD budget, the same for every defense: one epoch, batch 32, lr 0.01, momentum 0.9 (see
# training_stage.py for why this lr).
TRAIN = dict(epochs=1.0, batch_size=32, lr=0.01, momentum=0.9)
SMOKE_TRAIN_SUBSET = 3000
SMOKE_TEST_SUBSET = 1000
INIT = LBFGS_INIT  # the attacker's start: mid-grey pixels (see common.py)


@experiment("defenses", "accuracy when trained under a defense vs whether iDLG still leaks (rebuttal Table 3)")
def defenses(opt: ExperimentOptions, ws: Workspace) -> ExperimentResult:
    from ..training import TrainConfig

    st = setting(opt, model="lenet-dlg", data="fashion-mnist", attack="idlg", samples=(1, 4), iterations=(20, 200))
    model, data, attack, samples, n_iter = st.model, st.data, st.attack, st.samples, st.iterations
    settings = SMOKE_SETTINGS if opt.smoke else SETTINGS
    train_subset = SMOKE_TRAIN_SUBSET if opt.smoke else 10_000
    test_subset = SMOKE_TEST_SUBSET if opt.smoke else None
    trained = {}
    plan: dict[tuple[int, int], dict[str, Any]] = {}
    for i, (name, strength, spec) in enumerate(settings):
        cfg = TrainConfig(model=model, width=opt.width, data=data, defense=(spec,) if spec else (),
                          checkpoints=(1.0,), train_subset=train_subset, test_subset=test_subset, seed=opt.seed,
                          model_seed=0, **TRAIN)
        trained[i] = ws.trained(cfg, name_of(name, strength))
        for s in range(samples):
            plan[(i, s)] = lbfgs_cell(st, opt.seed + s, log_points=10, split="test", batch_size=1,
                                      defense=[spec] if spec else [])
    cells = ws.run(plan)
    rows: list[dict[str, Any]] = []
    for i, (name, strength, spec) in enumerate(settings):
        done = [cells[(i, s)].metrics for s in range(samples) if cells[(i, s)].ok]
        psnrs = [m["psnr_mean"] for m in done]
        psnr = mean(psnrs)
        epsilon = trained[i].epsilon
        rows.append({"defense": name, "strength": strength, "accuracy": trained[i].final_accuracy, "psnr": psnr,
                     "ssim": mean(m["ssim_mean"] for m in done),
                     "defended": None if psnr is None else psnr < THRESHOLD_DB, "mse": mean(m["mse_mean"] for m in done),
                     "label_accuracy": mean(m["label_accuracy"] for m in done),
                     "psnr_min": min(psnrs, default=None), "psnr_max": max(psnrs, default=None), "samples": len(done),
                     "psnr_per_sample": ";".join(f"{p:.2f}" for p in psnrs),
                     "epsilon": epsilon if epsilon is not None and math.isfinite(epsilon) else None,
                     "spec": spec or ""})
    fig = "accuracy_vs_psnr.png"
    labels_x = [_short(r["defense"], r["strength"]) for r in rows]
    save_line_plot(ws.out / fig, labels_x, {"attack PSNR (dB)": [r["psnr"] for r in rows],
                                         "test accuracy (%)": [100 * r["accuracy"] for r in rows],
                                         f"threshold {THRESHOLD_DB:g} dB": [THRESHOLD_DB] * len(rows)},
                   xlabel="defense", ylabel="dB / %", title=f"Defense trade-off, {model} on {data}")
    _rotate_note = ("figure x axis, in table order: G = gaussian sigma, L = laplace b, P = prune fraction, "
                    "DP = dpsgd noise multiplier (clip 1)")
    return ExperimentResult(
        name="defenses", title="Accuracy vs defendability (rebuttal Table 3)",
        columns=["defense", "strength", "accuracy", "psnr", "ssim", "defended", "mse", "label_accuracy", "psnr_min",
                 "psnr_max", "samples", "psnr_per_sample", "epsilon", "spec"],
        rows=rows, figures=[fig],
        setup={"data": f"{data}: trained on train-split images, attacked on test-split images (held out)",
               "model": model,
               "training": {**TRAIN, "train_images": train_subset, "test_images": test_subset or "all",
                            "same budget for every defense": True, "seed": opt.seed,
                            "defense applied to": "every training step's gradient (defended FedSGD client)"},
               "attack": f"{attack} (float64 L-BFGS, {n_iter} iterations, start {INIT}), batch 1, defended FedSGD "
                         "update of the untrained global model",
               "samples": samples, "seeds": f"{st.seed_text} (test image drawn, attack start, defense noise)",
               "success threshold": f"defended = mean PSNR < {THRESHOLD_DB} dB (attack fails)",
               "strength": "sigma (gaussian), b (laplace), fraction zeroed per layer (prune), bits (fp16, int8), "
                           "noise multiplier Z at clip 1 (dpsgd)",
               "settings": [spec or "none" for _, _, spec in settings],
               "epsilon": "DP-SGD training run's epsilon at delta 1e-5 (Opacus RDP accountant)",
               "smoke": opt.smoke},
        notes=[_rotate_note, "psnr, ssim, mse are means over the samples; every sample's PSNR is in psnr_per_sample.",
               "accuracy is one training run per setting (one seed, a short budget); the spread over training seeds "
               "was not measured, so read differences of a few points with care."]
        + (["Smoke setting: the weakest and strongest Gaussian noise and the strongest setting of every other "
            "defense; the training budget is too short for the accuracies to mean more than 'trains / does not'."]
           if opt.smoke else []))


def _short(name: str, strength: float | None) -> str:
    """Two-line x label in the rebuttal's style (G-1e-4, L-1e-1, FP-16, 8 bit)."""
    abbrev = {"gaussian": "G", "laplace": "L", "prune": "P", "dpsgd": "DP"}
    if strength is None or name not in abbrev:
        return name
    value = f"{strength:.0e}".replace("e-0", "e-") if 0 < strength < 0.01 else f"{strength:g}"
    return f"{abbrev[name]}\n{value}"


def name_of(name: str, strength: float | None) -> str:
    return name if strength is None else f"{name}-{strength:g}"
