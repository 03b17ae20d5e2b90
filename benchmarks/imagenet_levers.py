"""Issue 39: levers for GradInversion at 224 px (EfficientNet-Lite0 pretrained, the 8 ImageNet
sample photos, batch 8, the client's BN statistics shared), measured on this CPU with ONE torch
thread, before any becomes a default.

Sections (``--only NAME,...`` re-runs some and keeps the others' recorded rows):

* ``baselines``: the trivial answers and oracles: the zero image (flat normalisation-mean colour,
  13.66 dB), a flat image of the batch's mean colour (what the first BN layer's shared mean
  gives), of each photo's own mean colour, and each photo down-sampled to 4..56 px and
  up-sampled again (what a perfect low-resolution answer would score).
* ``readout``: the per-image penultimate features read off the shared update. With distinct
  labels, the classifier's weight-gradient row of class y_i is (1/K) sum_j (p_j[y_i] - [j = i])
  f_j ~ (p_i[y_i] - 1) f_i / K and its bias-gradient entry the same without f, so
  f_i ~ dW[y_i] / db[y_i]; compared with the true features of the client's forward.
* ``precision``: one GradInversion objective + image gradient (Eq. 3 + Eq. 9-10 with the paper
  preset's per-layer alphas; one seed, batch 8, 224 px, N(0, I) images): float64 (reference),
  float32 (what gradleak runs), channels_last input, channels_last input and weights, oneDNN off,
  bfloat16 autocast (this CPU has AVX-512 BF16, no AMX), bfloat16 + channels_last. Seconds per step
  (median of 3 after one warm-up) and the image gradient's relative error and cosine against
  float32 (and float32's against float64).
* ``schedules``: short attacks, one seed, no group term, the answer boxed to [0, 1] after every
  step, each at about the same CPU cost (~5 min on one thread, see COST): the paper preset as in
  reproduction/gradinversion-imagenet/box-1600 (randn start) and variants: zero-image start,
  a low-resolution parametrisation (x = bilinear upsampling of a 14..112 px image, coarse to
  fine), a BN-prior warm start, a per-image feature warm start (match the features read off the
  update, plus the BN prior: one backward, no double backward), DeepInversion's tricks (jitter,
  flips, Adam betas (0.5, 0.9), lr 0.25, first BN layer x10) and combinations. Reported: mean and
  per-image PSNR after the pixel (Hungarian) pairing, the PSNR with each slot paired with the
  photo of its restored label (what the attacker knows), the PSNR trajectory, the answer's relative
  gradient distance ||u(x') - u||^2 / ||u||^2 (verdict.py), its feature distance and R_BN.

Everything here is the benchmark's own loop (Adam, GradInversion's cosine schedule with warm-up,
Langevin noise, box) around gradleak's objective pieces (UpdateSimulator, layer_l2, bn_prior,
total_variation, l2_norm): it reproduces the attack's objective, not its code path, so that the
levers can be tried without touching src/. Fixed seeds throughout; the runs are deterministic on
one CPU thread up to the wall-clock numbers.

    .venv/bin/python benchmarks/imagenet_levers.py                   # everything, ~50 min, one thread
    .venv/bin/python benchmarks/imagenet_levers.py --only precision  # ~3 min
    .venv/bin/python benchmarks/imagenet_levers.py --only schedules --variants feature_lowres

Writes benchmarks/imagenet_levers.json (``--out`` elsewhere).

Measured 2026-11-27 (imagenet_levers.json; other work loaded the second core, load ~3): float32 3.4 s
per step; channels_last, bfloat16 autocast and oneDNN off are not faster (3.6-6.0 s), and
bfloat16's image gradient is 51 % off (cosine 0.87 against float64; float32's is 0.46 % off). The
features read off the update are within 0.7 % of the true ones. No schedule variant ends above
the zero image (13.66 dB): 7.9 dB (the paper preset) to 12.6 dB (low resolution from the zero
image); every answer's correlation with its photo is <= 0.06 and no answer explains the update
(relative distance 1.3-3.1; the truth 3e-6).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
OUT_JSON = HERE / "imagenet_levers.json"
SECTIONS = ("baselines", "readout", "precision", "schedules")
SIZE, K = 224, 8


def log(msg: str) -> None:
    print(f"[levers {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------- the case
class Case:
    """The issue's case as `gradleak attack --model efficientnet-lite0 --data imagenet-samples
    --batch-size 8 --share-bn-statistics` builds it, and the attacker's pieces of GradInversion."""

    def __init__(self, device: torch.device | str = "cpu", indices: tuple[int, ...] | None = None) -> None:
        from types import SimpleNamespace

        from gradleak.attacks.gradinversion import layer_counts, per_layer, preset_values
        from gradleak.attacks.labels import restore_labels
        from gradleak.attacks.priors import bn_targets
        from gradleak.attacks.simulate import UpdateSimulator
        from gradleak.config import make_config
        from gradleak.pipeline.image import simulate_client

        cfg = make_config(attack="gradinversion", model="efficientnet-lite0", data="imagenet-samples", batch_size=K,
                          share_bn_statistics=True, threads=1, progress=False, preset="paper",
                          **({"indices": tuple(indices)} if indices else {}))
        case = simulate_client(cfg)  # the client, on the CPU (the truth stays there for scoring)
        self.device = torch.device(device)
        self.model, self.update, self.truth = case.model, case.update, case.truth
        self.labels = restore_labels(self.update, self.model, K, "gradinversion").to(self.device)
        self.victim = UpdateSimulator(self.model, self.update, device=self.device)
        self.targets = bn_targets(self.update, self.victim.bn_names, "exact", device=self.device)
        # the paper preset per layer of this model (its constants as attributes: p.alpha_g, ...)
        self.paper = SimpleNamespace(**per_layer("paper", preset_values("paper"), layer_counts(self.model.module)))
        self.lo = self.model.normalize(torch.zeros(1, 3, SIZE, SIZE)).to(self.device)
        self.hi = self.model.normalize(torch.ones(1, 3, SIZE, SIZE)).to(self.device)
        self._feats: list[torch.Tensor] = []
        self.victim.gradient.module._fc.register_forward_hook(lambda m, i, o: self._feats.append(i[0]))
        self.feature_targets = readout(self.update, self.labels.cpu()).to(self.device)  # [K, 1280], slot k: labels[k]

    def forward(self, x: torch.Tensor, *, double: bool, params: dict | None = None
                ) -> tuple[list[torch.Tensor] | None, list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """x [K, C, H, W] normalised -> (the simulated update (differentiable w.r.t. x) when
        ``double``, per-BN-layer batch (mean [C], var [C]), penultimate features [K, 1280])."""
        g = self.victim.gradient
        self._feats.clear()
        if double:
            params = params if params is not None else g.params
            loss, stats = g._loss_and_stats(params, x, self.labels)
            grads = list(torch.autograd.grad(loss, list(params.values()), create_graph=True))
        else:
            params = params if params is not None else {n: p.detach() for n, p in g.params.items()}
            _, stats = g._loss_and_stats(params, x, self.labels)
            grads = None
        return grads, stats, self._feats[-1]

    def relative_distance(self, x: torch.Tensor) -> float:
        from gradleak.attacks.verdict import relative_distance
        with torch.enable_grad():
            return relative_distance(self.victim(x.detach(), self.labels, create_graph=False), self.victim.target)


def readout(update: Any, labels: torch.Tensor) -> torch.Tensor:
    """Per-slot penultimate features f ~ dW_fc[y] / db_fc[y] (see the module docstring)."""
    w, b = update.gradients["_fc.weight"], update.gradients["_fc.bias"]
    return torch.stack([w[int(c)] / b[int(c)] for c in labels])


def scores(case: Case, pixels: torch.Tensor) -> dict[str, Any]:
    """PSNR after gradleak's pairing (Hungarian, pixel MSE) and with slot k paired to the photo of
    its restored label."""
    from gradleak.metrics import match, psnr
    truth, pixels = case.truth.images, pixels.detach().float().cpu()
    perm = match(pixels, truth)
    hung = psnr(pixels[perm], truth)
    by_label = torch.empty(K, dtype=torch.float64)
    for k, c in enumerate(case.labels.tolist()):
        i = int((case.truth.labels == c).nonzero()[0])
        by_label[i] = psnr(pixels[k:k + 1], truth[i:i + 1])[0]
    zero = psnr(torch.full_like(truth, case.model.mean[0]), truth)
    # signal: the correlation of the answer's deviation from the zero image with the photo's (paired
    # by pixels), and the PSNR of the best blend m + lambda (answer - m), lambda >= 0 per image, read
    # from the truth (an oracle: > the zero image's PSNR iff the answer correlates with the photo)
    m = case.model.mean[0]
    r, t = (pixels[perm] - m).flatten(1).double(), (truth - m).flatten(1).double()
    corr = F.cosine_similarity(r, t, dim=1)
    lam = ((r * t).sum(1) / r.pow(2).sum(1).clamp_min(1e-12)).clamp_min(0)
    blend = psnr((m + lam[:, None] * r).view_as(truth).float(), truth)
    half = psnr((m + 0.5 * r).view_as(truth).float(), truth)
    return {"correlation_with_photo": round(float(corr.mean()), 4),
            "correlation_per_image": [round(float(v), 3) for v in corr],
            "psnr_half_shrunk_to_zero_image": round(float(half.mean()), 3),
            "psnr_best_blend_oracle": round(float(blend.mean()), 3),
            "psnr": round(float(hung.mean()), 3), "psnr_per_image": [round(float(v), 2) for v in hung],
            "above_zero_image": int((hung > zero).sum()),
            "psnr_by_label": round(float(by_label.mean()), 3),
            "psnr_by_label_per_image": [round(float(v), 2) for v in by_label]}


# ----------------------------------------------------------------------------------- baselines
def measure_baselines(case: Case) -> dict[str, Any]:
    from gradleak.metrics import psnr
    x = case.truth.images
    out: dict[str, Any] = {"photos": list(case.truth.names), "labels": case.truth.labels.tolist()}
    zero = psnr(torch.full_like(x, case.model.mean[0]), x)
    out["zero_image_psnr"] = round(float(zero.mean()), 3)
    out["zero_image_psnr_per_image"] = [round(float(v), 2) for v in zero]
    out["batch_mean_colour_psnr"] = round(float(psnr(x.mean((0, 2, 3), keepdim=True).expand_as(x), x).mean()), 3)
    out["own_mean_colour_psnr"] = round(float(psnr(x.mean((2, 3), keepdim=True).expand_as(x), x).mean()), 3)
    out["oracle_low_resolution_psnr"] = {}
    for s in (4, 7, 14, 28, 56):
        low = F.interpolate(F.interpolate(x, size=s, mode="area"), size=SIZE, mode="bilinear", align_corners=False)
        out["oracle_low_resolution_psnr"][f"{s}px"] = round(float(psnr(low.clamp(0, 1), x).mean()), 3)
    log(f"baselines: {out}")
    return out


def measure_readout(case: Case) -> dict[str, Any]:
    with torch.no_grad():
        _, _, f = case.forward(case.model.normalize(case.truth.images).to(case.device), double=False)
    f = f.cpu()
    rows = []
    for i, c in enumerate(case.truth.labels.tolist()):
        k = case.labels.tolist().index(c)
        est = case.feature_targets[k].cpu()
        b = float(case.update.gradients["_fc.bias"][c])
        rows.append({"photo": case.truth.names[i], "label": c, "p_true_class": round(1 + K * b, 4),
                     "relative_error": float((est - f[i]).norm() / f[i].norm()),
                     "cosine": float(F.cosine_similarity(est, f[i], dim=0))})
    out = {"labels_restored": case.labels.tolist(), "labels_correct": sorted(case.labels.tolist()) ==
           sorted(case.truth.labels.tolist()), "rows": rows,
           "max_relative_error": max(r["relative_error"] for r in rows)}
    log(f"readout: max relative error {out['max_relative_error']:.2e}")
    return out


# ----------------------------------------------------------------------------------- precision
def measure_precision(case: Case, reps: int = 3) -> dict[str, Any]:
    from gradleak.attacks.priors import bn_prior, l2_norm, total_variation
    p = case.paper
    x0 = torch.randn((K, 3, SIZE, SIZE), generator=torch.Generator().manual_seed(0))
    g = case.victim.gradient

    def step(dtype: torch.dtype = torch.float32, cl_input: bool = False, cl_weights: bool = False,
             bf16: bool = False) -> torch.Tensor:
        x = x0.to(dtype)
        if cl_input:
            x = x.contiguous(memory_format=torch.channels_last)
        x.requires_grad_(True)
        params = {n: (t.detach().to(dtype).contiguous(memory_format=torch.channels_last) if cl_weights and t.ndim == 4
                      else t.detach().to(dtype)).requires_grad_(True) for n, t in g.params.items()}
        target = [t.to(dtype) for t in g.target]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, stats = g._loss_and_stats(params, x, case.labels)
            grads = torch.autograd.grad(loss, list(params.values()), create_graph=True)
            dist = sum((a - b).norm() for a, b in zip(grads, target))
            obj = p.alpha_g * dist + p.alpha_tv * total_variation(x[None])[0] + p.alpha_l2 * l2_norm(x[None])[0] \
                + p.alpha_bn * bn_prior([(m[None], v[None]) for m, v in stats],
                                        [(a.to(dtype), b.to(dtype)) for a, b in case.targets])[0]
        return torch.autograd.grad(obj, [x])[0].double().contiguous()

    variants: dict[str, Callable[[], torch.Tensor]] = {
        "float64 (reference)": lambda: step(torch.float64),
        "float32 (what gradleak runs)": lambda: step(),
        "float32, channels_last input": lambda: step(cl_input=True),
        "float32, channels_last input and weights": lambda: step(cl_input=True, cl_weights=True),
        "float32, oneDNN off": lambda: _no_mkldnn(step),
        "bfloat16 autocast": lambda: step(bf16=True),
        "bfloat16 autocast, channels_last input and weights": lambda: step(cl_input=True, cl_weights=True, bf16=True),
    }
    rows, grads = [], {}
    for name, fn in variants.items():
        times = []
        fn()  # warm-up (oneDNN primitive caches, allocator)
        for _ in range(1 if name.startswith("float64") else reps):
            t = time.perf_counter()
            gx = fn()
            times.append(time.perf_counter() - t)
        grads[name] = gx
        rows.append({"variant": name, "seconds_per_step": round(statistics.median(times), 3),
                     "seconds": [round(v, 3) for v in times]})
        log(f"precision {name}: {rows[-1]['seconds_per_step']} s")
    ref32, ref64 = grads["float32 (what gradleak runs)"], grads["float64 (reference)"]
    base = next(r["seconds_per_step"] for r in rows if r["variant"].startswith("float32 (what"))
    for r in rows:
        gx = grads[r["variant"]]
        r["speedup_vs_float32"] = round(base / r["seconds_per_step"], 3)
        r["relative_error_vs_float32"] = float((gx - ref32).norm() / ref32.norm())
        r["relative_error_vs_float64"] = float((gx - ref64).norm() / ref64.norm())
        r["cosine_vs_float64"] = float(F.cosine_similarity(gx.flatten(), ref64.flatten(), dim=0))
    return {"what": "one objective (paper preset, per-layer alphas: Eq. 3 + TV + l2 + BN) and its image gradient, "
                    "EfficientNet-Lite0, batch 8, 224 px, one seed, N(0, I) images, 1 thread; median of "
                    f"{reps} after a warm-up (float64: 1)", "rows": rows}


def _no_mkldnn(fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    with torch.backends.mkldnn.flags(enabled=False):
        return fn()


# ----------------------------------------------------------------------------------- schedules
@dataclass(frozen=True)
class Phase:
    """``steps`` Adam steps on the image parametrised at ``res`` px (bilinear up to 224), with the
    objective alpha_g * Eq. 3 + alpha_bn * R_BN (first layer x first_bn) + alpha_tv * TV +
    alpha_l2 * l2 + alpha_feat * sum_k ||f_k(x) - f_k^||/||f_k^||; lr with GradInversion's
    linear warm-up (``warmup`` steps) and cosine decay to lr * floor; Langevin noise lr(t) * alpha_n;
    ``jitter`` (max shift at 224 px, DeepInversion's 30) and ``flip`` on the model's input
    (phases without Eq. 3 only: jitter moves the conv gradients)."""

    steps: int
    res: int = SIZE
    lr: float = 0.1
    betas: tuple[float, float] = (0.9, 0.999)
    warmup: int = 0
    floor: float = 0.0
    alpha_g: float | None = None     # None: the paper preset's (per layer)
    alpha_bn: float | None = None
    alpha_tv: float | None = None
    alpha_l2: float | None = None
    alpha_feat: float = 0.0
    first_bn: float = 1.0
    alpha_n: float = 0.0
    jitter: int = 0
    flip: bool = False


@dataclass(frozen=True)
class Variant:
    name: str
    what: str
    phases: tuple[Phase, ...]
    init: str = "randn"              # randn (N(0, I), the paper) | zeros (the zero image)


def _paper(case: Case, steps: int, **kw: Any) -> Phase:
    p = case.paper
    return Phase(steps=steps, lr=p.lr, warmup=min(p.warmup, steps // 10), alpha_g=p.alpha_g, alpha_bn=p.alpha_bn,
                 alpha_tv=p.alpha_tv, alpha_l2=p.alpha_l2, alpha_n=p.alpha_n, **kw)


# COST: one Eq. 3 step (double backward) ~3.4-4.1 s on one thread, one step without Eq. 3
# (forward + backward) ~1.0 s (measured in ``precision`` and in probes on a quiet machine): every
# variant gets ~70 Eq. 3 steps' worth (4 cheap steps per Eq. 3 step saved), ~290-300 s when quiet.
# The loop feeds the model a channels_last input (measured in ``precision``: no faster, 0.4 %
# gradient difference, the size of float32's own error against float64).
FULL = 70
FEAT = 100.0


def variants(case: Case) -> list[Variant]:
    p = case.paper
    di = dict(lr=0.25, betas=(0.5, 0.9), first_bn=10.0, jitter=30, flip=True)       # DeepInversion's code
    # alpha_feat = 100: the feature term (8 relative distances, ~1 each at the zero image) then weighs
    # ~800 against alpha_BN R_BN ~550 there; at 1 the BN prior swamped it (probe: features stayed at 1.07)
    feat = dict(alpha_g=0.0, alpha_bn=p.alpha_bn, alpha_tv=p.alpha_tv, alpha_l2=p.alpha_l2, alpha_feat=FEAT)
    bn_only = dict(alpha_g=0.0, alpha_bn=p.alpha_bn, alpha_tv=p.alpha_tv, alpha_l2=p.alpha_l2)
    coarse = lambda steps, **kw: tuple(Phase(steps=steps // 4, res=r, lr=0.05, warmup=0, **kw)  # noqa: E731
                                       for r in (14, 28, 56, 112))
    out = [
        Variant("paper", "a: the paper preset as in box-1600 (randn, box, Langevin noise, lr 0.1, cosine), "
                f"{FULL} steps", (_paper(case, FULL),)),
        Variant("zero_start", "c: as paper, from the zero image", (_paper(case, FULL),), init="zeros"),
        Variant("lowres", "b: zero start; Eq. 3 + priors (paper alphas) on a 14 -> 28 -> 56 -> 112 px image "
                "(bilinear up to 224), lr 0.05, no noise", coarse(FULL, **{k: getattr(p, k) for k in
                                                                          ("alpha_g", "alpha_bn", "alpha_tv", "alpha_l2")}),
                init="zeros"),
        Variant("bn_warm", "d: zero start; 120 BN-prior steps (R_BN + TV + l2), then 40 paper steps",
                (Phase(steps=120, lr=0.05, warmup=10, **bn_only), _paper(case, 40, floor=0.0)), init="zeros"),
        Variant("feature_warm", "e: zero start; 120 steps matching the features read off the update + R_BN + "
                "TV + l2 (224 px), then 40 paper steps",
                (Phase(steps=120, lr=0.05, warmup=10, **feat), _paper(case, 40)), init="zeros"),
        Variant("feature_lowres", "b+e: zero start; feature + BN matching on a 14 -> 28 -> 56 -> 112 px image, "
                "280 cheap steps, no Eq. 3", coarse(280, **feat), init="zeros"),
        Variant("feature_lowres_di", "b+e+f: as feature_lowres with DeepInversion's tricks (lr 0.25, betas "
                "(0.5, 0.9), first BN x10, jitter 30, flips)",
                tuple(replace(ph, **di) for ph in coarse(280, **feat)), init="zeros"),
        Variant("feature_lowres_then_grad", "b+e, then Eq. 3: 160 cheap feature steps (14 -> 112 px), then "
                "30 steps of Eq. 3 + features + priors at 112 px, lr 0.02",
                coarse(160, **feat) + (Phase(steps=30, res=112, lr=0.02, warmup=0, alpha_g=p.alpha_g,
                                             alpha_bn=p.alpha_bn, alpha_tv=p.alpha_tv, alpha_l2=p.alpha_l2,
                                             alpha_feat=FEAT),), init="zeros"),
        Variant("feature_lowres_then_grad_224", "b+e, then Eq. 3 at full size: 160 cheap feature steps (14 -> 112 "
                "px), then 30 steps of Eq. 3 + features + priors on the 224 px image, lr 0.02",
                coarse(160, **feat) + (Phase(steps=30, res=SIZE, lr=0.02, warmup=0, alpha_g=p.alpha_g,
                                             alpha_bn=p.alpha_bn, alpha_tv=p.alpha_tv, alpha_l2=p.alpha_l2,
                                             alpha_feat=FEAT),), init="zeros"),
        Variant("grad_weighted_lowres", "Eq. 3 weighted up: zero start; alpha_G = 1 (x925: alpha_G L_grad ~270 "
                "against alpha_BN R_BN ~550 at the start, instead of ~0.3) on a 28 -> 56 px image, lr 0.05, no noise",
                tuple(Phase(steps=FULL // 2, res=r, lr=0.05, alpha_g=1.0, alpha_bn=p.alpha_bn, alpha_tv=p.alpha_tv,
                            alpha_l2=p.alpha_l2) for r in (28, 56)), init="zeros"),
    ]
    return out


def weighted_bn(stats: list[tuple[torch.Tensor, torch.Tensor]], targets: list[tuple[torch.Tensor, torch.Tensor]],
                first: float) -> torch.Tensor:
    """GradInversion Eq. 10 (priors.bn_prior) with the first BN layer's term x ``first``."""
    total = torch.zeros((), device=stats[0][0].device)
    for i, ((mu, var), (t_mu, t_var)) in enumerate(zip(stats, targets, strict=True)):
        total = total + (first if i == 0 else 1.0) * ((mu - t_mu).norm() + (var - t_var).norm())
    return total


def run_variant(case: Case, v: Variant, log_every: int = 10, start: torch.Tensor | None = None) -> dict[str, Any]:
    """``v`` from ``v.init``, or from ``start`` (normalised images [K, 3, 224, 224]) when given."""
    from gradleak.attacks.base import initial_images, to_pixels
    from gradleak.attacks.objectives import layer_l2_batched
    from gradleak.attacks.priors import l2_norm, total_variation
    from gradleak.runtime import tune_allocator

    tune_allocator()
    gen = torch.Generator().manual_seed(0)        # the attack's seed 0: initial pixels, then noise
    aug = torch.Generator().manual_seed(1)        # jitter and flips
    x = initial_images(case.model, (K, 3, SIZE, SIZE), v.init, gen, torch.float32).to(case.device)
    if start is not None:
        x = start.detach().clone().to(case.device)
    lo, hi = case.lo, case.hi
    target = case.victim.gradient.target
    fnorm = case.feature_targets.norm(dim=1)
    history: list[dict[str, Any]] = []
    phases_out = []
    step_no, t0 = 0, time.perf_counter()

    def record(xfull: torch.Tensor, phase: int) -> None:
        s = scores(case, to_pixels(case.model, xfull))
        history.append({"step": step_no, "phase": phase, "seconds": round(time.perf_counter() - t0, 1),
                        "psnr": s["psnr"], "psnr_by_label": s["psnr_by_label"]})

    record(x, -1)
    for pi, ph in enumerate(v.phases):
        alpha = {k: (getattr(case.paper, k) if getattr(ph, k) is None else getattr(ph, k))
                 for k in ("alpha_g", "alpha_bn", "alpha_tv", "alpha_l2")}
        # the phase's variable: the current image at ph.res (area down-sampling; identity at 224)
        z = (x if ph.res == SIZE else F.interpolate(x, size=ph.res, mode="area")).detach().clone().requires_grad_(True)
        zlo, zhi = lo[..., :ph.res, :ph.res], hi[..., :ph.res, :ph.res]  # the box is per channel: constant
        opt = torch.optim.Adam([z], lr=ph.lr, betas=ph.betas)
        tp = time.perf_counter()
        last: dict[str, float] = {}
        for t in range(ph.steps):
            if t < ph.warmup:
                lr_t = ph.lr * (t + 1) / ph.warmup
            else:
                u = (t - ph.warmup) / max(1, ph.steps - ph.warmup)
                lr_t = ph.lr * (ph.floor + (1 - ph.floor) * 0.5 * (1 + math.cos(math.pi * u)))
            for grp in opt.param_groups:
                grp["lr"] = lr_t
            xi = z if ph.res == SIZE else F.interpolate(z, size=SIZE, mode="bilinear", align_corners=False)
            inp = xi
            if ph.jitter and alpha["alpha_g"] == 0:
                dx, dy = (int(v_) for v_ in torch.randint(-ph.jitter, ph.jitter + 1, (2,), generator=aug))
                inp = torch.roll(inp, shifts=(dx, dy), dims=(2, 3))
            if ph.flip and alpha["alpha_g"] == 0 and bool(torch.rand((), generator=aug) < 0.5):
                inp = torch.flip(inp, dims=(3,))
            inp = inp.contiguous(memory_format=torch.channels_last)
            grads, stats, feats = case.forward(inp, double=alpha["alpha_g"] > 0)
            obj = alpha["alpha_tv"] * total_variation(xi[None])[0] + alpha["alpha_l2"] * l2_norm(xi[None])[0]
            if alpha["alpha_bn"] > 0:
                obj = obj + alpha["alpha_bn"] * weighted_bn(stats, case.targets, ph.first_bn)
            if grads is not None:
                dist = layer_l2_batched([gr[None] for gr in grads], target)[0]
                obj = obj + alpha["alpha_g"] * dist
                last["eq3_distance"] = float(dist.detach())
            if ph.alpha_feat > 0:
                obj = obj + ph.alpha_feat * ((feats - case.feature_targets).norm(dim=1) / fnorm).sum()
            (gz,) = torch.autograd.grad(obj, [z])
            z.grad = gz
            opt.step()
            with torch.no_grad():
                if ph.alpha_n > 0:
                    z.add_(torch.randn(z.shape, generator=gen).to(case.device), alpha=lr_t * ph.alpha_n)
                z.copy_(torch.maximum(torch.minimum(z, zhi), zlo))
            last["objective"] = float(obj.detach())
            step_no += 1
            if step_no % log_every == 0 or t == ph.steps - 1:
                with torch.no_grad():
                    xf = z if ph.res == SIZE else F.interpolate(z, size=SIZE, mode="bilinear", align_corners=False)
                record(xf.detach(), pi)
        with torch.no_grad():
            x = (z if ph.res == SIZE else F.interpolate(z, size=SIZE, mode="bilinear", align_corners=False)).detach()
        phases_out.append({"phase": pi, **{k: (list(val) if isinstance(val, tuple) else val)
                                           for k, val in ph.__dict__.items()}, **alpha,
                           "seconds": round(time.perf_counter() - tp, 1),
                           "seconds_per_step": round((time.perf_counter() - tp) / max(1, ph.steps), 3),
                           "last": last, "psnr_after": history[-1]["psnr"]})
        log(f"{v.name} phase {pi}: {ph.steps} steps at {ph.res} px in {phases_out[-1]['seconds']} s, "
            f"PSNR {history[-1]['psnr']:.2f} dB ({last})")
    seconds = time.perf_counter() - t0
    pixels = to_pixels(case.model, x)
    with torch.no_grad():
        _, stats, feats = case.forward(x, double=False)
        r_bn = float(weighted_bn(stats, case.targets, 1.0))
        fdist = ((feats - case.feature_targets).norm(dim=1) / fnorm).tolist()
    rel = case.relative_distance(x)
    out = {"variant": v.name, "what": v.what, "init": v.init, "steps": step_no, "seconds": round(seconds, 1),
           **scores(case, pixels), "relative_gradient_distance": rel, "r_bn": r_bn,
           "feature_relative_distance_mean": round(sum(fdist) / K, 4), "phases": phases_out, "history": history,
           "_pixels": pixels}
    log(f"{v.name}: PSNR {out['psnr']:.2f} dB (by label {out['psnr_by_label']:.2f}), {out['above_zero_image']}/8 "
        f"above zero, rel. distance {rel:.3g}, R_BN {r_bn:.3g}, features {out['feature_relative_distance_mean']}, "
        f"{seconds:.0f} s")
    return out


def _scaled(v: Variant, scale: float) -> Variant:
    if scale == 1.0:
        return v
    return replace(v, phases=tuple(replace(ph, steps=max(2, int(ph.steps * scale)),
                                           warmup=min(int(ph.warmup * scale), max(2, int(ph.steps * scale)) // 10))
                                   for ph in v.phases))


def step_seconds(case: Case, reps: int = 3) -> dict[str, float]:
    """Seconds per step with Eq. 3 (double backward) and without it (forward + backward), 224 px."""
    from gradleak.attacks.objectives import layer_l2_batched

    def sync() -> None:
        if case.device.type == "cuda":
            torch.cuda.synchronize(case.device)

    out = {}
    for name, double in (("eq3", True), ("cheap", False)):
        times = []
        for r in range(reps + 1):  # the first: warm-up
            x = torch.randn((K, 3, SIZE, SIZE), generator=torch.Generator().manual_seed(r)).to(case.device)
            x.requires_grad_(True)
            sync()
            t = time.perf_counter()
            grads, stats, feats = case.forward(x, double=double)
            obj = weighted_bn(stats, case.targets, 1.0) + feats.norm()
            if grads is not None:
                obj = obj + layer_l2_batched([g[None] for g in grads], case.victim.gradient.target)[0]
            torch.autograd.grad(obj, [x])
            sync()
            times.append(time.perf_counter() - t)
        out[name] = statistics.median(times[1:])
    log(f"seconds per step at 224 px: Eq. 3 {out['eq3']:.4f}, without {out['cheap']:.4f}")
    return out


def cost(v: Variant, per_step: dict[str, float]) -> float:
    return sum(ph.steps * per_step["eq3" if (ph.alpha_g is None or ph.alpha_g > 0) else "cheap"] for ph in v.phases)


def grid(case: Case, pixels: dict[str, torch.Tensor], path: Path, size: int = 112) -> None:
    """One picture: the photos (first row, in slot order: the restored labels), then one row per
    variant's answer, each slot paired with the photo of its restored label."""
    from PIL import Image
    order = [int((case.truth.labels == c).nonzero()[0]) for c in case.labels.tolist()]
    rows = [case.truth.images[order]] + list(pixels.values())
    tiles = torch.cat([F.interpolate(r.float().cpu(), size=size, mode="area") for r in rows])
    n, cols = len(rows), K
    canvas = torch.ones(3, n * (size + 4), cols * (size + 4))
    for i, t in enumerate(tiles):
        r, c = divmod(i, cols)
        canvas[:, r * (size + 4):r * (size + 4) + size, c * (size + 4):c * (size + 4) + size] = t
    Image.fromarray((canvas.clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()).save(path)
    (path.with_suffix(".txt")).write_text("rows: photos, " + ", ".join(pixels) + "\n")


def measure_schedules(case: Case, names: list[str] | None, previous: dict[str, Any] | None,
                      scale: float = 1.0, *, log_every: int = 10, deadline: float | None = None,
                      save: Callable[[dict[str, Any]], None] | None = None,
                      pixels: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """The variants (``names`` in that order, or all), each ``scale`` x its steps. With a
    ``deadline`` (time.perf_counter() value), a variant whose estimated cost (step_seconds) would
    end past it is skipped and recorded as skipped; ``save`` gets the section after each variant."""
    rows = {r["variant"]: r for r in (previous or {}).get("rows", [])}
    known = {v.name: v for v in variants(case)}
    unknown = set(names or ()) - set(known)
    if unknown:
        raise SystemExit(f"unknown variant(s) {sorted(unknown)}; known: {', '.join(known)}")
    per_step = step_seconds(case) if deadline is not None else None
    skipped: list[dict[str, Any]] = []
    section: dict[str, Any] = {}

    def assemble() -> dict[str, Any]:
        # the truth's own scores on the same quantities (what a perfect answer would get)
        x = case.model.normalize(case.truth.images).to(case.device)
        order = [int((case.truth.labels == c).nonzero()[0]) for c in case.labels.tolist()]
        with torch.no_grad():
            _, stats, feats = case.forward(x[order], double=False)
        truth = {"relative_gradient_distance": case.relative_distance(x[order]),
                 "r_bn": float(weighted_bn(stats, case.targets, 1.0)),
                 "feature_relative_distance_mean": float(((feats - case.feature_targets).norm(dim=1)
                                                          / case.feature_targets.norm(dim=1)).mean())}
        return {"what": "short attacks at ~equal cost, one seed, no group term, boxed; PSNR after pixel pairing "
                        "(gradleak's metric) and by restored label", "device": str(case.device), "scale": scale,
                "seconds_per_step": per_step, "skipped": skipped, "truth": truth,
                "rows": sorted(rows.values(), key=lambda r: list(known).index(r["variant"])
                               if r["variant"] in known else 99)}

    for name in (names or list(known)):
        v = _scaled(known[name], scale)
        if deadline is not None and per_step is not None:
            need = 1.15 * cost(v, per_step) + 5
            if time.perf_counter() + need > deadline:
                skipped.append({"variant": name, "estimated_seconds": round(need, 1),
                                "seconds_left": round(deadline - time.perf_counter(), 1)})
                log(f"{name}: skipped (needs ~{need:.0f} s, {deadline - time.perf_counter():.0f} s left)")
                continue
        row = run_variant(case, v, log_every=log_every)
        px = row.pop("_pixels")
        if pixels is not None:
            pixels[name] = px
        rows[name] = row
        if save is not None:
            section = assemble()
            save(section)
    return assemble()


# ---------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"sections to (re-)run: {','.join(SECTIONS)}")
    ap.add_argument("--variants", default="", help="schedules: only these variants (comma-separated)")
    ap.add_argument("--out", type=Path, default=OUT_JSON)
    ap.add_argument("--scale", type=float, default=1.0, help="schedules: steps x SCALE (harness check; --out elsewhere)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (the attacker's side; the client runs on the CPU)")
    ap.add_argument("--log-every", type=int, default=10, help="schedules: score the answer every N steps")
    ap.add_argument("--seconds", type=float, default=None,
                    help="schedules: a time budget: variants whose estimated cost would overrun it are skipped")
    ap.add_argument("--grid", type=Path, default=None, help="schedules: write a picture of every variant's answer here")
    args = ap.parse_args(argv)
    only = [s for s in args.only.split(",") if s]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"unknown section(s) {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    started = time.perf_counter()
    torch.set_num_threads(1 if args.device == "cpu" else min(8, os.cpu_count() or 1))
    torch.manual_seed(0)
    previous = json.loads(args.out.read_text()) if args.out.exists() else {}
    data = dict(previous)
    data.update({"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S%z"),
                 "torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                 "cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
                 "load_at_start": list(os.getloadavg()), "device": args.device})
    if args.device != "cpu":
        data["gpu"] = torch.cuda.get_device_name(torch.device(args.device))
    t = time.perf_counter()
    case = Case(args.device)
    log(f"case built in {time.perf_counter() - t:.1f} s; labels {case.labels.tolist()}")
    if "baselines" in only:
        data["baselines"] = measure_baselines(case)
    if "readout" in only:
        data["readout"] = measure_readout(case)
    if "precision" in only:
        if args.device != "cpu":
            raise SystemExit("precision: this CPU's section (benchmarks/gpu.py measures precision on a GPU)")
        data["precision"] = measure_precision(case)
    if "schedules" in only:
        names = [n for n in args.variants.split(",") if n] or None
        pixels: dict[str, torch.Tensor] = {}

        def save(section: dict[str, Any]) -> None:
            args.out.write_text(json.dumps({**data, "schedules": section}, indent=1) + "\n")
            if args.grid is not None:
                grid(case, pixels, args.grid)

        deadline = None if args.seconds is None else started + args.seconds
        data["schedules"] = measure_schedules(case, names, previous.get("schedules"), args.scale,
                                              log_every=args.log_every, deadline=deadline, save=save, pixels=pixels)
    data["load_at_end"] = list(os.getloadavg())
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    log(f"wrote {args.out} ({time.perf_counter() - t:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
