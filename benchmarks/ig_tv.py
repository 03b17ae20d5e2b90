"""Issue 20: Inverting Gradients' TV weight on the models people use, and how few iterations it needs.

breaching's invertinggradients preset ends ~1 dB above gradleak's IG on ResNet-18 (CIFAR stem) at
equal iterations (RESULTS.md); its TV term is scale 0.2 on mean(|dx| + |dy|), twice gradleak's
alpha_TV 0.1 on mean|dx| + mean|dy| (the IG authors' code default). Is the weight model-dependent,
and what does the run length buy? This runs gradleak's IG (labels restored, one restart, the
authors' step schedule compressed to the run length) for every

* model: resnet18-cifar and convnet (random init, seed 0; the models of benchmarks/run.py),
* alpha_TV: 0.05, 0.1, 0.2, 0.4,
* iterations: 100 and 300,

on five photos one at a time (batch 1): three CIFAR-10 sample photos (seeds 0-2) and two
scikit-image photos no preset was tuned on (astronaut, coffee, 32 px). One thread, whole runs
through the pipeline (the path of `gradleak attack`). Every run is in ig_tv.json; ~40 min here.

    .venv/bin/python benchmarks/ig_tv.py [--models resnet18-cifar] [--quick]

Other grids, written to another file (e.g. the model-size question of reproduction/model-size:
does the convnet's best alpha_TV move with its width?):

    .venv/bin/python benchmarks/ig_tv.py --models convnet:16,convnet:64 --alphas 0.05,0.1,0.2 \
        --iterations 1000 --photos 3 --out benchmarks/ig_tv_width.json

``--batch-size B`` attacks batches of B photos instead (three CIFAR-10 batches, seeds 0-2, and one
batch of the first B held-out scikit-image photos). ``--checkpoint`` attacks a trained model
(a `gradleak train` safetensors file; its ``--model``) on held-out test images of ``--data``
(seeds 0..N-1) instead of the sample photos. Every photo (batch) is also scored against its
trivial answers (whole_runs.baselines: the zero image of the model's input space and the photo's
own mean colour), so a run below them is read as a failed reconstruction, not as a finding.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
HELD_OUT = ("astronaut", "coffee")
ALPHAS = (0.05, 0.1, 0.2, 0.4)
ITERATIONS = (100, 300)


def _photo_folder(tmp: Path, names: tuple[str, ...] = HELD_OUT) -> Path:
    sys.path.insert(0, str(HERE))
    from robustness import build_photo_set  # the held-out photos as an ImageFolder (benchmarks/robustness.py)

    return build_photo_set(tmp / "held-out", names=names)


def _photos(tmp: Path, batch_size: int, checkpoint: Path | None, data: str) -> list[tuple[str, dict]]:
    """(name, data options) of every photo (batch) the grid attacks."""
    if checkpoint is not None:
        return [(f"{data} test seed {s}", dict(data=data, split="test", seed=s, checkpoint=str(checkpoint)))
                for s in range(5)]
    photos = [(f"cifar10-samples seed {s}", dict(data="cifar10-samples", seed=s)) for s in range(3)]
    if batch_size == 1:
        held_out = str(_photo_folder(tmp))
        return photos + [(f"held-out {name}", dict(data=held_out, indices=[i])) for i, name in enumerate(HELD_OUT)]
    sys.path.insert(0, str(HERE))
    from robustness import PHOTOS

    names = PHOTOS[:batch_size]
    held_out = str(_photo_folder(tmp, names))
    return photos + [(f"held-out {'+'.join(names)}", dict(data=held_out, indices=list(range(batch_size))))]


def _config(model: str, batch_size: int, **options):  # noqa: ANN003, ANN202
    from gradleak.config import make_config

    name, _, width = model.partition(":")   # "convnet:64": that width
    return make_config(attack="ig", model=name, width=int(width) if width else None, batch_size=batch_size,
                       threads=1, progress=False, **options)


def _baselines(model: str, batch_size: int, data: dict) -> dict[str, float]:
    sys.path.insert(0, str(HERE))
    from whole_runs import baselines

    from gradleak.pipeline import build_case

    case = build_case(_config(model, batch_size, **data))
    return {k: round(v, 2) for k, v in baselines(case.truth.images, case.model.mean).items()}


def _run(model: str, alpha_tv: float, iterations: int, batch_size: int = 1, **data) -> dict:  # noqa: ANN003
    from gradleak.pipeline import run

    cfg = _config(model, batch_size, alpha_tv=alpha_tv, iterations=iterations, **data)
    m = run(cfg, write=False).metrics
    return {"psnr": round(m["psnr_mean"], 2), "ssim": round(m["ssim_mean"], 3),
            "label_accuracy": m["label_accuracy"], "converged": m.get("converged"),
            "wall_seconds": round(m["wall_seconds"], 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet18-cifar,convnet")
    p.add_argument("--alphas", default=",".join(map(str, ALPHAS)))
    p.add_argument("--iterations", default=",".join(map(str, ITERATIONS)))
    p.add_argument("--photos", type=int, default=5, help="the first N of the five photos")
    p.add_argument("--batch-size", type=int, default=1, help="photos per attacked batch")
    p.add_argument("--checkpoint", type=Path, help="attack this trained model (gradleak train) on held-out test images")
    p.add_argument("--data", default="fashion-mnist", help="with --checkpoint: the data it was trained on")
    p.add_argument("--out", type=Path, default=HERE / "ig_tv.json")
    p.add_argument("--quick", action="store_true", help="one photo, 20 iterations: check the harness")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    started = time.time()
    alphas = tuple(float(a) for a in args.alphas.split(","))
    budgets = tuple(int(n) for n in args.iterations.split(","))
    if args.quick:
        alphas, budgets = alphas[:2], (20,)
    models = ("trained checkpoint " + str(args.checkpoint)) if args.checkpoint else "random-init models (seed 0)"
    out: dict = {"machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": 1},
                 "what": f"gradleak IG, batch {args.batch_size}, labels restored, one restart, {models}",
                 "command": "python benchmarks/ig_tv.py " + " ".join(sys.argv[1:] if argv is None else argv),
                 "rows": [], "baselines": {}}
    with tempfile.TemporaryDirectory() as tmp:
        photos = _photos(Path(tmp), args.batch_size, args.checkpoint, args.data)
        photos = photos[:1] if args.quick else photos[:args.photos]
        for model in args.models.split(","):
            for name, data in photos:
                base = out["baselines"][f"{model} | {name}"] = _baselines(model, args.batch_size, data)
                for iterations in budgets:
                    for alpha in alphas:
                        r = _run(model, alpha, iterations, args.batch_size, **data)
                        out["rows"].append({"model": model, "photo": name, "iterations": iterations,
                                            "alpha_tv": alpha, **r,
                                            "above_zero_image": r["psnr"] > base["zero_answer_psnr"]})
                        print(f"{model} | {name} | {iterations} it | alpha_TV {alpha}: {r['psnr']} dB "
                              f"({r['wall_seconds']} s)", flush=True)
    summary = {}
    for model in args.models.split(","):
        for iterations in budgets:
            for alpha in alphas:
                cell = [r for r in out["rows"] if r["model"] == model and r["iterations"] == iterations
                        and r["alpha_tv"] == alpha]
                vals = [r["psnr"] for r in cell]
                summary[f"{model} {iterations} it alpha_TV {alpha}"] = {
                    "psnr_mean": round(sum(vals) / len(vals), 2), "psnr_min": min(vals), "psnr_max": max(vals),
                    "photos": len(vals), "above_zero_image": sum(r["above_zero_image"] for r in cell),
                    "converged": sum(bool(r["converged"]) for r in cell)}
    out["summary"] = summary
    out["wall_minutes"] = round((time.time() - started) / 60, 1)
    target = Path(tempfile.gettempdir()) / "ig_tv.quick.json" if args.quick else args.out
    target.write_text(json.dumps(out, indent=1) + "\n")
    for k, v in summary.items():
        print(f"{k}: {v['psnr_mean']} dB (min {v['psnr_min']}, max {v['psnr_max']}, n {v['photos']})")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
