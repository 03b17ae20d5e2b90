"""Helpers shared by experiment modules: the options every experiment resolves the same way, the
cells they have in common, and reading cells back (rows per image, means, PSNR over time,
image grids)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from ..errors import ConfigError
from ..outcome import DEFENDED as OUTCOME_DEFENDED
from ..outcome import INCONCLUSIVE as OUTCOME_INCONCLUSIVE
from ..outcome import LEAKED as OUTCOME_LEAKED
from ..outcome import PRESUMED_LEAKED, evidence_from_metrics, judge, number, recognisable_row, worst
from .base import ExperimentOptions
from .cells import CellResult

# Success threshold of the DLG-side experiments: MSE <= 0.01 on [0, 1] pixels (see local_iterations.py).
THRESHOLD_DB = 20.0
# The start of their L-BFGS attacks: mid-grey pixels (DLG's N(0, 1) start saturates the sigmoid
# LeNet on many photos; the grey start is an attacker choice that uses no ground truth).
LBFGS_INIT = "zeros"
# The tables are measured at fixed iteration budgets (the papers' protocol, and what the committed
# reproduction/ results were computed with): DLG/iDLG cells run every step of their budget, not the
# settled stop of the interactive default (attacks/dlg.py, SETTLE_*), which ends a start early
# once its objective has settled and would move the tables' numbers by rounding-level amounts.
DLG_STOP = "budget"


@dataclass(frozen=True)
class Setting:
    """The options an experiment resolves from --model, --width, --data, --attacks, --samples,
    --iterations and --seed, each with the experiment's own default."""

    model: str
    width: int | None
    data: str
    attack: str
    samples: int
    iterations: int | None
    seed: int

    @property
    def seeds(self) -> range:
        return range(self.seed, self.seed + self.samples)

    @property
    def seed_text(self) -> str:
        return f"{self.seed}..{self.seed + self.samples - 1}"


def setting(opt: ExperimentOptions, *, model: str, data: str, attack: str = "dlg", width: int | None = None,
            samples: tuple[int, int] = (1, 3), iterations: tuple[int | None, int | None] = (None, None)) -> Setting:
    """Each option from the command line, else the experiment's default; ``samples`` and
    ``iterations`` are (smoke, full)."""
    pick = 0 if opt.smoke else 1
    return Setting(model=opt.model or model, width=opt.width or width, data=opt.data or data,
                   attack=(opt.attacks or [attack])[0], samples=opt.samples or samples[pick],
                   iterations=opt.iterations or iterations[pick], seed=opt.seed)


def refuse_attacks(opt: ExperimentOptions, name: str, runs: str) -> None:
    """ConfigError when --attacks is given to an experiment that runs fixed attacks (a flag is
    never ignored)."""
    if opt.attacks:
        raise ConfigError(f"{name} runs {runs}: --attacks does not apply")


def lbfgs_cell(s: Setting, seed: int, *, log_points: int, **fields: Any) -> dict[str, Any]:
    """A DLG-family cell as the DLG-side experiments run it: float64 L-BFGS from LBFGS_INIT,
    ``log_points`` PSNR observations over the run."""
    n_iter = int(s.iterations or 1)
    return dict(attack=s.attack, model=s.model, width=s.width, data=s.data, seed=seed, iterations=s.iterations,
                dtype="float64", init=LBFGS_INIT, stop=DLG_STOP, log_every=max(1, n_iter // log_points), **fields)


def mean(values: Iterable[Any]) -> float | None:
    """Mean of the values that are not None (None if there are none)."""
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def finite_mean(values: Sequence[Any]) -> float | None:
    """Mean for a figure: None (a gap) if a value is missing or not finite."""
    if not values or any(v is None or not math.isfinite(v) for v in values):
        return None
    return sum(values) / len(values)


def series(rows: list[dict[str, Any]], x_key: str, xs: Sequence[Any], value: str = "psnr",
           **where: Any) -> list[float | None]:
    """For each x, the mean of ``value`` over the rows with ``x_key`` == x (and ``where``)."""
    return [finite_mean([r[value] for r in rows if r[x_key] == x and all(r[k] == v for k, v in where.items())])
            for x in xs]


def quality(cell: CellResult) -> dict[str, Any]:
    """The batch-level numbers most experiments report for a cell."""
    m = cell.metrics
    return {"psnr": m["psnr_mean"], "ssim": m["ssim_mean"], "mse": m["mse_mean"],
            "label_accuracy": m["label_accuracy"], "iterations": m["iterations"],
            "wall_seconds": round(float(m["wall_seconds"]), 2)}


def iterations_run(rows: Sequence[dict[str, Any]], attack: str, asked: int | None) -> Any:
    """What the setup records for ``attack``'s iterations: the number asked for, or for the attack's
    default the number its cells ran (from the rows), so that a later change of the default shows."""
    if asked is not None:
        return asked
    ran = sorted({r["iterations"] for r in rows if r.get("attack") == attack and r.get("iterations") is not None})
    return f"attack default ({', '.join(str(n) for n in ran)})" if ran else "attack default"


def leakage_rows(cells: dict[tuple[Any, ...], CellResult], names: tuple[str, ...]) -> list[dict[str, Any]]:
    """One row per finished cell: its key under ``names``, what it attacked (model, width, seed)
    and how well (quality, worst image, recovered = mean PSNR >= THRESHOLD_DB), and its verdict
    (VERDICT_COLUMNS)."""
    rows = []
    for key, cell in cells.items():
        if not cell.ok:
            continue
        c, q = cell.config, quality(cell)
        recovered = q["psnr"] >= THRESHOLD_DB
        rows.append({**dict(zip(names, key, strict=True)), **q,
                     "model": c["model"], "width": c["width"], "seed": c["seed"],
                     "psnr_min": min(r["psnr"] for r in cell.metrics["per_image"]),
                     **pairing_fields(cell), "recovered": recovered, **verdict_fields(cell, recovered)})
    return rows


#: The columns of a batch row beside its PSNR: the paper's pairing and the leak-free baselines
#: (pairing_fields), and how many of its images leaked (verdict_fields).
PAIRING_COLUMNS = ["psnr_by_label", "psnr_by_label_min", "zero_psnr", "prior_psnr"]
#: The columns of an image row beside its PSNR (image_rows).
IMAGE_PAIRING_COLUMNS = ["psnr_by_label", "ssim_by_label", "zero_psnr", "prior_psnr"]


def pairing_fields(cell: CellResult) -> dict[str, Any]:
    """A batch row's scores by the paper's pairing (each slot with the photo of its restored label:
    mean and worst image) and the leak-free baselines (the zero image's and the public prior
    image's mean PSNR); None where the cell recorded none (computed before they existed)."""
    per = cell.metrics.get("per_image") or []

    def over(key: str, how: Any) -> float | None:
        vals = [number(p.get(key)) for p in per]
        return how(vals) if vals and all(v is not None for v in vals) else None

    return {"psnr_by_label": over("psnr_by_label", lambda v: sum(v) / len(v)),
            "psnr_by_label_min": over("psnr_by_label", min),
            "zero_psnr": over("zero_psnr", lambda v: sum(v) / len(v)),
            "prior_psnr": over("prior_psnr", lambda v: sum(v) / len(v))}


def image_rows(cell: CellResult, **common: Any) -> list[dict[str, Any]]:
    """One row per private image: ``common`` fields + the image's scores."""
    rows = []
    for p in cell.metrics["per_image"]:
        rows.append({**common, "image": p["index"], "name": p.get("name", ""), "label": p["label_true"],
                     "label_restored": p["label_restored"], "psnr": p["psnr"], "ssim": p["ssim"],
                     **{k: p.get(k) for k in IMAGE_PAIRING_COLUMNS},
                     "fft2d": p.get("fft2d"), "rpsnr": p.get("rpsnr"), "lpips": p.get("lpips"),
                     "identified": p.get("identified")})
    return rows


def image_grid(cells: Sequence[tuple[str, CellResult]]) -> tuple[list[torch.Tensor], list[str]]:
    """Rows of a figure: the private batch ("original"), then each cell's reconstruction paired
    with it, titled; cells that failed are left out."""
    done = [(title, c) for title, c in cells if c.ok and c.run_dir is not None]
    if not done:
        return [], []
    truth = _shared_truth(done)
    return [truth.images] + [c.paired_images(truth) for _, c in done], ["original"] + [t for t, _ in done]


def _shared_truth(done: Sequence[tuple[str, CellResult]]) -> Any:
    """The private batch every one of ``done`` attacked (one "original" stands for all of them);
    ValueError naming the first cell that attacked another one."""
    truth = done[0][1].truth()
    for title, c in done[1:]:
        if not torch.equal(c.truth().images, truth.images):
            raise ValueError(f"image grid: {title!r} attacked another private batch than {done[0][0]!r}")
    return truth


def save_paired_rows(path: Path, rows: Sequence[tuple[str, Sequence[tuple[str, CellResult]]]]) -> bool:
    """One figure for cells that each attacked the same one image: the original, then per row
    (e.g. an attack) each cell's reconstruction side by side, captioned with its caption (e.g.
    the defense) and PSNR. False (no figure) if every cell failed."""
    from ..report import save_image_grid

    kept = [(title, [(cap, c) for cap, c in cells if c.ok and c.run_dir is not None]) for title, cells in rows]
    done = [(f"{title}: {cap}", c) for title, cells in kept for cap, c in cells]
    if not done:
        return False
    truth = _shared_truth(done)
    if truth.images.shape[0] != 1:
        raise ValueError("save_paired_rows draws one image per cell; these cells attacked batches")
    images = [truth.images]
    titles = ["original"]
    captions = [[", ".join(truth.names)]]
    for title, cells in kept:
        if cells:
            images.append(torch.cat([c.paired_images(truth) for _, c in cells]))
            titles.append(title)
            captions.append([f"{cap}\n{c.metrics['psnr_mean']:.1f} dB" for cap, c in cells])
    save_image_grid(path, images, titles, captions)
    return True


def save_grid(path: Path, cells: Sequence[tuple[str, CellResult]]) -> bool:
    """Save :func:`image_grid` of ``cells`` as a figure; False (no figure) if every cell failed."""
    return save_grids(path, [("", cells)])


def save_grids(path: Path, groups: Sequence[tuple[str, Sequence[tuple[str, CellResult]]]]) -> bool:
    """One figure of several :func:`image_grid` groups stacked, each on its own private batch (e.g.
    one per batch size), their row titles prefixed with the group's title; False (no figure) if
    every cell failed."""
    from ..report import save_image_grid

    rows: list[torch.Tensor] = []
    titles: list[str] = []
    for group, cells in groups:
        r, t = image_grid(cells)
        rows += r
        titles += [f"{group}: {x}" if group else x for x in t]
    if rows:
        save_image_grid(path, rows, titles)
    return bool(rows)


def scored_title(name: str, cell: CellResult, verdict: str | None = None) -> str:
    """A figure row's title: the cell's name, its mean PSNR and (given) its verdict."""
    if not cell.ok:
        return name
    return f"{name}, {cell.metrics['psnr_mean']:.1f} dB" + (f", {verdict}" if verdict else "")


def first_reaching(cell: CellResult, psnr_threshold: float) -> tuple[int | None, float | None]:
    """(iteration, seconds) at which the observed PSNR first reached the threshold, else (None,
    None). Seconds are interpolated from the run's wall time (iterations cost about the same)."""
    total = max(1, int(cell.metrics["iterations"]))
    for h in cell.history():
        p = h.get("psnr")
        if p is not None and p >= psnr_threshold:
            it = int(h["iteration"])
            t = h.get("time")
            return it, float(t) if t is not None else float(cell.metrics["wall_seconds"]) * it / total
    return None, None


def psnr_curve(cell: CellResult) -> tuple[list[float], list[float]]:
    """(seconds, psnr) points of the observed PSNR."""
    total = max(1, int(cell.metrics["iterations"]))
    xs, ys = [], []
    for h in cell.history():
        if h.get("psnr") is not None:
            t = h.get("time")
            xs.append(float(t) if t is not None else float(cell.metrics["wall_seconds"]) * int(h["iteration"]) / total)
            ys.append(float(h["psnr"]))
    return xs, ys


# --------------------------------------------------------------------------- GradInversion experiments
def budget(opt: ExperimentOptions) -> tuple[int, int]:
    """(iterations, seeds) of the GradInversion experiments: cpu preset 600 x 4; smoke 100 x 2."""
    return (opt.iterations or (100 if opt.smoke else 600)), (2 if opt.smoke else 4)


def victim(opt: ExperimentOptions) -> tuple[str, int, str]:
    """(model, width, data) of the GradInversion experiments: --model, --width, --data, else the
    BN/ReLU convnet at width 16 (the network the cpu preset was tuned on) on the CIFAR-10 photos."""
    return opt.model or "convnet", opt.width or 16, opt.data or "cifar10-samples"


def gradinversion_cell(iterations: int, seeds: int, bn: str = "exact", **fields: Any) -> dict[str, Any]:
    """GradInversion at the cpu preset with this budget (the preset's schedule scaled to the
    iterations), then ``fields`` (alphas, group, the client's batch...). BN "exact" matches the
    batch statistics the client shares, so that client shares them; "approx" matches the model's
    running statistics (the client shares none)."""
    cell = dict(attack="gradinversion", preset="cpu", iterations=iterations, seeds=seeds, bn=bn,
                log_every=max(1, iterations // 20))
    if bn == "exact":
        cell["share_bn_statistics"] = True
    return {**cell, **fields}


def one_batch_victim(opt: Any, name: str, what: str) -> tuple[str, int, str, int, int, int, int]:
    """(model, width, data, K, samples, iterations, seeds) of a GradInversion experiment that attacks
    one batch size with its own attacks (``what``: refused --attacks are told so)."""
    refuse_attacks(opt, name, what)
    if len(opt.batch_sizes or []) > 1:
        raise ConfigError(f"{name} runs one batch size (--batch-sizes K)")
    model, width, data = victim(opt)
    iterations, seeds = budget(opt)
    return model, width, data, (opt.batch_sizes or [4])[0], opt.samples or (1 if opt.smoke else 3), iterations, seeds


def victim_setup(model: str, width: int, data: str, batch_size: int, samples: int, seed: int,
                 weights: str = "random init, seed 0") -> dict[str, Any]:
    """The setup lines of the GradInversion experiments' victim: data, model (``weights``: how its
    weights came about), batch, samples."""
    return {"data": data, "model": f"{model} (width {width}, {weights}; training-mode BN)",
            "batch size": batch_size, "samples": f"{samples} batch(es), seeds {seed}..{seed + samples - 1}"}


# --trained (identifiability, comparison): the victim is first trained like training-stage's (SGD,
# one epoch, batch 32, lr 0.01, momentum 0.9) from the same initial weights (model seed 0), on the
# data source's training split.
VICTIM_TRAIN = dict(epochs=1.0, batch_size=32, lr=0.01, momentum=0.9)
VICTIM_SMOKE_TRAIN_SUBSET = 2000
VICTIM_SMOKE_TEST_SUBSET = 500


def trained_victim(opt: Any, ws: Any, model: str, width: Any, data: str) -> tuple[str | None, str]:
    """(checkpoint, how the victim's weights came about): with ``--trained`` the checkpoint of the
    victim trained first (the cells attack it: ``checkpoint=``); else None and its random initial
    weights."""
    if not opt.trained:
        return None, "random init, seed 0"
    from ..training import TrainConfig

    trained = ws.trained(TrainConfig(
        model=model, width=width, data=data, checkpoints=(1.0,), seed=opt.seed, model_seed=0,
        train_subset=VICTIM_SMOKE_TRAIN_SUBSET if opt.smoke else None,
        test_subset=VICTIM_SMOKE_TEST_SUBSET if opt.smoke else 2000, **VICTIM_TRAIN))
    final = trained.checkpoints[-1]
    return str(final.path), (f"trained from seed 0's init: SGD one epoch on {data}'s training split"
                             f"{f' (first {VICTIM_SMOKE_TRAIN_SUBSET} of a permutation)' if opt.smoke else ''}, "
                             f"batch 32, lr 0.01, momentum 0.9; test accuracy {100 * final.test_accuracy:.1f} %")


def settings_of(cells: Iterable[CellResult]) -> dict[str, Any] | None:
    """The attack's resolved constants as the first finished cell recorded them (metrics "settings")."""
    return next((c.metrics.get("settings") for c in cells if c.ok and c.metrics.get("settings")), None)


# --------------------------------------------------------------------------- verdicts and summaries
# What a sample's numbers say about the client: gradleak.outcome's verdict (one
# vocabulary and one rule for every surface), worsened to "leaked" when the experiment's own
# success rule says the data came back (a stricter target, e.g. identification):
#   leaked        the data came back (a leak, whatever the attacker's own verdict says);
#   defended      positive evidence that a defense stopped a capable attack (outcome.py: a defense,
#                 an answer that fits the defended update as well as the truth, nothing identified,
#                 a positive control that leaked);
#   inconclusive  everything else (a failed attack, no defense, an answer the truth fits better).
LEAKED, DEFENDED, INCONCLUSIVE = OUTCOME_LEAKED, OUTCOME_DEFENDED, OUTCOME_INCONCLUSIVE
VERDICTS = (LEAKED, INCONCLUSIVE, DEFENDED)
VERDICT_COLUMNS = ["converged", "verdict", "relative_gradient_distance"]
#: A row per image adds its batch's verdict (the worst over the batch's images) beside its own; a
#: row per batch adds how many of its images leaked.
IMAGE_VERDICT_COLUMNS = [*VERDICT_COLUMNS, "batch_verdict"]
BATCH_VERDICT_COLUMNS = [*VERDICT_COLUMNS, "images_leaked"]
#: How the verdict column is decided, as results.md's setup states it (after the experiment's leak rule).
VERDICT_RULE = ("defended = gradleak/outcome.py's positive evidence (a defense, an answer that fits the defended "
                "update as well as the truth, nothing identified, a positive control that leaked); else inconclusive")
def converged_of(metrics: dict[str, Any]) -> bool | None:
    """The run's own verdict (metrics "converged", else "convergence"["converged"]); None when the
    run recorded none (a cell computed before the verdict existed)."""
    value = metrics.get("converged")
    if value is None and isinstance(metrics.get("convergence"), dict):
        value = metrics["convergence"].get("converged")
    return None if value is None else bool(value)


def image_leak(metrics: dict[str, Any], row: dict[str, Any]) -> str:
    """Why one image of a cell leaked ("" when it did not): rebuilt (its PSNR >= THRESHOLD_DB),
    or recognisable (outcome.recognisable_row, the rule every surface uses, which counts an
    identification among >= outcome.MIN_DECOY_POOL candidates with a margin over the leak-free
    priors). A bare IIP identification is no leak here either: outcome.judge reads it as
    inconclusive (a flat answer can be picked out of a small pool by chance)."""
    psnr = number(row.get("psnr"))
    if psnr is not None and psnr >= THRESHOLD_DB:
        return f"rebuilt: PSNR {psnr:.1f} dB"
    return recognisable_row(row)


def image_verdict(metrics: dict[str, Any], row: dict[str, Any], rebuilt: bool | None = None) -> str:
    """One image's verdict: leaked when the experiment's own rule (``rebuilt``) or
    :func:`image_leak` says so; otherwise the outcome module's verdict on the run's evidence
    (convergence, defenses, control) with this image's scores alone."""
    if rebuilt or image_leak(metrics, row):
        return LEAKED
    alone = {**metrics, "psnr_mean": row.get("psnr"), "ssim_mean": row.get("ssim"), "per_image": [row]}
    verdict = judge(evidence_from_metrics(alone)).verdict
    return LEAKED if verdict == PRESUMED_LEAKED else verdict


def verdict_of(metrics: dict[str, Any], rebuilt: bool | None, image: int | None = None) -> str:
    """A sample's verdict. ``image`` given: that image's (:func:`image_verdict`). Else the run's:
    leaked when the experiment's own rule says rebuilt, else the worst over its images (a run
    without per-image rows, e.g. text: the outcome module's verdict on the cell's evidence).
    "presumed leaked" cannot occur: cells have the truth."""
    rows = [r for r in metrics.get("per_image") or [] if isinstance(r, dict)]
    if image is not None:
        row = next((r for r in rows if r.get("index") == image), None)
        if row is None:
            raise ValueError(f"verdict_of: the metrics hold no per-image row of image {image}")
        return image_verdict(metrics, row, rebuilt)
    if rebuilt:
        return LEAKED
    if rows:
        return worst(image_verdict(metrics, r) for r in rows)
    verdict = judge(evidence_from_metrics(metrics)).verdict
    return LEAKED if verdict == PRESUMED_LEAKED else verdict


def images_leaked(metrics: dict[str, Any]) -> int | None:
    """How many of a cell's images leaked (:func:`image_leak`); None without per-image rows."""
    rows = [r for r in metrics.get("per_image") or [] if isinstance(r, dict)]
    return sum(1 for r in rows if image_leak(metrics, r)) if rows else None


def verdict_fields(cell: CellResult, rebuilt: bool | None, image: int | None = None) -> dict[str, Any]:
    """The verdict columns of a row of ``cell``: with ``image``, an image row's
    (IMAGE_VERDICT_COLUMNS: its own verdict and its batch's, the worst over the batch's images);
    else a batch row's (BATCH_VERDICT_COLUMNS: the run's verdict and how many images leaked)."""
    m = cell.metrics
    conv = m.get("convergence") if isinstance(m.get("convergence"), dict) else {}
    fields = {"converged": converged_of(m), "relative_gradient_distance": conv.get("relative_gradient_distance")}
    if image is not None:
        return {**fields, "verdict": verdict_of(m, rebuilt, image), "batch_verdict": verdict_of(m, None)}
    return {**fields, "verdict": verdict_of(m, rebuilt), "images_leaked": images_leaked(m)}


def _std(vals: Sequence[float]) -> float | None:
    if len(vals) < 2:
        return None
    mu = sum(vals) / len(vals)
    return math.sqrt(sum((v - mu) ** 2 for v in vals) / (len(vals) - 1))


def spread(values: Iterable[Any], name: str) -> dict[str, Any]:
    """``name``_mean, _std (n - 1; None below 2 values), _min, _max over the values that are finite."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return {f"{name}_mean": sum(vals) / len(vals) if vals else None, f"{name}_std": _std(vals),
            f"{name}_min": min(vals, default=None), f"{name}_max": max(vals, default=None)}


def summary_columns(by: Sequence[str], values: Sequence[str] = ("psnr",), images: bool = False) -> list[str]:
    cols = list(by) + ["samples"] + (["images"] if images else [])
    for v in values:
        cols += [f"{v}_mean", f"{v}_std", f"{v}_min", f"{v}_max", f"{v}_mean_converged"]
    return cols + ["non_converged", "leaked", "inconclusive", "defended"]


def summarize(rows: Sequence[dict[str, Any]], by: Sequence[str], values: Sequence[str] = ("psnr",),
              sample_key: str = "sample", images: bool = False) -> list[dict[str, Any]]:
    """One summary row per value of ``by`` (in the rows' order): the number of samples (distinct
    ``sample_key``; ``images``: also the rows), each value's mean, std, min, max over all rows and
    its mean over the rows whose attack converged, the samples that did not converge, and the
    count of each verdict. Every row counts (nothing dropped); see MEANS_NOTE."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in by), []).append(r)
    out = []
    for key, sel in groups.items():
        samples = {r.get(sample_key): r.get("converged") for r in sel}
        s: dict[str, Any] = {**dict(zip(by, key, strict=True)), "samples": len(samples)}
        if images:
            s["images"] = len(sel)
        for v in values:
            s.update(spread([r.get(v) for r in sel], v))
            s[f"{v}_mean_converged"] = spread([r.get(v) for r in sel if r.get("converged") is True], v)[f"{v}_mean"]
        s["non_converged"] = sum(c is False for c in samples.values())
        s["leaked"] = sum(r.get("verdict") == LEAKED for r in sel)
        s["inconclusive"] = sum(r.get("verdict") == INCONCLUSIVE for r in sel)
        s["defended"] = sum(r.get("verdict") == DEFENDED for r in sel)
        out.append(s)
    return out


def convergence_notes(cells: Iterable[CellResult]) -> list[str]:
    """Say how many finished cells (samples attacked) did not converge, and how many recorded no
    verdict at all."""
    verdicts = [converged_of(c.metrics) for c in cells if c.ok]
    n, failed, unknown = len(verdicts), sum(v is False for v in verdicts), sum(v is None for v in verdicts)
    notes = []
    if failed:
        notes.append(f"{failed} of {n} attacked samples did NOT converge (attacks/verdict.py): their rows are "
                     "'inconclusive' unless the data was rebuilt anyway; they are not evidence of protection.")
    if unknown:
        notes.append(f"{unknown} of {n} attacked samples recorded no convergence verdict (cells computed before "
                     "the verdict existed, or an attack that records none): counted as inconclusive unless rebuilt.")
    if n and not failed and not unknown:
        notes.append(f"All {n} attacked samples converged (attacks/verdict.py).")
    return notes


def _share(summary_row: dict[str, Any], verdict: str) -> str:
    """A verdict's count over what it counts: the rows (images, where a sample is a batch of them;
    summarize's ``images``), else the samples."""
    if "images" in summary_row:
        return f"{summary_row[verdict]}/{summary_row['images']} images"
    return f"{summary_row[verdict]}/{summary_row['samples']}"


def trend_notes(summary: Sequence[dict[str, Any]], x: str, *, falls: bool, claim: str,
                within: Sequence[str] = (), value: str = "psnr", unit: str = "dB") -> list[str]:
    """Flag each pair of neighbouring settings (ordered by ``x``, within each group of ``within``)
    where the mean of ``value`` moves against the trend the experiment states (``falls``: it should
    fall as x grows), with the numbers: means over all samples and over the converged ones, their
    spread and how many samples were inconclusive."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for s in summary:
        groups.setdefault(tuple(s[k] for k in within), []).append(s)
    notes = []
    for key, sel in groups.items():
        sel = sorted(sel, key=lambda s: s[x])
        where = ", ".join(f"{k} {v}" for k, v in zip(within, key, strict=True))
        for a, b in zip(sel, sel[1:], strict=False):
            va, vb = a[f"{value}_mean"], b[f"{value}_mean"]
            if va is None or vb is None or (vb < va if falls else vb > va) or vb == va:
                continue
            notes.append(
                f"CONTRADICTS the stated trend ({claim}){' for ' + where if where else ''}: {x} {a[x]} -> {b[x]}, "
                f"mean {value} {_num(va)} -> {_num(vb)} {unit} ({'rises' if vb > va else 'falls'} by "
                f"{_num(abs(vb - va))}; std {_num(a[f'{value}_std'])} / {_num(b[f'{value}_std'])}; range "
                f"{_num(a[f'{value}_min'])}..{_num(a[f'{value}_max'])} / {_num(b[f'{value}_min'])}.."
                f"{_num(b[f'{value}_max'])}; mean over converged samples {_num(a[f'{value}_mean_converged'])} / "
                f"{_num(b[f'{value}_mean_converged'])}; inconclusive {_share(a, 'inconclusive')} / "
                f"{_share(b, 'inconclusive')}).")
    if not notes and summary:
        notes.append(f"No neighbouring settings contradict the stated trend ({claim}) in the mean {value} over all "
                     "samples.")
    return notes


def _num(v: Any) -> str:
    return "n/a" if v is None else f"{float(v):.2f}"
