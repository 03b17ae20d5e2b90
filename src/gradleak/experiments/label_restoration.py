"""GradInversion Table 1: batch label restoration accuracy vs batch size, Eq. 8 (minimum of the
FC-layer weight gradient over the feature dimension, "gradinversion") against iDLG's sum rule
extended to batches (Eq. 7, "sum"), on batches without repeated labels as in the paper."""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

import torch

from ..attacks.labels import restore_labels
from ..data import Batch, open_source, sample_batch
from ..errors import ConfigError, DataError
from ..fl import fedsgd
from ..metrics import label_accuracy
from ..models import ModelSpec, build_model, default_image_size
from ..report import save_line_plot
from .base import ExperimentOptions, ExperimentResult, experiment, markdown_table
from .cells import Workspace
from .common import spread

UNIQUE_METHODS = ("gradinversion", "sum")          # results.csv (the paper's Table 1)
MULTISET_METHODS = ("gradinversion", "sum", "counts")  # multiset.csv (beyond the paper)
MULTISET_COLUMNS = ["batch_size", "kind", "method", "accuracy", "batches"]
BATCH_COLUMNS = (["batch_size", "kind", "batch", "seed", "repeated_slots", "labels_true"]
                 + [f"{m}_{s}" for m in MULTISET_METHODS for s in ("accuracy", "labels")] + ["names"])
DEFAULT_MODEL = "efficientnet-lite0"
IMAGENET_SIZED = ("efficientnet-lite0", "resnet18", "resnet50")


def _default_data(model: str) -> str:
    # ImageNet-sized models get the ImageNet photos (1000 classes); small ones the CIFAR-100
    # photos (18 distinct classes among 20, so batches of 16 without repeats exist).
    return "imagenet-samples" if model in IMAGENET_SIZED else "cifar100-samples"


def repeat_batch(source: Any, k: int, seed: int, image_size: int, channels: int) -> tuple[Batch, int]:
    """A batch of ``k`` with repeated labels: ``k - r`` distinct-label photos, plus horizontally
    flipped copies of ``r`` of them (same class, different pixels), r drawn in 1..k//2 from
    ``seed``. Flipped copies stand in for other photos of the same class because the sample
    sources hold almost no same-class pairs (imagenet-samples: one). Returns (batch, r)."""
    gen = torch.Generator().manual_seed((10_007 * int(seed) + 3) % 2**64)  # torch takes seeds below 2**64
    r = int(torch.randint(1, k // 2 + 1, (1,), generator=gen))
    base = sample_batch(source, k - r, seed, image_size=image_size, channels=channels)
    pick = torch.randperm(k - r, generator=gen)[:r] if r <= k - r else torch.randint(0, k - r, (r,), generator=gen)
    images = torch.cat([base.images, base.images[pick].flip(-1)])
    labels = torch.cat([base.labels, base.labels[pick]])
    names = base.names + tuple(f"{base.names[int(i)]} (flipped)" for i in pick)
    return Batch(images=images, labels=labels, names=names, source=base.source,
                 class_names=base.class_names), r


def _refuse_attack_options(opt: ExperimentOptions) -> None:
    """It optimises nothing and runs no attack cells: options about attacks or cells would be ignored."""
    for name in ("attacks", "iterations", "samples", "executor", "workers", "retry_failed"):
        default = ExperimentOptions.model_fields[name].get_default(call_default_factory=True)
        if name in opt.model_fields_set and getattr(opt, name) != default:
            raise ConfigError(f"--{name.replace('_', '-')} does not apply to label-restoration (it runs no attack)")


class _Restoration:
    """Restores the labels of ``n_batches`` batches per batch size and kind from one real client
    gradient each, keeping every batch's row, the accuracies per (K, kind, method), the notes
    and the gradients' times."""

    def __init__(self, opt: ExperimentOptions, spec: ModelSpec, source: Any, size: int, channels: int, n_batches: int):
        self.opt, self.spec, self.source, self.size, self.channels = opt, spec, source, size, channels
        self.n_batches = n_batches
        self.per_batch: list[dict[str, Any]] = []
        self.acc: dict[tuple[int, str, str], list[float]] = {}
        self.notes: list[str] = []
        self.grad_seconds: list[float] = []

    def mean(self, key: tuple[int, str, str]) -> float | None:
        v = self.acc.get(key)
        return sum(v) / len(v) if v else None

    def batches(self, k: int, kind: str) -> None:
        """Every batch of size ``k`` and ``kind``; where the data holds no such batch, a note."""
        methods = UNIQUE_METHODS if kind == "distinct" else MULTISET_METHODS
        for b in range(self.n_batches):
            seed = self.opt.seed + b
            try:
                batch, r = self._draw(kind, k, seed)
            except DataError as exc:
                self.notes.append(f"batch size {k} ({kind}) skipped: {exc}")
                return
            row = self._restore(batch, k, kind, b, seed, r, methods)
            self.per_batch.append(row)
            if self.opt.progress:
                print(f"label-restoration: K={k} {kind} batch {b + 1}/{self.n_batches} "
                      + " ".join(f"{m}={row[f'{m}_accuracy']:.3f}" for m in methods), flush=True)

    def _draw(self, kind: str, k: int, seed: int) -> tuple[Batch, int]:
        """(batch, repeated slots): distinct labels as in the paper, or with repeats."""
        if kind == "distinct":
            return sample_batch(self.source, k, seed, image_size=self.size, channels=self.channels), 0
        return repeat_batch(self.source, k, seed, self.size, self.channels)

    def _restore(self, batch: Batch, k: int, kind: str, b: int, seed: int, r: int,
                 methods: tuple[str, ...]) -> dict[str, Any]:
        start = time.perf_counter()
        update = fedsgd(self.spec, batch)  # one real client gradient, no attack
        self.grad_seconds.append(time.perf_counter() - start)
        row: dict[str, Any] = {"batch_size": k, "kind": kind, "batch": b, "seed": seed, "repeated_slots": r,
                               "labels_true": " ".join(str(int(v)) for v in sorted(batch.labels.tolist())),
                               "names": "; ".join(batch.names)}
        for m in methods:
            restored = restore_labels(update, self.spec, k, m)
            a = label_accuracy(restored, batch.labels)
            self.acc.setdefault((k, kind, m), []).append(a)
            row[f"{m}_accuracy"] = a
            row[f"{m}_labels"] = " ".join(str(int(v)) for v in restored.tolist())
        return row

    def table_rows(self, batch_sizes: list[int], model_name: str, data: str) -> list[dict[str, Any]]:
        """results.csv: per batch size and unique-label method, on the distinct batches."""
        acc = self.acc
        return [{"batch_size": k, "method": m, "accuracy": self.mean((k, "distinct", m)),
                 "batches": len(acc.get((k, "distinct", m), [])), "labels": k * len(acc.get((k, "distinct", m), [])),
                 "exact_batches": sum(a == 1.0 for a in acc.get((k, "distinct", m), [])),
                 **_spread(acc.get((k, "distinct", m), [])), "model": model_name, "data": data}
                for k in batch_sizes for m in UNIQUE_METHODS if acc.get((k, "distinct", m))]

    def multiset_rows(self, batch_sizes: list[int]) -> list[dict[str, Any]]:
        """multiset.csv: per batch size and method, on the batches with repeated labels."""
        return [{"batch_size": k, "kind": "repeats", "method": m, "accuracy": self.mean((k, "repeats", m)),
                 "batches": len(self.acc.get((k, "repeats", m), []))}
                for k in batch_sizes for m in MULTISET_METHODS if self.acc.get((k, "repeats", m))]


def _plot(path: Path, run: _Restoration, batch_sizes: list[int], with_repeats: bool, title: str) -> None:
    mean = run.mean
    series = {"Eq. 8 (gradinversion), distinct": [mean((k, "distinct", "gradinversion")) for k in batch_sizes],
              "Eq. 7 (sum), distinct": [mean((k, "distinct", "sum")) for k in batch_sizes]}
    if with_repeats:
        series["Eq. 8, with repeats"] = [mean((k, "repeats", "gradinversion")) for k in batch_sizes]
        series["counts (multiset), with repeats"] = [mean((k, "repeats", "counts")) for k in batch_sizes]
    save_line_plot(path, batch_sizes, series, xlabel="batch size K", ylabel="label accuracy", title=title)


def _closing_notes(run: _Restoration, batch_sizes: list[int], multiset: list[dict[str, Any]]) -> list[str]:
    """Where Eq. 8 falls below the sum rule, the repeated-label table, and the gradients' time."""
    notes = []
    for k in batch_sizes:
        g, s = run.mean((k, "distinct", "gradinversion")), run.mean((k, "distinct", "sum"))
        if g is not None and s is not None and g < s:
            notes.append(f"K={k}: Eq. 8 ({g:.4f}) is BELOW the sum rule ({s:.4f}) here, unlike the paper's Table 1.")
    if multiset:
        notes.append("Batches with repeated labels (beyond the paper; unique-label rules cannot be fully right "
                     "there), also in multiset.csv:\n\n" + markdown_table(MULTISET_COLUMNS, multiset) + "\n")
    notes.append("Every batch with its true and restored labels: batches.csv.")
    if run.grad_seconds:
        notes.append(f"One client gradient took {sum(run.grad_seconds) / len(run.grad_seconds):.2f} s on average "
                     f"({len(run.grad_seconds)} gradients, {torch.get_num_threads()} torch threads).")
    return notes


def _setup(opt: ExperimentOptions, source: Any, data: str, model_name: str, batch_sizes: list[int],
           n_batches: int) -> dict[str, Any]:
    return {"data": f"{data} ({len(source)} images, {source.num_classes} classes)",
            "model": f"{model_name} (seed {opt.seed}; efficientnet-lite0 = pretrained ImageNet weights; the "
                     "paper used a trained ResNet-50, which has no offline weights here)",
            "client": "FedSGD: gradient of the mean cross-entropy, training mode (gradleak.fl.fedsgd)",
            "batch sizes": batch_sizes, "batches per batch size": n_batches,
            "seeds": f"{opt.seed}..{opt.seed + n_batches - 1} (sample_batch seed per batch)",
            "batches (distinct)": "sample_batch without repeated labels, as in the paper",
            "batches (repeats)": "K - r distinct photos + flipped copies of r of them, r in 1..K//2",
            "accuracy": "order-free: |restored multiset ∩ true multiset| / K, averaged over batches (std: "
                        "sample standard deviation over the batches; min..max)",
            "convergence": "none: label restoration is a closed-form rule on one gradient, no optimisation "
                           "(so no inconclusive rows)",
            "methods": {"gradinversion": "Eq. 8, argsort(min_m dW_mn)[:K]", "sum": "Eq. 7, argsort(sum_m dW_mn)[:K]",
                        "counts": "multiset from FC weight + bias gradients (label_counts.count_labels)"},
            "smoke": opt.smoke}


SPEC = {
    "name": "label-restoration",
    "summary": "GradInversion Table 1: label accuracy vs batch size, Eq. 8 vs the sum rule (Eq. 7)",
}


@experiment("label-restoration")
def label_restoration(opt: ExperimentOptions, ws: Workspace) -> ExperimentResult:
    _refuse_attack_options(opt)
    out = ws.out
    model_name = opt.model or DEFAULT_MODEL
    data = opt.data or _default_data(model_name)
    batch_sizes = opt.batch_sizes or ([1, 8] if opt.smoke else [1, 8, 16])
    n_batches = opt.batches or (3 if opt.smoke else 20)
    source = open_source(data)
    size = default_image_size(model_name)
    channels = source.native_channels
    spec = build_model(model_name, num_classes=source.num_classes, channels=channels, image_size=size,
                       seed=opt.seed, width=opt.width)
    run = _Restoration(opt, spec, source, size, channels, n_batches)
    for k in batch_sizes:
        for kind in ("distinct", "repeats"):
            if kind == "repeats" and k < 2:
                continue
            run.batches(k, kind)

    rows = run.table_rows(batch_sizes, model_name, data)
    multiset = run.multiset_rows(batch_sizes)
    _write_csv(out / "multiset.csv", MULTISET_COLUMNS, multiset)
    _write_csv(out / "batches.csv", BATCH_COLUMNS, run.per_batch)
    fig = "accuracy_vs_batch_size.png"
    _plot(out / fig, run, batch_sizes, bool(multiset),
          title=f"Label restoration, {model_name} on {data} ({n_batches} batches per K)")
    notes = run.notes + _closing_notes(run, batch_sizes, multiset)
    return ExperimentResult(
        name="label-restoration", title="Label restoration accuracy vs batch size (GradInversion Table 1)",
        columns=["batch_size", "method", "accuracy", "batches", "labels", "exact_batches", "accuracy_std",
                 "accuracy_min", "accuracy_max", "model", "data"],
        rows=rows, figures=[fig], notes=notes, setup=_setup(opt, source, data, model_name, batch_sizes, n_batches))


def _write_csv(path: Path, columns: list[str], rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({c: ("" if r.get(c) is None else r.get(c)) for c in columns})


def _spread(values: list[float]) -> dict[str, float | None]:
    out = spread(values, "accuracy")
    return {"accuracy_std": out["accuracy_std"], "accuracy_min": out["accuracy_min"], "accuracy_max": out["accuracy_max"]}
