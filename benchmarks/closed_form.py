"""Issue 19's time targets for the closed-form attacks, measured here (tests assert quality only):

* analytic on mlp, batch 1, photos never used in tests (sklearn's china and flower): >= 60 dB in
  under 2 s;
* R-GAP on DLG's LeNet, batch 1: >= 30 dB in at most a fifth of DLG's time at its defaults on the
  same photo (CIFAR-10 samples 0 and 3, skimage's coffee);
* the imprint attack, 64 bins, ResNet-18 (CIFAR stem), 2 clients x 4 photos aggregated: the
  attack's seconds and how many photos came out >= 40 dB.

One thread. Writes benchmarks/closed_form.json (a few minutes: DLG dominates).

    .venv/bin/python benchmarks/closed_form.py
"""

from __future__ import annotations

import importlib.util
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def _photos(names: tuple[str, ...], tmp: Path):  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("gradleak_bench_robustness_cf", HERE / "robustness.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    from gradleak.data import open_source

    return open_source(str(bench.build_photo_set(tmp / "set", names=names)))


def _timed(fn, *args):  # noqa: ANN001, ANN202
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def main() -> int:
    torch.set_num_threads(1)
    from gradleak.engine import Engine
    from gradleak.attacks.analytic import analytic
    from gradleak.attacks.configs import resolve_attack
    from gradleak.attacks.imprint import imprint_attack
    from gradleak.attacks.rgap import rgap
    from gradleak.data import batch_of, open_source
    from gradleak.fl import fedsgd
    from gradleak.fl.threats import ThreatModel, share
    from gradleak.metrics import evaluate
    from gradleak.models import build_model
    from gradleak.models.server import server_model

    out: dict = {"machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": 1}}
    with tempfile.TemporaryDirectory() as tmp:
        outside = _photos(("china", "flower", "coffee"), Path(tmp))
        cifar = open_source("cifar10-samples")
        mlp = build_model("mlp", num_classes=outside.num_classes, seed=0)
        rows = []
        for i, name in enumerate(("china", "flower")):
            batch = batch_of(outside, [i], 32, 3)
            rec, sec = _timed(analytic, fedsgd(mlp, batch), mlp)
            rows.append({"photo": name, "psnr": round(evaluate(rec, batch).psnr_mean, 2), "seconds": round(sec, 3)})
            print(json.dumps(rows[-1]), flush=True)
        out["analytic"] = {"target": ">= 60 dB in under 2 s", "rows": rows,
                           "passed": all(r["psnr"] >= 60 and r["seconds"] < 2 for r in rows)}
        rows = []
        for source, index, name in ((cifar, 0, "cifar10 0"), (cifar, 3, "cifar10 3"), (outside, 2, "coffee")):
            lenet = build_model("lenet-dlg", num_classes=source.num_classes, seed=0)
            batch = batch_of(source, [index], 32, 3)
            update = fedsgd(lenet, batch)
            rec, r_sec = _timed(rgap, update, lenet)
            cfg = resolve_attack({"attack": "dlg", "seed": 0}, bn_statistics_shared=True)
            dlg, d_sec = _timed(Engine().run, cfg, update, lenet)
            rows.append({"photo": name, "rgap_psnr": round(evaluate(rec, batch).psnr_mean, 2),
                         "rgap_seconds": round(r_sec, 2), "dlg_psnr": round(evaluate(dlg, batch).psnr_mean, 2),
                         "dlg_seconds": round(d_sec, 2), "ratio": round(d_sec / r_sec, 1)})
            print(json.dumps(rows[-1]), flush=True)
        out["rgap"] = {"target": ">= 30 dB in at most a fifth of DLG's time", "rows": rows,
                       "passed": all(r["rgap_psnr"] >= 30 and r["ratio"] >= 5 for r in rows)}
        victim = build_model("resnet18-cifar", num_classes=10, seed=0)
        imprinted = server_model(victim, "imprint:bins=64")
        batch = batch_of(cifar, list(range(8)), 32, 3)
        update = share(imprinted, batch, ThreatModel(name="aggregate", clients=2), private_seed=0)
        rec, sec = _timed(imprint_attack, update, imprinted)
        ev = evaluate(rec, batch)
        good = sum(p.psnr >= 40 for p in ev.per_image)
        out["imprint"] = {"target": ">= 4 of 8 photos at >= 40 dB", "photos_at_40dB": good, "seconds": round(sec, 3),
                          "passed": good >= 4}
        print(json.dumps(out["imprint"]), flush=True)
    path = HERE / "closed_form.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
