"""How many photos the imprint attack rebuilds exactly from a 2-client aggregate, over seeds (issue 43:
the README's "6 of 8" was one fixed batch; seed 0's draw gives 8 of 8).

The command of the README, per seed: ``gradleak attack --model resnet18-cifar --server imprint:bins=64
--attack imprint --threat aggregate --clients 2 --batch-size 4 --seed S`` (each seed draws another 2 x 4
CIFAR-10 sample photos; the server's block is the same). Per seed: the photos at >= 40 dB (exact up to
float32 rounding: the rebuilt ones score 80-100 dB) and the inputs the attack reports separated.
Writes benchmarks/imprint_seeds.json (about 5 s a seed, one thread).

    .venv/bin/python benchmarks/imprint_seeds.py [--seeds 20]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
COMMAND = ["attack", "--model", "resnet18-cifar", "--server", "imprint:bins=64", "--attack", "imprint",
           "--threat", "aggregate", "--clients", "2", "--batch-size", "4", "--threads", "1", "--no-progress"]
EXACT_DB = 40.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=20)
    args = p.parse_args()
    from gradleak.cli import main as gradleak

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            out = Path(tmp) / f"seed{seed}"
            with contextlib.redirect_stdout(io.StringIO()):
                rc = gradleak([*COMMAND, "--seed", str(seed), "--out", str(out)])
            assert rc == 0, seed
            m = json.loads((out / "metrics.json").read_text())
            psnr = [r["psnr"] for r in m["per_image"]]
            rows.append({"seed": seed, "exact": sum(v >= EXACT_DB for v in psnr), "separated": m.get("separated"),
                         "batch": m["batch_size"], "psnr_min": round(min(psnr), 2)})
            print(json.dumps(rows[-1]), flush=True)
    exact = [r["exact"] for r in rows]
    result = {"command": "gradleak " + " ".join(COMMAND) + " --seed S", "exact_db": EXACT_DB,
              "cpu": platform.processor() or platform.machine(), "seeds": rows,
              "exact_min": min(exact), "exact_max": max(exact),
              "exact_counts": {str(k): exact.count(k) for k in sorted(set(exact))}}
    (HERE / "imprint_seeds.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "seeds"}))


if __name__ == "__main__":
    main()
