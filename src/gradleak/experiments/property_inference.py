"""DLG rebuttal Table 2: the AUC of inferring a property of a client's batch from its update with
Melis et al.'s property-inference classifier, against the same property read from DLG's
reconstructions."""

from __future__ import annotations

import io
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data import Batch, FashionMNISTSource, batch_of, open_source
from ..errors import ConfigError, DataError
from ..fl import fedsgd
from ..models import ModelSpec, build_model
from ..paths import one_line
from .base import ExperimentOptions, ExperimentResult, experiment
from .property_data import QUANTILE, Brightness, class_thresholds, has_property, intensity_table, plan_batches
from .property_stats import BOOTSTRAP, C_GRID, CV_FOLDS, auc, bootstrap_aucs, fit_classifier, interval, predict, require_sklearn
from .cells import CellResult, Workspace
from .common import (VERDICT_RULE, LBFGS_INIT, THRESHOLD_DB, BATCH_VERDICT_COLUMNS, PAIRING_COLUMNS, pairing_fields, Setting, convergence_notes, lbfgs_cell,
                     setting, verdict_fields)

NAME = "property-inference"
BATCH_SIZE = 2             # K: DLG still rebuilds a batch of 2 (45-75 dB at 28 px, 300 iterations)
TARGETS = (4, 40)          # target batches (smoke, full), half of them with the property
AUX = (100, 400)           # auxiliary updates the classifier is trained on (smoke, full)
ITERATIONS = (60, 300)     # DLG L-BFGS iterations (smoke, full)
MAX_AUX = 10_000           # each auxiliary update is a feature vector of the whole gradient
FIGURE_TARGETS = 4         # targets shown in reconstructions.png (half with the property)
# The rebuttal's Table 2 (LFW): property -> (property inference [Melis et al.], DLG).
REBUTTAL = {"Eyeglasses": (0.94, 1.00), "Asian": (0.92, 1.00)}
# Summary rows: the scorer's check, the property classifier, the attack (its name in the table)
METHODS = ("truth", "classifier", "attack", "attack (converged)")
COLUMNS = ["target", "property", "bright_images", "labels", "images", "truth_score", "classifier_score",
           "dlg_score", "labels_restored", "psnr_by_label", "psnr", *PAIRING_COLUMNS[1:], "ssim", "label_accuracy",
           "recovered", *BATCH_VERDICT_COLUMNS,
           "iterations", "wall_seconds", "seed", "attack_status"]
SUMMARY_COLUMNS = ["method", "targets", "with_property", "auc", "auc_ci_low", "auc_ci_high", "accuracy",
                   "psnr_mean", "psnr_min", "non_converged", "leaked", "inconclusive", "defended"]


# --------------------------------------------------------------------------- the property
def update_features(spec: ModelSpec, batch: Batch) -> tuple[np.ndarray, float]:
    """The FedSGD update of ``batch`` (what the client shares) as one flat feature vector (every
    layer's gradient, float32), and the update's loss (to check it is the update DLG attacked)."""
    update = fedsgd(spec, batch)
    flat = torch.cat([g.detach().flatten().float().cpu() for g in update.gradients.values()])
    return flat.numpy(), float(update.meta.loss)



# --------------------------------------------------------------------------- the experiment
@dataclass
class Target:
    index: int
    indices: list[int]
    prop: bool
    batch: Batch
    features: np.ndarray
    loss: float


def _sizes(opt: ExperimentOptions, st: Setting) -> tuple[int, int, int]:
    """(K, target batches, auxiliary updates) from the options, checked."""
    if len(opt.attacks or []) > 1 or st.attack not in ("dlg", "idlg"):
        raise ConfigError(f"{NAME} runs one attack of the DLG family: --attacks dlg (the rebuttal's) or idlg")
    if opt.batch_sizes is not None and len(opt.batch_sizes) != 1:
        raise ConfigError(f"{NAME} runs one batch size K: --batch-sizes K (default {BATCH_SIZE})")
    k = opt.batch_sizes[0] if opt.batch_sizes else BATCH_SIZE
    n_targets, n_aux = st.samples, opt.batches or AUX[0 if opt.smoke else 1]
    if n_targets < 2:
        raise ConfigError(f"{NAME} needs at least 2 target batches (--samples), one with the property and one "
                          "without, for an AUC")
    if not 2 <= n_aux <= MAX_AUX:
        raise ConfigError(f"{NAME} trains the classifier on 2..{MAX_AUX} auxiliary updates (--batches), "
                          f"got {n_aux}")
    return k, n_targets, n_aux


def _native_size(st: Setting, train: FashionMNISTSource, k: int) -> int:
    """The images' native side; K distinct labels must exist."""
    if k > train.num_classes:
        raise ConfigError(f"--batch-sizes {k}: a batch holds distinct labels and {st.data} has "
                          f"{train.num_classes} classes")
    size = int(train.native_size)
    if size <= 0:
        raise DataError(f"{st.data} images are not square; the property is read on native pixels")
    return size


@dataclass
class _Property:
    """The property, fixed on the train split, and which images of each split have it."""

    thresholds: np.ndarray
    labels_tr: np.ndarray
    bright_tr: np.ndarray
    labels_te: np.ndarray
    bright_te: np.ndarray

    @classmethod
    def of(cls, train: FashionMNISTSource, test: FashionMNISTSource) -> _Property:
        values_tr, labels_tr = intensity_table(train)
        values_te, labels_te = intensity_table(test)
        thresholds = class_thresholds(values_tr, labels_tr, train.num_classes)
        return cls(thresholds, labels_tr, has_property(values_tr, labels_tr, thresholds),
                   labels_te, has_property(values_te, labels_te, thresholds))

    def rates(self, num_classes: int) -> tuple[list[float], list[float]]:
        """The property's rate per class on the train and the test split."""
        return ([float(self.bright_tr[self.labels_tr == c].mean()) for c in range(num_classes)],
                [float(self.bright_te[self.labels_te == c].mean()) for c in range(num_classes)])


@dataclass
class _Classifier:
    """Melis et al.'s property classifier, trained on the auxiliary updates, and its target batches."""

    targets: list[Target]
    p_targets: np.ndarray   # P(property) of each target update
    features: int           # values per update
    with_property: int      # auxiliary updates with the property
    c: Any                  # the cross-validated inverse L2 strength
    cv_auc: Any
    seconds: float


def _train_classifier(opt: ExperimentOptions, st: Setting, train: FashionMNISTSource, test: FashionMNISTSource,
                      prop: _Property, k: int, n_targets: int, n_aux: int, size: int) -> _Classifier:
    """The global model the clients share with (the pipeline builds the same for each cell) and the
    updates: targets (test split) and the attacker's auxiliary batches (train split), on which the
    classifier is trained."""
    start = time.perf_counter()
    spec = build_model(st.model, num_classes=train.num_classes, channels=train.native_channels, image_size=size,
                       seed=0, width=st.width)
    targets = []
    where = one_line(st.data, 120)
    planned = plan_batches(prop.labels_te, prop.bright_te, k, n_targets, opt.seed, 0, f"the test split of {where}")
    for t, (ids, has) in enumerate(planned):
        batch = batch_of(test, ids, size, train.native_channels)
        feats, loss = update_features(spec, batch)
        targets.append(Target(t, ids, has, batch, feats, loss))
    aux = plan_batches(prop.labels_tr, prop.bright_tr, k, n_aux, opt.seed, 1, f"the train split of {where}")
    x_aux = np.stack([update_features(spec, batch_of(train, ids, size, train.native_channels))[0] for ids, _ in aux])
    y_aux = np.asarray([has for _, has in aux], dtype=bool)
    classifier = fit_classifier(x_aux, y_aux, opt.seed)
    p_targets = predict(classifier, np.stack([t.features for t in targets]))
    chosen_c = getattr(classifier, "best_params_", {}).get("logisticregression__C", 1.0)
    cv_auc = getattr(classifier, "best_score_", None)
    classifier_seconds = time.perf_counter() - start
    if opt.progress:
        print(f"{NAME}: classifier trained on {n_aux} auxiliary updates ({x_aux.shape[1]} features) in "
              f"{classifier_seconds:.0f} s; attacking {n_targets} target updates with {st.attack}",
              file=sys.stderr, flush=True)
    return _Classifier(targets, p_targets, x_aux.shape[1], int(y_aux.sum()), chosen_c, cv_auc, classifier_seconds)


def _notes(opt: ExperimentOptions, st: Setting, rows: list[dict[str, Any]], summary: list[dict[str, Any]],
           boot: dict[str, np.ndarray], cells: dict[tuple[str, int], CellResult], losses: list[tuple[float, Any]],
           rates: tuple[list[float], list[float]], sizes: tuple[int, int, int, int]) -> list[str]:
    """The comparison, where this setting differs from the rebuttal's, the attack's errors and
    convergence, the update check and the property's rates; ``sizes``: (K, px, targets, aux)."""
    k, size, n_targets, n_aux = sizes
    rates_tr, rates_te = rates
    return (_comparison_notes(summary, boot, st.attack, len(rows))
            + [f"Where this differs from the rebuttal's setting: Fashion-MNIST instead of LFW (not available "
               f"offline); the property is a pixel statistic (brightest quartile of the class) instead of a "
               f"semantic attribute (Eyeglasses, Asian), so a rebuilt batch gives it away exactly by the rule "
               f"that defines it (no attribute detector on the reconstruction): {st.attack}'s AUC here measures "
               f"whether it rebuilds the batch; the model is an untrained {st.model} at {size} px (the rebuttal names "
               f"its data, LFW, not its model); K = {k}; the classifier sees one client's single FedSGD update of a fixed model "
               "(Melis et al.: aggregated updates over a joint training)."]
            + _error_notes(rows, st.attack)
            + convergence_notes(c for c in cells.values())
            + [_update_check(losses)]
            + [f"Property rate per class (train split, which set the thresholds): "
               f"{', '.join(f'{r:.3f}' for r in rates_tr)}; test split: {', '.join(f'{r:.3f}' for r in rates_te)}. "
               "The property is a within-class quartile, so the label says nothing about it."]
            + ([f"Smoke setting: {n_targets} targets, {n_aux} auxiliary updates, {st.iterations} DLG iterations; the "
                "AUCs of so few targets are coarse (steps of 1/(positives x negatives))."] if opt.smoke else []))


def _setup(opt: ExperimentOptions, st: Setting, prop: _Property, clf: _Classifier, y: np.ndarray,
           sizes: tuple[int, int, int, int]) -> dict[str, Any]:
    """The setup table; ``sizes``: (K, px, targets, aux)."""
    k, size, n_targets, n_aux = sizes
    how = "images + soft labels" if st.attack == "dlg" else "labels restored from the update, then the images"
    return {"data": f"{st.data} (native {size} px, no resampling): target batches from the test split (held out), "
                    "auxiliary batches from the train split; LFW (the rebuttal's) is not available offline",
            "property": f"the batch holds an image in the brightest quartile of its own class: mean intensity "
                        f"of its 8-bit pixels > the class's {QUANTILE:g}th percentile on the train split "
                        f"(thresholds per class: {', '.join(f'{v:.4f}' for v in prop.thresholds)}); ~25 % of the "
                        "images of every class, independent of the label (the rebuttal: Eyeglasses, Asian on LFW)",
            "model": f"{st.model}{f' width {st.width}' if st.width else ''} (random init, model seed 0, untrained: "
                     "the global model the client receives)",
            "client": f"FedSGD: the gradient of the mean cross-entropy of a batch of K = {k} images with "
                      "distinct labels (gradleak.fl.fedsgd)",
            "batch size": k,
            "samples": f"{n_targets} target batches ({int(y.sum())} with the property, {int((~y).sum())} without); "
                       "batch i has the property iff i is odd",
            "classifier": f"Melis et al.'s passive property inference: standardised features = the whole "
                          f"update ({clf.features} values, every layer's gradient), scikit-learn "
                          f"LogisticRegression (L2, lbfgs; C from {list(C_GRID)} by {CV_FOLDS}-fold cross-validated "
                          f"AUC on the auxiliary updates), trained on {n_aux} auxiliary updates "
                          f"({clf.with_property} with the property) from the train split; score = P(property)",
            "attack": f"{st.attack} ({how}; float64 L-BFGS, {st.iterations} iterations, start {LBFGS_INIT}) on "
                      "each target update, one sweep cell per target",
            "dlg score": "max over the reconstructed images of (mean intensity of its 8-bit pixels - the "
                         "threshold of the class the attack restored for it); > 0 reads 'has the property'",
            "truth score": "the same score on the true images and labels (> 0 exactly when the batch has the "
                           "property: AUC 1 by construction, a check of the scorer)",
            "auc": f"sklearn roc_auc_score over the target batches; 95 % interval: {BOOTSTRAP} paired bootstrap "
                   "resamples of the targets (percentiles 2.5, 97.5)",
            "accuracy": "classifier: P > 0.5; dlg and truth: score > 0",
            "seeds": f"{opt.seed}: target batch i from numpy stream ({opt.seed}, 0, i), auxiliary batch i from "
                     f"({opt.seed}, 1, i); the attack's start seed {opt.seed} + i",
            "success threshold": f"PSNR >= {THRESHOLD_DB} dB (mean over the batch) or a recognisable image: "
                                 f"leaked; {VERDICT_RULE}",
            "rebuttal": "; ".join(f"{p}: property inference {a:.2f}, DLG {b:.2f}" for p, (a, b) in REBUTTAL.items())
                        + " (AUC on LFW)",
            "classifier C": clf.c,
            "classifier cross-validated auc": clf.cv_auc,
            "classifier seconds": round(clf.seconds, 1),
            "smoke": opt.smoke}


SPEC = {
    "name": "property-inference",
    "summary": ("property inference from the update (Melis et al.'s classifier) vs the property read from DLG's "
                "reconstructions: AUC (rebuttal Table 2)"),
}


@experiment(NAME)
def property_inference(opt: ExperimentOptions, ws: Workspace) -> ExperimentResult:
    st = setting(opt, model="lenet-dlg", data="fashion-mnist", attack="dlg", samples=TARGETS,
                 iterations=ITERATIONS)
    k, n_targets, n_aux = _sizes(opt, st)
    require_sklearn()  # before any work: a missing scikit-learn is one line
    train, test = _splits(st.data)
    size = _native_size(st, train, k)
    prop = _Property.of(train, test)
    clf = _train_classifier(opt, st, train, test, prop, k, n_targets, n_aux, size)

    plan = {(st.attack, t.index): lbfgs_cell(st, opt.seed + t.index, log_points=10, split="test", batch_size=k,
                                             indices=t.indices, image_size=size)
            for t in clf.targets}
    cells = ws.run(plan, run_folders=list(plan))
    brightness = Brightness(prop.thresholds)
    rows, losses = [], []
    for t, p in zip(clf.targets, clf.p_targets, strict=True):
        cell = cells[(st.attack, t.index)]
        rows.append(_row(t, float(p), cell, brightness, opt.seed))
        if cell.ok:
            losses.append((t.loss, (cell.metrics.get("update") or {}).get("loss")))

    y = np.asarray([r["property"] for r in rows], dtype=bool)
    summary, boot = _summary(rows, y, opt.seed, st.attack)
    figures = ["roc.png"]
    _roc_figure(ws.out / figures[0], rows, summary, st.attack, k, st.data)
    if _reconstruction_figure(ws.out / "reconstructions.png", rows, cells, st.attack, brightness):
        figures.append("reconstructions.png")
    sizes = (k, size, n_targets, n_aux)
    notes = _notes(opt, st, rows, summary, boot, cells, losses, prop.rates(train.num_classes), sizes)
    return ExperimentResult(
        name=NAME, title="Property inference: Melis et al.'s classifier vs DLG's reconstructions (rebuttal Table 2)",
        columns=COLUMNS, rows=rows, figures=figures, summary=summary, summary_columns=SUMMARY_COLUMNS, notes=notes,
        setup=_setup(opt, st, prop, clf, y, sizes))


def _splits(data: str) -> tuple[FashionMNISTSource, FashionMNISTSource]:
    """The train and test splits of an IDX (Fashion-MNIST) source: the property needs thousands of
    images per class (its thresholds) and a held-out split (the targets)."""
    sources = []
    for split in ("train", "test"):
        try:
            source = open_source(data, split=split)
        except ConfigError:
            source = None
        if not isinstance(source, FashionMNISTSource):
            raise ConfigError(f"{NAME} needs a data source with train and test splits (fashion-mnist or a folder "
                              f"of Fashion-MNIST IDX files), not {data}")
        sources.append(source)
    return sources[0], sources[1]


def _row(t: Target, p: float, cell: CellResult, prop: Brightness, seed: int) -> dict[str, Any]:
    labels = [int(v) for v in t.batch.labels]
    truth_scores = prop.scores(t.batch.images, labels)
    row: dict[str, Any] = {"target": t.index, "property": t.prop, "bright_images": int((truth_scores > 0).sum()),
                           "labels": " ".join(map(str, labels)), "images": " ".join(t.batch.names),
                           "truth_score": float(truth_scores.max()), "classifier_score": p, "dlg_score": None,
                           "labels_restored": "", "psnr": None, "ssim": None, "label_accuracy": None,
                           "recovered": None, "converged": None, "verdict": "inconclusive",
                           "relative_gradient_distance": None, "iterations": None, "wall_seconds": None,
                           "seed": seed + t.index, "attack_status": cell.status}
    if not cell.ok:
        return row
    m = cell.metrics
    rec = cell.tensors()
    restored = [int(v) for v in rec["labels"].flatten()]
    recovered = m["psnr_mean"] >= THRESHOLD_DB
    row.update({"dlg_score": prop.score(rec["images"], restored), "labels_restored": " ".join(map(str, restored)),
                "psnr": m["psnr_mean"], "ssim": m["ssim_mean"], "label_accuracy": m["label_accuracy"], **pairing_fields(cell),
                "recovered": recovered, **verdict_fields(cell, recovered), "iterations": m["iterations"],
                "wall_seconds": round(float(m["wall_seconds"]), 2)})
    return row


def _scores(rows: list[dict[str, Any]], method: str) -> tuple[list[dict[str, Any]], np.ndarray]:
    """The rows a method (METHODS) scored and its scores: every target for the truth and the
    classifier; for the attack, the targets whose cell finished ("attack (converged)": and whose
    attack converged by its own verdict, which needs no ground truth)."""
    if method in ("truth", "classifier"):
        sel = rows
    elif method == "attack":
        sel = [r for r in rows if r["dlg_score"] is not None]
    else:
        sel = [r for r in rows if r["dlg_score"] is not None and r["converged"] is True]
    key = {"truth": "truth_score", "classifier": "classifier_score"}.get(method, "dlg_score")
    return sel, np.asarray([r[key] for r in sel], dtype=np.float64)


def _summary(rows: list[dict[str, Any]], y: np.ndarray, seed: int,
             attack: str) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """One row per method (METHODS; "attack" shown by its name): AUC, its 95 % bootstrap interval,
    accuracy at the natural cut, and for the attack its PSNR and verdicts. Also the bootstrap AUCs
    (paired over the targets, when every method scored all of them; else empty)."""
    # paired bootstrap over the targets every method scored (a failed cell leaves dlg without one)
    scored = [i for i, r in enumerate(rows) if r["dlg_score"] is not None]
    boot = (bootstrap_aucs(y[scored], {m: _scores([rows[i] for i in scored], m)[1] for m in METHODS[:3]}, seed)
            if scored else {})
    out = []
    for method in METHODS:
        sel, s = _scores(rows, method)
        ys = np.asarray([r["property"] for r in sel], dtype=bool)
        value = auc(ys, s)
        if method in boot and len(scored) == len(rows):
            lo, hi = interval(boot[method])
        else:  # the methods scored different targets: each its own (unpaired) resamples
            lo, hi = interval(bootstrap_aucs(ys, {method: s}, seed)[method]) if value is not None else (None, None)
        cut = 0.5 if method == "classifier" else 0.0
        row = {"method": method.replace("attack", attack), "key": method, "targets": len(sel),
               "with_property": int(ys.sum()), "auc": value, "auc_ci_low": lo, "auc_ci_high": hi,
               "accuracy": float(((s > cut) == ys).mean()) if len(sel) else None}
        if method.startswith("attack"):  # the attack's quality; blank for the others
            psnrs = [r["psnr"] for r in sel]
            row.update({"psnr_mean": float(np.mean(psnrs)) if psnrs else None,
                        "psnr_min": float(np.min(psnrs)) if psnrs else None,
                        "non_converged": sum(r["converged"] is False for r in sel),
                        "leaked": sum(r["verdict"] == "leaked" for r in sel),
                        "defended": sum(r["verdict"] == "defended" for r in sel),
                        "inconclusive": sum(r["verdict"] == "inconclusive" for r in sel)})
        out.append(row)
    return out, boot if len(scored) == len(rows) else {}


def _num(v: Any, digits: int = 3) -> str:
    return "n/a" if v is None else f"{float(v):.{digits}f}"


def _comparison_notes(summary: list[dict[str, Any]], boot: dict[str, np.ndarray], attack: str, n: int) -> list[str]:
    by = {s["key"]: s for s in summary}
    c, d, t = by["classifier"], by["attack"], by["truth"]
    notes = [f"Rebuttal Table 2 (LFW): property inference [Melis et al.] AUC 0.94 (Eyeglasses) and 0.92 (Asian), "
             f"DLG 1.00 for both. Here (Fashion-MNIST, brightest quartile of the class, {n} target batches): "
             f"property classifier {_num(c['auc'])} (95 % {_num(c['auc_ci_low'])}..{_num(c['auc_ci_high'])}), "
             f"{attack} {_num(d['auc'])} (95 % {_num(d['auc_ci_low'])}..{_num(d['auc_ci_high'])}) over "
             f"{d['targets']} targets, ground truth {_num(t['auc'])} (the scorer's check)."]
    if t["auc"] != 1.0:
        notes.append(f"SCORER CHECK FAILED: the property read from the true images has AUC {_num(t['auc'])}, not 1.")
    if c["auc"] is None or d["auc"] is None:
        return notes + ["An AUC is missing (a method scored targets of one class only)."]
    if d["auc"] >= c["auc"]:
        notes.append(f"Agrees with the rebuttal's ordering: reading the property from {attack}'s reconstructions "
                     f"({_num(d['auc'])}) is at least as good as the property classifier ({_num(c['auc'])})"
                     + (", and perfect, as the rebuttal's 1.00." if d["auc"] == 1.0 else
                        "; it is not perfect (the rebuttal: 1.00): see the misread targets below."))
    else:
        notes.append(f"CONTRADICTS the rebuttal's claim (DLG better than property inference): {attack} "
                     f"{_num(d['auc'])} < classifier {_num(c['auc'])}.")
    if "attack" in boot and "classifier" in boot and boot["attack"].size:
        diff = boot["attack"] - boot["classifier"]
        lo, hi = np.percentile(diff, [2.5, 97.5])
        notes.append(f"Paired bootstrap of the difference ({attack} - classifier): {_num(d['auc'] - c['auc'])}, 95 % "
                     f"{_num(lo)}..{_num(hi)} ({diff.size} resamples with both classes)"
                     + ("; the interval excludes 0." if lo > 0 or hi < 0 else "; the interval includes 0: the "
                        "targets do not separate the two methods."))
    return notes


def _error_notes(rows: list[dict[str, Any]], attack: str) -> list[str]:
    """The targets DLG's reading gets wrong (score > 0 vs the property), with their PSNR: whether
    its errors come from images it did not rebuild or from images near the threshold."""
    wrong = [r for r in rows if r["dlg_score"] is not None and (r["dlg_score"] > 0) != r["property"]]
    failed = [r for r in rows if r["dlg_score"] is None]
    notes = []
    if wrong:
        notes.append(f"{attack} misreads {len(wrong)} target(s) (score > 0 vs the property): "
                     + "; ".join(f"target {r['target']} (property {r['property']}, truth score {r['truth_score']:+.4f}, "
                                 f"{attack} score {r['dlg_score']:+.4f}, restored labels {r['labels_restored']} vs "
                                 f"{r['labels']}, PSNR {_num(r['psnr'], 1)} dB, {r['verdict']})" for r in wrong) + ".")
    else:
        scored = [r for r in rows if r["dlg_score"] is not None]
        notes.append(f"{attack}'s reading is right on all {len(scored)} targets it scored (score > 0 exactly when the "
                     "batch has the property).")
    leaked = [r for r in rows if r["verdict"] == "leaked"]
    if leaked:
        notes.append(f"{len(leaked)} of {len(rows)} targets were rebuilt (PSNR >= {THRESHOLD_DB:g} dB; PSNR "
                     f"{min(r['psnr'] for r in leaked):.1f}..{max(r['psnr'] for r in leaked):.1f} dB).")
    if failed:
        notes.append(f"{len(failed)} target(s) have no {attack} reading (their cell failed): {attack}'s AUC is over "
                     "the others; the rows are kept.")
    return notes


def _update_check(losses: list[tuple[float, Any]]) -> str:
    """The classifier's target updates are computed in this process; the attacked ones by the
    cells. Their losses must agree (the same batch, model and client code)."""
    diffs = [abs(a - float(b)) / max(abs(a), 1e-12) for a, b in losses if b is not None]
    if not diffs:
        return "No attacked update recorded its loss: the classifier's and DLG's updates were not compared."
    worst = max(diffs)
    if worst > 1e-5:
        return (f"MISMATCH: the update the classifier scored and the one the attack received differ (loss relative "
                f"difference up to {worst:.2e}).")
    return (f"The classifier scored the very updates the attack received ({len(diffs)} targets: the client's loss "
            f"agrees to {worst:.1e} relative).")


# --------------------------------------------------------------------------- figures
def _roc_figure(path: Path, rows: list[dict[str, Any]], summary: list[dict[str, Any]], attack: str, k: int,
                data: str) -> None:
    """Three panels: the ROC curves, the classifier's scores, the property read from the reconstructions."""
    from matplotlib.figure import Figure

    from ..paths import atomic_write_bytes

    fig = Figure(figsize=(13.5, 4.2), dpi=100, facecolor="white", layout="constrained")
    ax_roc, ax_clf, ax_dlg = fig.subplots(1, 3)
    _roc_panel(ax_roc, rows, {s["key"]: s for s in summary}, attack, k, data)
    _classifier_panel(ax_clf, rows)
    _attack_panel(ax_dlg, rows, attack)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    atomic_write_bytes(path, buf.getvalue())


def _roc_panel(ax_roc: Any, rows: list[dict[str, Any]], by: dict[str, dict[str, Any]], attack: str, k: int,
               data: str) -> None:
    """ROC of the ground truth, the property classifier and the attack's reconstructions, with AUCs."""
    from sklearn.metrics import roc_curve

    styles = {"truth": ("ground truth", "#555555", ":"), "classifier": ("property classifier (Melis)", "#1f77b4", "-"),
              "attack": (f"{attack} reconstructions", "#d62728", "-")}
    for method, (label, color, ls) in styles.items():
        sel, s = _scores(rows, method)
        ys = np.asarray([r["property"] for r in sel], dtype=bool)
        if ys.all() or not ys.any():
            continue
        fpr, tpr, _ = roc_curve(ys, s)
        ax_roc.plot(fpr, tpr, color=color, ls=ls, lw=1.8, label=f"{label}: AUC {_num(by[method]['auc'])}",
                    zorder=3 if method == "truth" else 2)  # the dotted truth stays visible on a perfect curve
    ax_roc.plot([0, 1], [0, 1], color="#bbbbbb", lw=0.8)
    ax_roc.set_xlabel("false positive rate")
    ax_roc.set_ylabel("true positive rate")
    ax_roc.set_title(f"ROC, {len(rows)} target batches of K={k} ({data})", fontsize=10)
    ax_roc.legend(loc="lower right", fontsize=8)
    ax_roc.grid(True, alpha=0.3)


def _classifier_panel(ax_clf: Any, rows: list[dict[str, Any]]) -> None:
    """The classifier's P(property) on the target updates without and with the property."""
    rng = np.random.default_rng(0)  # horizontal jitter only
    for x, has in ((0, False), (1, True)):
        vals = [r["classifier_score"] for r in rows if r["property"] == has]
        ax_clf.scatter(x + rng.uniform(-0.15, 0.15, len(vals)), vals, s=18, color="#1f77b4", alpha=0.8)
    ax_clf.axhline(0.5, color="#888888", lw=0.8, ls="--")
    ax_clf.set_xticks([0, 1], ["without", "with"])
    ax_clf.set_xlim(-0.5, 1.5)
    ax_clf.set_xlabel("target batch: the property")
    ax_clf.set_ylabel("classifier P(property)")
    ax_clf.set_title("Property classifier on the target updates", fontsize=10)
    ax_clf.grid(True, alpha=0.3)


def _attack_panel(ax_dlg: Any, rows: list[dict[str, Any]], attack: str) -> None:
    """The property score of each reconstruction against that of its true images, by verdict."""
    from matplotlib.ticker import MaxNLocator

    colors = {"leaked": "#d62728", "defended": "#2ca02c", "inconclusive": "#7f7f7f"}
    for verdict, color in colors.items():
        sel = [r for r in rows if r["dlg_score"] is not None and r["verdict"] == verdict]
        if sel:
            ax_dlg.scatter([r["truth_score"] for r in sel], [r["dlg_score"] for r in sel], s=18, color=color,
                           label=f"{verdict} ({len(sel)})")
    scored = [r for r in rows if r["dlg_score"] is not None]
    if scored:
        lo = min(min(r["truth_score"] for r in scored), min(r["dlg_score"] for r in scored))
        hi = max(max(r["truth_score"] for r in scored), max(r["dlg_score"] for r in scored))
        ax_dlg.plot([lo, hi], [lo, hi], color="#bbbbbb", lw=0.8)
        ax_dlg.legend(loc="upper left", fontsize=8)
    ax_dlg.axhline(0, color="#888888", lw=0.8, ls="--")
    ax_dlg.axvline(0, color="#888888", lw=0.8, ls="--")
    ax_dlg.xaxis.set_major_locator(MaxNLocator(5))
    ax_dlg.set_xlabel("score of the true images (> 0: property)")
    ax_dlg.set_ylabel(f"score of the {attack} reconstruction")
    ax_dlg.set_title(f"Property read from {attack}'s reconstructions", fontsize=10)
    ax_dlg.grid(True, alpha=0.3)


def _reconstruction_figure(path: Path, rows: list[dict[str, Any]], cells: dict[tuple[str, int], CellResult],
                           attack: str, prop: Brightness) -> bool:
    """The true images of a few targets (half with the property) above the attack's
    reconstructions paired with them; each captioned with its image score (> 0: the image has
    the property), the reconstruction's read with the class the attack restored."""
    from ..metrics import match
    from ..report import save_image_grid

    shown = ([r for r in rows if r["property"] and r["dlg_score"] is not None][:FIGURE_TARGETS // 2]
             + [r for r in rows if not r["property"] and r["dlg_score"] is not None][:FIGURE_TARGETS // 2])
    if not shown:
        return False
    originals, rebuilt, caps_o, caps_r = [], [], [], []
    for r in sorted(shown, key=lambda r: r["target"]):
        cell = cells[(attack, r["target"])]
        truth, rec = cell.truth(), cell.tensors()
        images = torch.nan_to_num(rec["images"].float(), nan=0.0).clamp(0.0, 1.0)
        perm = match(images, truth.images.float())
        labels = [int(v) for v in rec["labels"].flatten()[perm]]
        true_labels = [int(v) for v in truth.labels]
        originals.append(truth.images)
        rebuilt.append(images[perm])
        caps_o += [f"t{r['target']} {'with' if r['property'] else 'without'}\nlabel {y}, {s:+.3f}"
                   for y, s in zip(true_labels, prop.scores(truth.images, true_labels), strict=True)]
        caps_r += [f"t{r['target']} {r['psnr']:.0f} dB\nlabel {y}, {s:+.3f}"
                   for y, s in zip(labels, prop.scores(images[perm], labels), strict=True)]
    save_image_grid(path, [torch.cat(originals), torch.cat(rebuilt)],
                    ["true images: target, property of the batch; label, image score (> 0: brightest quartile)",
                     f"{attack} reconstructions (paired): target, batch PSNR; restored label, image score"],
                    [caps_o, caps_r])
    return True
