"""Issue 64: the truth-start test (pipeline/truth_start.py) and the verdicts it gives.

On the DLG LeNet, batch 1, `gradleak attack --attack idlg` as the CLI runs it (the pipeline's
attack_case, then the verdict with the positive control, run once per case: the same attack,
seed and data without the defense, as pipeline/run.with_control runs it), under Gaussian 0.1,
DP-SGD noise 1 and, as a control that must not be credited, Gaussian 0.01:

* parts "seeds" and "photos": the 12 cases of benchmarks/defended_evidence.py (6 seeds of
  cifar10-samples, 6 scikit-image photos at 32 px);
* part "new": 4 scikit-image photos no benchmark or test of the project used before.

Besides, Inverting Gradients from its own random start under Gaussian 0.1 (`--attack ig`, its
control run only when its verdict needs one): does another objective rebuild what iDLG does not?

For each run: the verdict, the answer's PSNR, the decoy test, the truth-start test (PSNR, SSIM,
coarse SSIM per image, iterations, seconds). Writes benchmarks/truth_start.json (each part is
replaced in place; about 10 minutes per part on one busy thread).

    .venv/bin/python benchmarks/truth_start.py --part seeds|photos|new
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFENSES = ("gaussian:0.1", "dpsgd:clip=1,noise=1", "gaussian:0.01")
RUNS = (("idlg", DEFENSES[0]), ("idlg", DEFENSES[1]), ("idlg", DEFENSES[2]), ("ig", DEFENSES[0]))
TUNED_PHOTOS = ("camera", "coins", "moon", "rocket", "retina", "chelsea")
NEW_PHOTOS = ("astronaut", "coffee", "hubble_deep_field", "immunohistochemistry")


def verdicts(values: dict) -> list[dict]:
    """Every defense's run of one case, judged with the case's positive control."""
    import torch

    from gradleak.config import make_config
    from gradleak.outcome import evidence_from_metrics, judge, needs_control
    from gradleak.pipeline.case import build_case
    from gradleak.pipeline.run import attack_case

    cpu = torch.device("cpu")
    t0 = time.perf_counter()
    controls: dict[str, tuple[str, float]] = {}

    def control(attack: str) -> str:
        if attack not in controls:
            t0 = time.perf_counter()
            ccfg = make_config(attack=attack, threads=1, progress=False, **values)
            res, _ = attack_case(ccfg, build_case(ccfg), device=cpu)
            controls[attack] = (res.metrics["verdict"], round(time.perf_counter() - t0, 1))
        return controls[attack][0]

    control("idlg")
    rows = []
    for attack, defense in RUNS:
        t0 = time.perf_counter()
        cfg = make_config(attack=attack, threads=1, progress=False, defense=[defense], **values)
        res, _ = attack_case(cfg, build_case(cfg), device=cpu)
        m = res.metrics
        ev = evidence_from_metrics(m)
        outcome = judge(evidence_from_metrics(m, control=control(attack))) if needs_control(ev) else judge(ev)
        test, start = m.get("decoy_test") or {}, m.get("truth_start_test")
        rows.append({
            "attack": attack, "defense": defense, "verdict": outcome.verdict, "reason": outcome.reason, "next": outcome.next_step,
            "psnr": m.get("psnr_mean"), "ssim": m.get("ssim_mean"),
            "recognisable": [r.get("recognisable_reason") for r in m.get("per_image", []) if r.get("recognisable")],
            "answer_distance": m.get("relative_gradient_distance"), "truth_distance": m.get("truth_relative_distance"),
            "decoy_separated": test.get("separated"), "decoy_truth": test.get("truth"),
            "best_decoy": test.get("best_decoy"), "spread": test.get("spread"), "truth_start_test": start,
            "control": control(attack) if needs_control(ev) else None, "seconds": round(time.perf_counter() - t0, 1)})
        print(json.dumps({k: rows[-1][k] for k in ("attack", "defense", "verdict", "psnr", "decoy_separated")}
                         | {"truth_start": {r["attack"]: round(r["psnr_mean"], 1) for r in (start or {}).get("runs", [])},
                            "walked_away": (start or {}).get("walked_away")}), flush=True)
    return [{"controls": {a: {"verdict": v, "seconds": t} for a, (v, t) in controls.items()}}, *rows]


def write(part: str, names: tuple[str, ...], cases: list[dict], seconds: float, planned: int) -> dict:
    """benchmarks/truth_start.json with this part's cases so far (the other parts kept)."""
    summary = {}
    for attack, defense in RUNS:
        got = [r["verdict"] for c in cases for r in c["runs"] if (r["attack"], r["defense"]) == (attack, defense)]
        summary[f"{attack} {defense}"] = {v: got.count(v) for v in sorted(set(got))} | {"cases": len(got)}
    out = HERE / "truth_start.json"
    result = json.loads(out.read_text()) if out.exists() else {}
    result.update({"command": "benchmarks/truth_start.py: gradleak attack --attack A CASE --defense D (pipeline "
                              "attack_case, verdict with the case's positive control)",
                   "cpu": platform.processor() or platform.machine(), "threads": 1})
    result[part] = {"photos": list(names), "seconds": round(seconds, 1), "cases_planned": planned,
                    "cases_done": len(cases), "summary": summary, "cases": cases}
    out.write_text(json.dumps(result, indent=2) + "\n")
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("seeds", "photos", "new"), required=True)
    p.add_argument("--seeds", type=int, default=6)
    args = p.parse_args()
    sys.path.insert(0, str(HERE))
    import torch

    from robustness import build_photo_set

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    names = () if args.part == "seeds" else TUNED_PHOTOS if args.part == "photos" else NEW_PHOTOS
    cases: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        photos = build_photo_set(Path(tmp) / "photos", names)
        where = ([(f"cifar10-samples seed {s}", {"seed": s}) for s in range(args.seeds)] if args.part == "seeds"
                 else []) + [(f"photo {n}", {"data": str(photos), "indices": [i]}) for i, n in enumerate(names)]
        for label, values in where:
            control, *rows = verdicts(values)
            cases.append({"case": label, **control, "runs": rows})
            summary = write(args.part, names, cases, time.perf_counter() - t0, len(where))   # after every case
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
