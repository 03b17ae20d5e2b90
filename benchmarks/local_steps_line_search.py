"""The local-iterations cells at 3 and 4 local FedAvg steps with DLG's L-BFGS with and without its
strong Wolfe line search (dlg.LBFGS_LINE_SEARCH): the experiment's cell, as `gradleak attack` runs
it (DLG LeNet, one CIFAR-10 sample photo drawn by the seed, float64, zero start, 300 steps a start,
every step of the budget, local lr 0.1; the attacker unrolls the announced steps).

Why it exists: the folder's rerun at today's code left 6 of the 8 runs at 3-4 steps inconclusive
(every start stalled at relative gradient distance 0.1-0.5), where the run before the line search
(2026-11-26) rebuilt all but one. This measures whether the line search is what moved them.

Writes benchmarks/local_steps_line_search.json (one thread a run: the `none` arm about 13 minutes,
the strong Wolfe arm about 55, its stalled runs 400-600 s each).

    .venv/bin/python benchmarks/local_steps_line_search.py [--line-search none|strong_wolfe ...] [--cells 3:1 ...]

A run keeps the rows of the file's other cells and arms.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CELLS = [(steps, seed) for steps in (3, 4) for seed in (0, 1, 2, 3)]


def run(gradleak, tmp: str, steps: int, seed: int) -> dict:
    out = f"{tmp}/run-{steps}-{seed}"
    argv = ["attack", "--attack", "dlg", "--model", "lenet-dlg", "--data", "cifar10-samples", "--seed", str(seed),
            "--batch-size", "1", "--iterations", "300", "--dtype", "float64", "--init", "zeros", "--stop", "budget",
            "--threat", "fedavg", "--local-steps", str(steps), "--local-lr", "0.1",
            "--threads", "1", "--no-progress", "--no-paper-metrics", "--out", out]
    with contextlib.redirect_stdout(io.StringIO()):
        assert gradleak(argv) == 0, argv
    m = json.loads(Path(out, "metrics.json").read_text())
    return {"local_steps": steps, "seed": seed, "psnr": round(m["psnr_mean"], 2),
            "relative_gradient_distance": m["relative_gradient_distance"], "verdict": m["verdict"],
            "iterations": m["iterations"], "wall_seconds": m["wall_seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--line-search", nargs="+", default=["none", "strong_wolfe"],
                        choices=["none", "strong_wolfe"])
    parser.add_argument("--cells", nargs="+", metavar="STEPS:SEED", default=[f"{n}:{s}" for n, s in CELLS],
                        help="the cells to run (default: all 8), e.g. 3:1 4:1")
    args = parser.parse_args()
    cells = [tuple(int(v) for v in c.split(":")) for c in args.cells]
    from gradleak.cli import main as gradleak
    from gradleak.runtime import cpu_model

    dlg = importlib.import_module("gradleak.attacks.dlg")
    default = dlg.LBFGS_LINE_SEARCH
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for line_search in args.line_search:
            dlg.LBFGS_LINE_SEARCH = None if line_search == "none" else line_search
            for steps, seed in cells:
                rows.append({"line_search": line_search, **run(gradleak, tmp, steps, seed), "cpu": cpu_model()})
                print(json.dumps(rows[-1]), flush=True)
    dlg.LBFGS_LINE_SEARCH = default
    # an arm run on its own keeps the other arm's rows already in the file (each row names its CPU)
    out = HERE / "local_steps_line_search.json"
    done = {(r["line_search"], r["local_steps"], r["seed"]) for r in rows}
    kept = [r for r in (json.loads(out.read_text())["rows"] if out.exists() else [])
            if (r["line_search"], r["local_steps"], r["seed"]) not in done]
    rows = sorted(kept + rows, key=lambda r: (r["line_search"] != "none", r["local_steps"], r["seed"]))
    arms = [ls for ls in ("none", "strong_wolfe") if any(r["line_search"] == ls for r in rows)]
    summary = {f"{ls} | {steps} steps": {"leaked": sum(r["verdict"] == "leaked" for r in sel), "of": len(sel),
                                         "psnr": [r["psnr"] for r in sel]}
               for ls in arms for steps in (3, 4)
               for sel in [[r for r in rows if r["line_search"] == ls and r["local_steps"] == steps]]}
    result = {"command": "gradleak attack --attack dlg --model lenet-dlg --data cifar10-samples --seed S "
                         "--batch-size 1 --iterations 300 --dtype float64 --init zeros --stop budget "
                         "--threat fedavg --local-steps N --local-lr 0.1",
              "summary": summary, "rows": rows}
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
