"""Issue 37 item 3: ``--attack auto`` on batches as a portfolio (DLG, GradInversion, IG), against
GradInversion alone (what auto fell back to before), on photos the project was not tuned on
(scikit-image / scikit-learn photos, never in the sample sets), on the DLG LeNet, undefended:

* FedSGD, batch 4: photos 0-3 and 4-7;
* FedAvg, 2 local steps, batch 2: photos 0-1 and 2-3.

Each through `gradleak attack` as a user runs it, at every default. Records per run the attack
kept, the verdict and its reason, the PSNR, and per member of the portfolio its distance, seconds,
PSNR and verdict. Writes benchmarks/auto_portfolio.json (about 15 minutes, one thread).

    .venv/bin/python benchmarks/auto_portfolio.py
"""

from __future__ import annotations

import contextlib
import io
import json
import platform
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "china", "flower", "retina", "immunohistochemistry")
CASES = (("fedsgd batch 4", ["--batch-size", "4"], ("0,1,2,3", "4,5,6,7")),
         ("fedavg 2 steps batch 2", ["--threat", "fedavg", "--local-steps", "2", "--batch-size", "2"], ("0,1", "2,3")))


def main() -> None:
    sys.path.insert(0, str(HERE))
    from robustness import build_photo_set

    from gradleak.cli import main as gradleak

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        photos = build_photo_set(Path(tmp) / "photos", PHOTOS)
        for case, flags, draws in CASES:
            for indices in draws:
                for attack in ("auto", "gradinversion"):
                    out = Path(tmp) / f"run-{len(rows)}"
                    picks = [a for i in indices.split(",") for a in ("--indices", i)]
                    argv = ["attack", "--attack", attack, "--data", str(photos), *picks, *flags,
                            "--threads", "1", "--no-progress", "--out", str(out)]
                    with contextlib.redirect_stdout(io.StringIO()):
                        assert gradleak(argv) == 0, argv
                    m = json.loads((out / "metrics.json").read_text())
                    auto = m.get("auto") or {}
                    rows.append({
                        "case": case, "photos": [PHOTOS[int(i)] for i in indices.split(",")], "attack": attack,
                        "kept": m["attack"], "verdict": m["verdict"], "reason": m["verdict_reason"],
                        "psnr": round(m["psnr_mean"], 2), "ssim": round(m["ssim_mean"], 3),
                        "wall_seconds": m["wall_seconds"],
                        "members": [{k: t.get(k) for k in ("attack", "converged", "relative_gradient_distance",
                                                           "seconds", "psnr_mean", "verdict")}
                                    for t in auto.get("tried", []) if t.get("applies")]})
                    print(json.dumps(rows[-1]), flush=True)
    result = {"command": "gradleak attack --attack auto|gradinversion --data PHOTOS --indices I [threat flags]",
              "model": "lenet-dlg (the default)", "cpu": platform.processor() or platform.machine(), "rows": rows}
    (HERE / "auto_portfolio.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
