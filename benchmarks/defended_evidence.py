"""Issue 64: positive evidence for "defended" that no optimiser's reach affects (the decoy test),
and the yardsticks of "presumed leaked" without truth (starts and decoy batches).

Part 1, on the DLG LeNet, batch 1, 6 seeds of cifar10-samples and 6 scikit-image photos at 32 px
(a folder the project was not tuned on): for each defense, the decoy test as every run records
it (the truth's relative distance to the defended update, 16 decoy batches of public photos with
its labels, the noise's spread) and, for Gaussian 0.1 and DP-SGD noise 1, the whole verdict of
`gradleak attack --attack idlg` (which runs the positive control itself).
Part 2, without truth: the answer's distance against the best start / decoy distance
(outcome.PRESUME_RATIO) for converged iDLG / DLG runs and for GradInversion's start and 5 steps.

Writes benchmarks/defended_evidence.json (every case; about 12 minutes on one busy thread).

    .venv/bin/python benchmarks/defended_evidence.py [--seeds 6] [--photos camera,coins,...] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFENSES = (["gaussian:0.01"], ["gaussian:0.03"], ["gaussian:0.1"], ["gaussian:1"], ["dpsgd:clip=1,noise=1"],
            ["dpsgd:clip=1,noise=0.01"], ["dpsgd:clip=0.1,noise=0.001"])
FULL_RUNS = (["gaussian:0.1"], ["dpsgd:clip=1,noise=1"])
PHOTOS = ("camera", "coins", "moon", "rocket", "retina", "chelsea")


def decoy_row(where: list[str], defenses: list[str]) -> dict:
    """The decoy test of one case, without attacking it (it depends on the update and truth only)."""
    import torch

    from gradleak.config import make_config
    from gradleak.defenses.floor import noise_floor
    from gradleak.pipeline.case import build_case
    from gradleak.pipeline.decoys import decoy_test
    from gradleak.pipeline.image import truth_distance

    args = dict(zip(where[::2], where[1::2]))
    values = {"seed": int(args["--seed"])} if "--seed" in args else \
        {"data": args["--data"], "indices": [int(args["--indices"])]}
    cfg = make_config(attack="idlg", defense=defenses, **values)
    case = build_case(cfg)
    cpu = torch.device("cpu")
    floor = noise_floor(case.update)
    test = decoy_test(case.model, case.update, case.truth, floor.tolerance, cpu, scaled=bool(floor.unmodelled)) or {}
    return {"case": where, "defenses": defenses, "truth_relative_distance": truth_distance(case.model, case.update,
                                                                                         case.truth, cpu),
            "measure": test.get("measure"), "truth": test.get("truth"), "best_decoy": test.get("best_decoy"),
            "spread": test.get("spread"), "separated": test.get("separated"),
            "gap_over_spread": (test["best_decoy"] - test["truth"]) / test["spread"] if test.get("spread") else None,
            "decoys": test.get("decoys")}


def attack(argv: list[str], out: Path) -> dict:
    from gradleak.cli import main as gradleak

    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        assert gradleak(["attack", *argv, "--threads", "1", "--no-progress", "--out", str(out)]) == 0, argv
    m = json.loads((out / "metrics.json").read_text())
    c = m.get("control") or {}
    return {"argv": argv, "verdict": m["verdict"], "reason": m["verdict_reason"], "next": m.get("next_step"),
            "psnr": m.get("psnr_mean"), "answer_distance": m.get("relative_gradient_distance"),
            "truth_distance": m.get("truth_relative_distance"), "decoy_test": m.get("decoy_test"),
            "references": m.get("reference_distances"), "control": c.get("verdict"),
            "control_psnr": c.get("psnr_mean"), "seconds": round(time.perf_counter() - t0, 1)}


def presumption_rows(tmp: Path) -> list[dict]:
    """Part 2: the answer's distance over the best reference, without truth."""
    from gradleak.cli import main as gradleak
    from gradleak.outcome import PRESUME_RATIO

    rows = []
    for batch in ("1", "2"):
        u = tmp / f"u{batch}.safetensors"
        with contextlib.redirect_stdout(io.StringIO()):
            assert gradleak(["share", "--batch-size", batch, "--out", str(u)]) == 0
        for argv in (["--attack", "idlg"], ["--attack", "gradinversion", "--iterations", "0"],
                     ["--attack", "gradinversion", "--iterations", "5"], ["--attack", "ig", "--iterations", "5"]):
            r = attack(["--update", str(u), *argv], tmp / f"p{len(rows)}")
            refs = r["references"] or {}
            best = min([*refs.get("starts", []), *refs.get("decoys", [])], default=None)
            ratio = r["answer_distance"] / best if best and r["answer_distance"] is not None else None
            rows.append({"batch": int(batch), **r, "ratio_to_best_reference": ratio, "presume_ratio": PRESUME_RATIO})
            print(json.dumps({k: rows[-1][k] for k in ("batch", "argv", "verdict", "ratio_to_best_reference")}),
                  flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=6)
    p.add_argument("--photos", default=",".join(PHOTOS))
    p.add_argument("--quick", action="store_true", help="the decoy tests only (no attack runs)")
    p.add_argument("--full-cases", type=int, default=4, help="cases (half seeds, half photos) run whole")
    args = p.parse_args()
    sys.path.insert(0, str(HERE))
    import torch

    from robustness import build_photo_set

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    names = tuple(args.photos.split(","))
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        photos = build_photo_set(tmp / "photos", names)
        cases = [["--seed", str(s)] for s in range(args.seeds)] + \
                [["--data", str(photos), "--indices", str(i)] for i in range(len(names))]
        labels = [f"cifar10-samples seed {s}" for s in range(args.seeds)] + [f"photo {n}" for n in names]
        decoys = []
        for label, where in zip(labels, cases):
            for defenses in DEFENSES:
                decoys.append({"label": label, **decoy_row(where, defenses)})
                print(json.dumps({k: decoys[-1][k] for k in ("label", "defenses", "separated", "gap_over_spread")}),
                      flush=True)
        runs = []
        if not args.quick:
            half = args.full_cases // 2
            chosen = [*range(min(half, args.seeds)), *range(args.seeds, args.seeds + args.full_cases - half)]
            for label, where in [(labels[i], cases[i]) for i in chosen if i < len(cases)]:
                for defenses in FULL_RUNS:
                    argv = ["--attack", "idlg", *where, *(a for d in defenses for a in ("--defense", d))]
                    runs.append({"label": label, **attack(argv, tmp / f"r{len(runs)}")})
                    print(json.dumps({k: runs[-1][k] for k in ("label", "argv", "verdict", "seconds")}), flush=True)
        presumed = presumption_rows(tmp) if not args.quick else []
    summary = {}
    for defenses in DEFENSES:
        rows = [r for r in decoys if r["defenses"] == defenses]
        summary[",".join(defenses)] = {"not separated (decoy test credits)": sum(1 for r in rows if not r["separated"]),
                                       "cases": len(rows)}
    for defenses in FULL_RUNS:
        rows = [r for r in runs if r["argv"][-1] == defenses[0]]
        summary[",".join(defenses) + " idlg verdicts"] = {v: sum(1 for r in rows if r["verdict"] == v)
                                                        for v in sorted({r["verdict"] for r in rows})}
    result = {"command": "decoy tests via gradleak.pipeline.decoys; runs: gradleak attack --attack idlg CASE --defense D",
              "cpu": platform.processor() or platform.machine(), "threads": 1,
              "seconds": round(time.perf_counter() - t0, 1), "summary": summary, "decoy_tests": decoys,
              "runs": runs, "presumption": presumed}
    (HERE / "defended_evidence.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
