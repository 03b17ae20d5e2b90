"""Issue 20: does Inverting Gradients rebuild anything on ResNet-18 (CIFAR stem) at batch 1?

The IG case of make bench ends at 15.41 dB (gradleak) vs 15.68 dB (breaching). Is that leakage? A
reconstruction is scored against two trivial answers (whole_runs.baselines):

* the zero image of the model's input space: a flat image of the model's normalisation mean
  colour, which an attacker returns without looking at the update;
* a flat image of the photo's own mean colour (read from the truth: the best flat answer).

This scores both on the five photos of ig_tv.py (three CIFAR-10 sample photos, two scikit-image
photos no preset was tuned on) and sets beside them every ResNet-18 IG run recorded for those
photos in ig_tv.json and ig_tv_resnet18_high.json (alpha_TV 0.05-1.5, 100 and 300 iterations). No
attack runs here; a few seconds.

    .venv/bin/python benchmarks/ig_zero.py

Writes benchmarks/ig_zero.json.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
RUNS = ("ig_tv.json", "ig_tv_resnet18_high.json")
MODEL = "resnet18-cifar"


def main() -> int:
    sys.path.insert(0, str(HERE))
    from ig_tv import HELD_OUT, _photo_folder
    from whole_runs import baselines

    from gradleak.config import make_config
    from gradleak.pipeline import build_case

    runs = [r for name in RUNS for r in json.loads((HERE / name).read_text())["rows"] if r["model"] == MODEL]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        held_out = str(_photo_folder(Path(tmp)))
        photos = [(f"cifar10-samples seed {s}", dict(data="cifar10-samples", seed=s)) for s in range(3)]
        photos += [(f"held-out {name}", dict(data=held_out, indices=[i])) for i, name in enumerate(HELD_OUT)]
        for name, data in photos:
            case = build_case(make_config(attack="ig", model=MODEL, batch_size=1, threads=1, progress=False, **data))
            base = baselines(case.truth.images, case.model.mean)
            mine = [r for r in runs if r["photo"] == name]
            above = [r for r in mine if r["psnr"] > base["zero_answer_psnr"]]
            best = max(mine, key=lambda r: r["psnr"])
            rows.append({"photo": name, **{k: round(v, 2) for k, v in base.items()},
                         "ig_runs": len(mine), "ig_psnr_min": min(r["psnr"] for r in mine),
                         "ig_psnr_max": best["psnr"], "ig_best": {k: best[k] for k in ("iterations", "alpha_tv")},
                         "ig_runs_above_zero_answer": len(above),
                         "ig_best_minus_zero_answer_db": round(best["psnr"] - base["zero_answer_psnr"], 2)})
            print(f"{name}: zero image {base['zero_answer_psnr']:.2f} dB, own mean colour {base['mean_colour_psnr']:.2f} dB; "
                  f"IG {min(r['psnr'] for r in mine):.2f}-{best['psnr']:.2f} dB over {len(mine)} runs, "
                  f"{len(above)} above the zero image")
    out = {"what": "ResNet-18 (CIFAR stem, random init seed 0), batch 1: PSNR of trivial answers vs gradleak's IG runs "
                   f"recorded in {' and '.join(RUNS)}",
           "model": MODEL, "runs_from": list(RUNS), "rows": rows,
           "torch": torch.__version__}
    (HERE / "ig_zero.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {HERE / 'ig_zero.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
