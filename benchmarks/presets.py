"""Issue 20: are GradInversion's presets good on the models people use, not only on the one they
were tuned on? The cpu preset was tuned on the 14-tensor convnet; ResNet-18 (CIFAR stem) has 62
parameter tensors and 20 BN layers, so Eq. 3's and Eq. 10's sums outweigh the image priors there
unless the preset is applied per layer (gradinversion.per_layer). This runs both on ResNet-18:

* "as tuned": the cpu preset's alpha_G = alpha_BN = 1, given explicitly;
* "per layer": the default (alpha_G x 14/62, alpha_BN x 4/20).

Cases: the issue's like-for-like setting (one seed, no group term, BN approx, 200 steps, labels
restored) on three batches of 4 CIFAR-10 sample photos (seeds 0, 1, 2) and on 4 photos from
scikit-image that no preset was tuned on; and the full cpu preset (4 seeds, registered group
term, BN exact on the client's shared statistics) at 200 steps on the seed-0 batch. One thread,
whole runs through the pipeline (the same path as `gradleak attack`). Writes
benchmarks/presets.json (~10 GradInversion runs: 15-30 min on this CPU).

    .venv/bin/python benchmarks/presets.py
"""

from __future__ import annotations

import importlib.util
import json
import platform
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
HELD_OUT = ("astronaut", "coffee", "chelsea", "rocket")
LIKE_FOR_LIKE = dict(seeds=1, group="none", bn="approx", iterations=200)
FULL = dict(iterations=200, bn="exact", share_bn_statistics=True)


def _photo_folder(tmp: Path) -> Path:
    spec = importlib.util.spec_from_file_location("gradleak_bench_robustness_presets", HERE / "robustness.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    return bench.build_photo_set(tmp / "held-out", names=HELD_OUT)


def _run(**fields) -> dict:  # noqa: ANN003
    from gradleak.config import make_config
    from gradleak.pipeline import run

    cfg = make_config(attack="gradinversion", model="resnet18-cifar", batch_size=4, threads=1, progress=False,
                      **fields)
    m = run(cfg, write=False).metrics
    s = m["settings"]
    return {"psnr_mean": round(m["psnr_mean"], 2), "ssim_mean": round(m["ssim_mean"], 3),
            "label_accuracy": m["label_accuracy"], "converged": m.get("converged"),
            "alpha_g": s.get("alpha_g"), "alpha_bn": s.get("alpha_bn"), "alpha_tv": s.get("alpha_tv"),
            "wall_seconds": round(m["wall_seconds"], 1)}


def main() -> int:
    torch.set_num_threads(1)
    out: dict = {"machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": 1},
                 "model": "resnet18-cifar (62 parameter tensors, 20 BN layers; random init, seed 0)",
                 "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        held_out = str(_photo_folder(Path(tmp)))
        cases = [("cifar10-samples seed 0", dict(data="cifar10-samples", seed=0), LIKE_FOR_LIKE),
                 ("cifar10-samples seed 1", dict(data="cifar10-samples", seed=1), LIKE_FOR_LIKE),
                 ("cifar10-samples seed 2", dict(data="cifar10-samples", seed=2), LIKE_FOR_LIKE),
                 ("held-out: " + ", ".join(HELD_OUT), dict(data=held_out, seed=0), LIKE_FOR_LIKE),
                 ("cifar10-samples seed 0, full cpu preset", dict(data="cifar10-samples", seed=0), FULL)]
        for name, data, setting in cases:
            row = {"case": name, "setting": {k: v for k, v in setting.items() if k != "share_bn_statistics"}}
            row["as_tuned"] = _run(**data, **setting, alpha_g=1.0, alpha_bn=1.0)
            row["per_layer"] = _run(**data, **setting)
            row["gain_db"] = round(row["per_layer"]["psnr_mean"] - row["as_tuned"]["psnr_mean"], 2)
            out["rows"].append(row)
            print(f"{name}: as tuned {row['as_tuned']['psnr_mean']} dB, per layer {row['per_layer']['psnr_mean']} dB "
                  f"({row['gain_db']:+.2f})", flush=True)
    out["mean_gain_db"] = round(sum(r["gain_db"] for r in out["rows"]) / len(out["rows"]), 2)
    (HERE / "presets.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"mean gain {out['mean_gain_db']:+.2f} dB; wrote {HERE / 'presets.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
