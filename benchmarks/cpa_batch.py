"""The Cocktail Party Attack (attacks/cpa.py) over batch sizes: mlp (Linear(784, 1024)-ReLU-Linear,
seed 0) on Fashion-MNIST's test split at 28 px grey, batches drawn with seeds 7100.. (repeated
labels allowed; no test draws them), FedSGD; an aggregate of 4 FedSGD clients x 16; CIFAR-10's
20 sample photos at 32 px (batches 8 and 16). Each Fashion-MNIST case twice: the attack as it runs
by default (the exact peel, then the unmixing) and the paper's unmixing alone (``--ica-only``).
Every sample's PSNR (gradleak's metric and pairing, metrics/evaluate.py) is written to
benchmarks/cpa_batch.json.

    python benchmarks/cpa_batch.py [--sizes 16 32 64 128 256] [--out benchmarks/cpa_batch.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from gradleak.attacks.cpa import cpa
from gradleak.attacks.verdict import verdict
from gradleak.data import open_source, sample_batch
from gradleak.fl import fedsgd
from gradleak.fl.threats import ThreatModel, share
from gradleak.metrics import evaluate
from gradleak.models import build_model

SEED = 7100


def one(name: str, model, batch, update, *, peel: bool = True) -> dict:
    start = time.perf_counter()
    rec = cpa(update, model, peel=peel)
    seconds = time.perf_counter() - start
    ev = evaluate(rec, batch)
    psnr = [round(float(p.psnr), 3) for p in ev.per_image]
    row = {"case": name, "peel": peel, "batch": len(psnr), "fraction_20db": sum(p >= 20 for p in psnr) / len(psnr),
           "psnr_mean": round(statistics.fmean(psnr), 3), "psnr_median": round(statistics.median(psnr), 3),
           "label_accuracy": ev.label_accuracy, "seconds": round(seconds, 2),
           "relative_gradient_distance": rec.extra["relative_gradient_distance"],
           "converged": verdict("cpa", rec.extra).converged, "exact_inputs": rec.extra["exact_inputs"],
           "ica_iterations": rec.extra["ica_iterations"], "ica_converged": rec.extra["ica_converged"],
           "rank": rec.extra["rank"], "psnr": psnr}
    print(f"{name:28s} frac>=20dB {row['fraction_20db']:.3f} mean {row['psnr_mean']:.2f} "
          f"median {row['psnr_median']:.2f} exact {row['exact_inputs']} {seconds:.1f}s", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--out", default=str(Path(__file__).with_suffix(".json")))
    args = parser.parse_args()
    torch.set_num_threads(1)
    fm = open_source("fashion-mnist", split="test")
    model = build_model("mlp", num_classes=10, channels=1, image_size=28, seed=0)
    rows = []
    for k in args.sizes:
        batch = sample_batch(fm, k, SEED + k, 28, 1, allow_repeats=True)
        update = fedsgd(model, batch)
        rows.append(one(f"fashion-mnist fedsgd {k}", model, batch, update))
        rows.append(one(f"fashion-mnist fedsgd {k} ica-only", model, batch, update, peel=False))
    batch = sample_batch(fm, 64, SEED + 1, 28, 1, allow_repeats=True)
    agg = share(model, batch, ThreatModel(name="aggregate", clients=4), private_seed=0)
    rows.append(one("fashion-mnist aggregate 4x16", model, batch, agg))
    rows.append(one("fashion-mnist aggregate 4x16 ica-only", model, batch, agg, peel=False))
    cifar = open_source("cifar10-samples")
    cmodel = build_model("mlp", num_classes=10, channels=3, image_size=32, seed=0)
    for k in (8, 16):
        batch = sample_batch(cifar, k, SEED, 32, 3, allow_repeats=True)
        rows.append(one(f"cifar10-samples fedsgd {k}", cmodel, batch, fedsgd(cmodel, batch)))
    out = {"what": "cpa on mlp: per batch size, every sample's PSNR (dB)", "model": "mlp (width 1024, seed 0)",
           "seed": SEED, "threads": 1, "machine": platform.processor() or platform.machine(), "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
