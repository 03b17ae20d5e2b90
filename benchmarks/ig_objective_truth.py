"""Issue 20: is IG's objective lower at the photo than at IG's answer? (why longer runs end worse)

On the convnet, gradleak's IG ends farther from the photo after 4800 iterations than after 1000
(ig_iterations_*.json) while its objective keeps falling. Two readings: the objective's minimum
is not the photo (a prior/objective problem), or the photo scores lower still and the long run
descends into another, lower basin than the short one but not the photo's (an optimisation
problem). This scores IG's own objective (IG Eq. 4: cosine distance of the update the candidate
would produce + alpha_TV x TV, the attack's alpha_TV) at the true photo and at the answers of
the 1000- and 4800-iteration runs (gradleak's IG, batch 1, one restart, one thread), on the
first N CIFAR-10 sample photos (seeds 0..N-1). ~2 min a photo here.

    .venv/bin/python benchmarks/ig_objective_truth.py [--photos 3]

Writes benchmarks/ig_objective_truth.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    from gradleak.attacks.priors import tv_l1_mean
    from gradleak.attacks.simulate import UpdateSimulator
    from gradleak.config import make_config
    from gradleak.pipeline import build_case, run

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--photos", type=int, default=3)
    p.add_argument("--model", default="convnet")
    p.add_argument("--out", type=Path, default=HERE / "ig_objective_truth.json")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    started = time.time()
    rows = []
    for seed in range(args.photos):
        for iterations in (1000, 4800):
            cfg = make_config(attack="ig", model=args.model, batch_size=1, threads=1, progress=False,
                              iterations=iterations, data="cifar10-samples", seed=seed)
            case = build_case(cfg)
            result = run(cfg, write=False)
            alpha_tv = float(result.metrics["alpha_tv"])   # the run's resolved alpha_TV (per layer, ig.ig_alpha_tv)
            victim = UpdateSimulator(case.model, case.update, dtype=torch.float32, device=torch.device("cpu"))

            def objective(pixels: torch.Tensor) -> float:   # IG Eq. 4 at a batch of pixel images [K, C, H, W]
                x = case.model.normalize(pixels.float()).unsqueeze(0)
                with torch.no_grad():
                    grads, _ = victim.batched(x, case.truth.labels)   # labels: restored = true here (accuracy 1)
                    return float(victim.gradient.cosine(grads) + alpha_tv * tv_l1_mean(x))

            rows.append({"photo": f"cifar10-samples seed {seed}", "iterations": iterations, "alpha_tv": alpha_tv,
                         "psnr": round(result.metrics["psnr_mean"], 2),
                         "label_accuracy": result.metrics["label_accuracy"],
                         "objective_at_answer": round(objective(result.reconstruction.images), 4),
                         "objective_at_photo": round(objective(case.truth.images), 4)})
            print(rows[-1], flush=True)
    out = {"what": __doc__.split("\n\n")[0], "model": args.model,
           "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": 1},
           "command": "python benchmarks/ig_objective_truth.py" + ("" if argv is None else " " + " ".join(argv)),
           "rows": rows, "wall_minutes": round((time.time() - started) / 60, 1)}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
