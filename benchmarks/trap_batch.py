"""How trap weights' recovery falls with the batch size (issue 41): the command a user runs,

    gradleak attack --model resnet18-cifar --server trap[:rate=R] --attack trap --data D --batch-size B --seed S

for B = 8 ... 128 on Fashion-MNIST's test split (grey, resized to 32 px; the only offline set with
enough photos for batch 128) and B = 8, 16 on the CIFAR-10 and CIFAR-100 sample photos (20 each),
three seeds (three batches) each, with the server's default (2000 rows, shrink calibrated for a
firing rate of 1/8 on public photos) and with a server that tunes its rate to the batch (1/B), plus
an aggregate of 4 clients x 16. Per run: photos at >= 40 dB (exact up to float32 rounding), the
inputs the attack reports separated, the attacker's relative gradient distance, seconds. Writes
benchmarks/trap_batch.json (~15 min here, one thread).

    .venv/bin/python benchmarks/trap_batch.py [--seeds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BASE = ["attack", "--model", "resnet18-cifar", "--attack", "trap", "--threads", "1", "--no-progress",
        "--allow-repeats"]
EXACT_DB = 40.0


def cases() -> list[dict]:
    out = []
    for b in (8, 16, 32, 64, 128):
        for server in ("trap", f"trap:rate={1 / b:.6g}"):
            out.append({"data": ["--data", "fashion-mnist", "--split", "test"], "batch": b, "server": server,
                        "threat": []})
    for data in ("cifar10-samples", "cifar100-samples"):
        for b in (8, 16):
            out.append({"data": ["--data", data], "batch": b, "server": "trap", "threat": []})
    out.append({"data": ["--data", "fashion-mnist", "--split", "test"], "batch": 16, "server": "trap:rate=0.015625",
                "threat": ["--threat", "aggregate", "--clients", "4"]})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    args = p.parse_args()
    from gradleak.cli import main as gradleak

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(cases()):
            for seed in range(args.seeds):
                out = Path(tmp) / f"c{i}s{seed}"
                cmd = [*BASE, *case["data"], "--batch-size", str(case["batch"]), "--server", case["server"],
                       *case["threat"], "--seed", str(seed), "--out", str(out)]
                start = time.perf_counter()
                with contextlib.redirect_stdout(io.StringIO()):
                    rc = gradleak(cmd)
                assert rc == 0, cmd
                m = json.loads((out / "metrics.json").read_text())
                psnr = [r["psnr"] for r in m["per_image"]]
                n = len(psnr)
                rows.append({"data": case["data"][1], "threat": case["threat"][1] if case["threat"] else "fedsgd",
                             "server": case["server"], "samples": n, "seed": seed,
                             "exact": sum(v >= EXACT_DB for v in psnr), "exact_fraction": round(
                                 sum(v >= EXACT_DB for v in psnr) / n, 3),
                             "separated": m.get("separated"), "label_accuracy": m.get("label_accuracy"),
                             "relative_gradient_distance": m.get("relative_gradient_distance"),
                             "verdict": m.get("verdict"), "seconds": round(time.perf_counter() - start, 1)})
                print(json.dumps(rows[-1]), flush=True)
    result = {"command": "gradleak " + " ".join(BASE) + " --data D --batch-size B --server SERVER --seed S",
              "exact_db": EXACT_DB, "cpu": platform.processor() or platform.machine(),
              "date": time.strftime("%Y-%m-%d"), "runs": rows}
    (HERE / "trap_batch.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
