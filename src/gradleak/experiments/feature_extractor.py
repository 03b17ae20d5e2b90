"""GradInversion Table 3 ("gradients from a stronger feature extractor leak more information"),
on three pairs of networks of different strength that are available offline, each pair attacked
on the same batches with the same attack and budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..report import save_line_plot
from .base import ExperimentOptions, ExperimentResult, experiment, markdown_table
from .cells import CellResult, Workspace
from .common import (IMAGE_VERDICT_COLUMNS, VERDICT_RULE, THRESHOLD_DB, convergence_notes, gradinversion_cell, image_rows,
                     save_grids, scored_title, settings_of, summarize, summary_columns, verdict_fields)


@dataclass(frozen=True)
class Network:
    """One network of a pair: how the cells build it and how the tables name it."""

    label: str
    model: str
    width: int | None = None
    trained: bool = False  # its weights are the convnet's after training (training pair)


@dataclass(frozen=True)
class Pair:
    """Two networks of different strength attacked on the same batches (weaker first)."""

    name: str
    question: str
    data: str
    image_size: int | None
    split: str
    weaker: Network
    stronger: Network


PAIRS: tuple[Pair, ...] = (
    Pair("pretraining", "ImageNet-pretrained vs random weights, same architecture", "imagenet-samples", 64, "train",
         Network("EfficientNet-Lite0 random", "efficientnet-lite0-random"),
         Network("EfficientNet-Lite0 pretrained", "efficientnet-lite0")),
    Pair("training", "trained (one epoch, Fashion-MNIST) vs untrained, same weights at the start", "fashion-mnist", None,
         "test", Network("convnet untrained", "convnet", 16), Network("convnet trained", "convnet", 16, trained=True)),
    Pair("depth", "shallower vs deeper, both at random initialisation", "cifar10-samples", None, "train",
         Network("convnet (4 conv)", "convnet", 16), Network("ResNet-18 (17 conv, residual)", "resnet18-cifar")),
)
ROLES = ("weaker", "stronger")
# Budget of every cell (smoke, full): iterations x seeds, batch size, samples (batches) per network.
ITERATIONS = (20, 120)
SEEDS = 2
BATCH_SIZE = 2
SAMPLES = (1, 3)
# The training pair's SGD (as identifiability --trained: one epoch, batch 32, lr 0.01, momentum 0.9).
TRAIN = dict(epochs=1.0, batch_size=32, lr=0.01, momentum=0.9)
SMOKE_TRAIN_SUBSET, SMOKE_TEST_SUBSET = 2000, 500
# The paper's Table 3 (ResNets on ImageNet, 224 px, its full budget): FFT2D, PSNR, LPIPS.
PAPER = {"ResNet-50 (MoCo v2)": (0.175, 12.929, 0.484), "ResNet-50 (standard)": (0.204, 11.771, 0.584),
         "ResNet-18 (standard)": (0.218, 10.729, 0.693)}
CLAIM = "gradients from a stronger feature extractor leak more (GradInversion Table 3)"
COLUMNS = ["pair", "role", "network", "model", "parameters", "sample", "seed", "image", "name", "label",
           "label_restored", "psnr_by_label", "psnr", "ssim", "ssim_by_label", "zero_psnr", "prior_psnr", "flat_psnr", "fft2d", "rpsnr", "lpips",
           "gradient_distance", *IMAGE_VERDICT_COLUMNS, "iterations", "wall_seconds"]
BY = ["pair", "role", "network"]
VALUES = ("psnr_by_label", "psnr", "fft2d", "flat_psnr", "zero_psnr", "prior_psnr")


def _refuse_fixed_options(opt: ExperimentOptions) -> None:
    """The pairs fix their networks and data: --model, --width, --data, --attacks, --batches are
    errors, not silently ignored; one batch size only."""
    given = [flag for flag, v in (("--model", opt.model), ("--width", opt.width), ("--data", opt.data),
                                  ("--attacks", opt.attacks), ("--batches", opt.batches)) if v]
    if given:
        raise ConfigError(f"feature-extractor compares fixed pairs of networks on fixed data with GradInversion: "
                          f"{', '.join(given)} does not apply")
    if len(opt.batch_sizes or []) > 1:
        raise ConfigError("feature-extractor runs one batch size (--batch-sizes K)")


def plan_cells(opt: ExperimentOptions, checkpoint: str | None) -> dict[tuple[str, str, int], dict[str, Any]]:
    """The cells: every network of every pair on the same ``samples`` batches (seed, seed + 1, ...)
    at the same budget; ``checkpoint`` is the trained convnet's weights (None: leave the training
    pair's trained network out)."""
    iterations = opt.iterations or ITERATIONS[0 if opt.smoke else 1]
    k = (opt.batch_sizes or [BATCH_SIZE])[0]
    samples = opt.samples or SAMPLES[0 if opt.smoke else 1]
    plan: dict[tuple[str, str, int], dict[str, Any]] = {}
    for pair in PAIRS:
        for role in ROLES:
            net: Network = getattr(pair, role)
            if net.trained and checkpoint is None:
                continue
            fields: dict[str, Any] = dict(model=net.model, width=net.width, data=pair.data, batch_size=k)
            if pair.image_size is not None:
                fields["image_size"] = pair.image_size
            if pair.split != "train":
                fields["split"] = pair.split
            if net.trained:
                fields["checkpoint"] = checkpoint
            for s in range(samples):
                plan[(pair.name, role, s)] = gradinversion_cell(iterations, SEEDS, seed=opt.seed + s, **fields)
    return plan


def _train_convnet(opt: ExperimentOptions, ws: Workspace) -> tuple[str, dict[str, Any]]:
    """The training pair's trained convnet: (checkpoint path, what the setup records)."""
    from ..training import TrainConfig

    pair = next(p for p in PAIRS if p.name == "training")
    cfg = TrainConfig(model=pair.stronger.model, width=pair.stronger.width, data=pair.data, checkpoints=(0.0, 1.0),
                      seed=opt.seed, model_seed=0, train_subset=SMOKE_TRAIN_SUBSET if opt.smoke else None,
                      test_subset=SMOKE_TEST_SUBSET if opt.smoke else 2000, **TRAIN)
    trained = ws.trained(cfg)
    final = trained.checkpoints[-1]
    record = {**cfg.to_dict(), "train_images": trained.train_images, "test_images": trained.test_images,
              "steps": trained.total_steps, "test_accuracy": final.test_accuracy,
              "wall_seconds": round(trained.wall_seconds, 1),
              "folder": str(trained.folder.relative_to(ws.folder)) + "/"}
    untrained = next((c for c in trained.checkpoints if c.fraction == 0.0), None)
    if untrained is not None:
        record["test_accuracy_untrained"] = untrained.test_accuracy
    return str(final.path), record


def _parameters(pair: Pair, net: Network) -> int:
    """Trainable parameters of a network as its cells build it."""
    from ..data import open_source
    from ..models import build_model

    src = open_source(pair.data, split=pair.split)
    spec = build_model(net.model, num_classes=src.num_classes, channels=src.native_channels,
                       image_size=pair.image_size, width=net.width)
    return sum(p.numel() for p in spec.module.parameters() if p.requires_grad)


def flat_psnr(cell: CellResult) -> list[float]:
    """Per private image of ``cell``: the PSNR of a flat mid-grey image (the answer that reads
    nothing from the update)."""
    import torch

    from ..metrics.image import psnr

    images = cell.truth().images
    return [float(v) for v in psnr(torch.full_like(images, 0.5), images)]


def _rows(cells: dict[tuple[str, str, int], CellResult], opt: ExperimentOptions,
          parameters: dict[tuple[str, str], int]) -> list[dict[str, Any]]:
    pairs = {p.name: p for p in PAIRS}
    rows: list[dict[str, Any]] = []
    for (pair, role, sample), cell in cells.items():
        if not cell.ok:
            continue
        net: Network = getattr(pairs[pair], role)
        m = cell.metrics
        flats = flat_psnr(cell)
        img = image_rows(cell, pair=pair, role=role, network=net.label, model=net.model,
                         parameters=parameters[(pair, role)],
                         sample=sample, seed=opt.seed + sample, gradient_distance=m.get("gradient_distance"),
                         iterations=m["iterations"], wall_seconds=round(float(m["wall_seconds"]), 2))
        for i, r in enumerate(img):
            r["flat_psnr"] = flats[i] if i < len(flats) else None
            r.update(verdict_fields(cell, r["psnr"] >= THRESHOLD_DB, image=r["image"]))
        rows += img
    return rows


def _num(v: Any) -> str:
    return "n/a" if v is None else f"{float(v):.2f}"


def _sample_means(rows: list[dict[str, Any]], pair: str, role: str) -> dict[int, float]:
    out: dict[int, list[float]] = {}
    for r in rows:
        if r["pair"] == pair and r["role"] == role and r["psnr"] is not None:
            out.setdefault(r["sample"], []).append(float(r["psnr"]))
    return {s: sum(v) / len(v) for s, v in out.items()}


def pair_notes(rows: list[dict[str, Any]], summary: list[dict[str, Any]]) -> list[str]:
    """Per pair: the weaker and the stronger network's mean PSNR, the paired differences per batch,
    which runs converged (so whether the comparison is between converged or only equally budgeted
    runs), the flat-image baseline, and whether the pair agrees with the paper's direction."""
    by = {(s["pair"], s["role"]): s for s in summary}
    notes = []
    for pair in PAIRS:
        w, st = by.get((pair.name, "weaker")), by.get((pair.name, "stronger"))
        if w is None or st is None or w["psnr_mean"] is None or st["psnr_mean"] is None:
            continue
        diff = st["psnr_mean"] - w["psnr_mean"]
        ws, ss = _sample_means(rows, pair.name, "weaker"), _sample_means(rows, pair.name, "stronger")
        paired = [ss[s] - ws[s] for s in sorted(set(ws) & set(ss))]
        higher = sum(d > 0 for d in paired)
        converged = w["non_converged"] == 0 and st["non_converged"] == 0
        basis = ("every run of both converged: a comparison of converged runs" if converged else
                 f"{w['non_converged']} of {w['samples']} weaker and {st['non_converged']} of {st['samples']} stronger "
                 "runs did not converge: a comparison at equal budget only (a run that did not converge ended where "
                 "the budget ended, and its PSNR is not the most its update gives away)")
        flat = w["flat_psnr_mean"]  # the same images for both networks
        below = [s["network"] for s in (w, st) if flat is not None and s["psnr_mean"] <= flat]
        reading = _reading(diff, paired, converged, both_below=len(below) == 2)
        notes.append(
            f"{pair.name} ({pair.question}; {pair.data}): {w['network']} {_num(w['psnr_mean'])} dB (std "
            f"{_num(w['psnr_std'])}) vs {st['network']} {_num(st['psnr_mean'])} dB (std {_num(st['psnr_std'])}), "
            f"stronger minus weaker {diff:+.2f} dB; per batch {', '.join(f'{d:+.2f}' for d in paired)} "
            f"(stronger higher on {higher} of {len(paired)}); FFT2D {_num(w['fft2d_mean'])} vs "
            f"{_num(st['fft2d_mean'])} (lower is closer); {basis}; {reading}. Flat mid-grey image "
            f"{_num(flat)} dB" + (f": {' and '.join(below)} at or below it (no leakage PSNR can see)" if below else "")
            + ".")
    return notes


def _reading(diff: float, paired: list[float], converged: bool, *, both_below: bool) -> str:
    """A pair's reading of the claim: inconclusive when neither network beats the flat image;
    else agrees (on every batch, or in the mean only) or contradicts, and a contradiction by runs
    that did not converge is inconclusive, not evidence that the stronger network leaks less."""
    if both_below:
        return ("inconclusive: neither network's reconstructions are closer to the images than the flat grey image, "
                "so there is no leak to compare")
    if diff > 0:
        every = bool(paired) and all(d > 0 for d in paired)
        return f"agrees with the stated claim ({CLAIM})" + ("" if every else " in the mean, not on every batch")
    reading = f"CONTRADICTS the stated claim ({CLAIM})"
    if not converged:
        reading += " at this budget: inconclusive, not evidence that the stronger network leaks less"
    return reading


SPEC = {
    "name": "feature-extractor",
    "summary": ("GradInversion Table 3: leakage of a weaker vs a stronger network (pretrained vs random "
                "EfficientNet-Lite0, trained vs untrained convnet, convnet vs ResNet-18)"),
}


@experiment("feature-extractor")
def feature_extractor(opt: ExperimentOptions, ws: Workspace) -> ExperimentResult:
    _refuse_fixed_options(opt)
    checkpoint, training = _train_convnet(opt, ws)
    plan = plan_cells(opt, checkpoint)
    facts = {(p.name, role): _parameters(p, getattr(p, role)) for p in PAIRS for role in ROLES}
    cells = ws.run(plan, run_folders=[(p.name, role, 0) for p in PAIRS for role in ROLES])
    rows = _rows(cells, opt, facts)
    summary = summarize(rows, BY, values=VALUES, images=True)
    means = [{"pair": s["pair"], "network": s["network"], "psnr_by_label": s["psnr_by_label_mean"],
              "psnr": s["psnr_mean"], "fft2d": s["fft2d_mean"], "prior_psnr": s["prior_psnr_mean"],
              "flat_psnr": s["flat_psnr_mean"], "not converged": f"{s['non_converged']}/{s['samples']}"}
             for s in summary]
    notes = ["Means over every image per network:\n\n"
             + markdown_table(["pair", "network", "psnr_by_label", "psnr", "fft2d", "flat_psnr", "prior_psnr", "not converged"],
                            means) + "\n",
             "The paper's Table 3 (ImageNet, 224 px, its full budget; FFT2D / PSNR / LPIPS): "
             + "; ".join(f"{k} {v[0]} / {v[1]} dB / {v[2]}" for k, v in PAPER.items())
             + ". FFT2D here is on this project's scale (metrics/paper.py): compare it within a pair only."]
    notes += pair_notes(rows, summary) + convergence_notes(cells.values())
    if all(r["lpips"] is None for r in rows):
        notes.append("LPIPS is null: its AlexNet/VGG weights are not in the torch cache (no random backbone is used).")
    figs = _figures(ws, cells, rows, summary)
    iterations, k = plan_budget(plan)
    samples = opt.samples or SAMPLES[0 if opt.smoke else 1]
    return ExperimentResult(
        name="feature-extractor", title="Leakage vs feature-extractor strength (GradInversion Table 3)",
        columns=COLUMNS, rows=rows, figures=figs, notes=notes, summary=summary,
        summary_columns=summary_columns(BY, VALUES, images=True),
        setup={"pairs": {p.name: {"question": p.question, "data": p.data, "split": p.split,
                                  "image size": p.image_size or "the model's default (32)",
                                  "weaker": p.weaker.label, "stronger": p.stronger.label} for p in PAIRS},
               "models": {f"{p.name}/{role}": f"{getattr(p, role).model}"
                          + (f" (width {getattr(p, role).width})" if getattr(p, role).width else "")
                          + ("; trained weights (training below)" if getattr(p, role).trained
                             else "; ImageNet weights" if getattr(p, role).model == "efficientnet-lite0"
                             else "; random init, model seed 0")
                          + f"; {facts[(p.name, role)]:,} parameters" for p in PAIRS for role in ROLES},
               "training": training,
               "attack": f"gradinversion, cpu preset, BN exact (the client shares its BN batch statistics), {iterations} "
                         f"iterations x {SEEDS} seeds, registered group term, per-layer alphas scaled to each network",
               "batch size": k, "samples": f"{samples} batch(es) per network, seeds {opt.seed}..{opt.seed + samples - 1} "
                                           "(the same batches for both networks of a pair)",
               "gradinversion settings": {p.name: settings_of(c for (pn, role, _), c in cells.items()
                                                              if pn == p.name and role == "stronger") for p in PAIRS},
               "success threshold": f"leaked = the image's PSNR >= {THRESHOLD_DB} dB (or a recognisable image); "
                                    f"{VERDICT_RULE}",
               "flat_psnr": "PSNR of a flat mid-grey image (0.5 in every channel; reads nothing from the update)",
               "lpips": "null unless the AlexNet/VGG LPIPS weights are in the torch cache",
               "torch threads": ws.threads(), "smoke": opt.smoke})


def plan_budget(plan: dict[tuple[str, str, int], dict[str, Any]]) -> tuple[int, int]:
    """(iterations, batch size) every cell of the plan shares."""
    first = next(iter(plan.values()))
    return int(first["iterations"]), int(first["batch_size"])


def _figures(ws: Workspace, cells: dict[tuple[str, str, int], CellResult], rows: list[dict[str, Any]],
             summary: list[dict[str, Any]]) -> list[str]:
    by = {(s["pair"], s["role"]): s for s in summary}
    fig = "psnr_by_pair.png"
    save_line_plot(ws.out / fig, [p.name for p in PAIRS],
                   {**{f"{role} network": [by[(p.name, role)]["psnr_mean"] if (p.name, role) in by else None
                                           for p in PAIRS] for role in ROLES},
                    "flat mid-grey image": [by[(p.name, "weaker")]["flat_psnr_mean"] if (p.name, "weaker") in by
                                               else None for p in PAIRS]},
                   xlabel="pair", ylabel="PSNR (dB), mean over images", title="Weaker vs stronger feature extractor")
    figs = [fig]
    verdicts = {}
    for r in rows:
        verdicts.setdefault((r["pair"], r["role"], r["sample"]), set()).add(r["verdict"])
    for p in PAIRS:  # one figure per pair: the pairs' images differ in size and channels
        keys = [(p.name, role, 0) for role in ROLES if (p.name, role, 0) in cells]
        group = [(scored_title(getattr(p, k[1]).label, cells[k], "/".join(sorted(verdicts.get(k, ()))) or None),
                  cells[k]) for k in keys]
        if save_grids(ws.out / f"reconstructions_{p.name}.png", [(p.name, group)]):
            figs.append(f"reconstructions_{p.name}.png")
    return figs
