"""Issue 20, DLG case: how fast can a whole DLG run be on this CPU, whatever its optimiser costs?

whole_runs.py measures gradleak's DLG run (`--attack dlg`, the default attack until 2026-11-26,
now `auto`, which picks R-GAP's closed form on this case) at 1.4x breaching's whole run. This asks
whether any implementation of DLG's own method (L-BFGS on the gradient distance, image and soft
label jointly, float64) could reach the issue's 3x, by splitting the run's time into

* the cost of ONE evaluation of DLG's objective and its derivative w.r.t. the image and the soft
  label (dummy gradient with create_graph, squared distance, second backward), timed alone in a
  loop (median of rounds), in float64 (the precision DLG needs: in float32 it stalls near MSE
  5e-5, dlg.py) and, for reference, float32 with and without oneDNN;
* the NUMBER of evaluations the DLG run makes (torch's 20 per L-BFGS step, the settled stop),
  on several photos, with L-BFGS's history at DLG's 100 (torch's default) and at 300 (the
  "fewer iterations" lever: more curvature pairs, fewer steps, a costlier direction).

The floor of a run is (evaluations) x (cost of one evaluation): the run with an optimiser that
costs nothing. Its ratio to breaching's whole run (whole_runs.json, the same photo) bounds the
speed-up any DLG implementation with these settings can reach here.

    .venv/bin/python benchmarks/dlg_floor.py [--photos 4] [--histories 100,300]

Writes benchmarks/dlg_floor.json (about 5 minutes on one thread).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from whole_runs import _bench  # noqa: E402  (benchmarks/run.py as a module: cases, gradleak runs, scoring)

OUT = HERE / "dlg_floor.json"


def evaluation_ms(case, dtype: torch.dtype, onednn: bool, rounds: int = 5, n: int = 200) -> float:  # noqa: ANN001
    """Median over rounds of the time of one DLG evaluation (value and derivative w.r.t. image
    and soft label), as the attack's closure computes it."""
    from gradleak.attacks.objectives import squared_l2
    from gradleak.attacks.simulate import UpdateSimulator
    model = case.model
    victim = UpdateSimulator(model, case.update, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((1, *model.input_shape), generator=gen, dtype=dtype).requires_grad_(True)
    y = torch.randn((1, model.num_classes), generator=gen, dtype=dtype).requires_grad_(True)

    def evaluate() -> None:
        loss = squared_l2(victim(x, y), victim.target)
        torch.autograd.grad(loss, [x, y])
    times = []
    with torch.backends.mkldnn.flags(enabled=onednn):
        for _ in range(30):
            evaluate()
        for _ in range(rounds):
            t = time.perf_counter()
            for _ in range(n):
                evaluate()
            times.append((time.perf_counter() - t) / n * 1e3)
    return statistics.median(times)


def with_history(loop_module, history: int):  # noqa: ANN001, ANN202
    """LoopSettings whose L-BFGS history defaults to ``history`` (DLG builds its settings without
    naming it); returns the original __init__ to restore."""
    original = loop_module.LoopSettings.__init__

    def init(self, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        kwargs.setdefault("lbfgs_history", history)
        original(self, *args, **kwargs)
    loop_module.LoopSettings.__init__ = init
    return original


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--photos", type=int, default=4, help="CIFAR-10 sample photos (seeds 0..N-1)")
    p.add_argument("--histories", default="100,300", help="L-BFGS history sizes to run")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=OUT, help="the JSON written (default benchmarks/dlg_floor.json)")
    p.add_argument("--whole-runs", type=Path, default=HERE / "whole_runs.json",
                   help="whole_runs.json whose DLG case gives breaching's whole run (the reference)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    bench = _bench()
    from gradleak.engine import settings as loop_module
    spec = bench.CASES["dlg"]
    whole = json.loads(args.whole_runs.read_text())["cases"].get("dlg") if args.whole_runs.exists() else None
    reference_db = whole["breaching"]["psnr"] if whole else 45.0
    breaching_s = whole["breaching"]["total_seconds"] if whole else None

    def case_for(seed: int):  # noqa: ANN202
        cfg = bench.make_config(attack=spec.attack, model=spec.model, data="cifar10-samples", batch_size=1, seed=seed,
                                threads=args.threads, log_every=spec.log_every, progress=False, **spec.fields)
        return cfg, bench.build_case(cfg)

    cfg0, case0 = case_for(0)
    costs = {"float64": evaluation_ms(case0, torch.float64, True),
             "float32": evaluation_ms(case0, torch.float32, True),
             "float32_without_onednn": evaluation_ms(case0, torch.float32, False)}
    bench.log(f"one evaluation: {', '.join(f'{k} {v:.3f} ms' for k, v in costs.items())}")
    runs: list[dict[str, Any]] = []
    for history in (int(h) for h in args.histories.split(",")):
        original = with_history(loop_module, history)
        try:
            for seed in range(args.photos):
                cfg, case = (cfg0, case0) if seed == 0 else case_for(seed)
                raw = bench.run_gradleak(spec, case, cfg)
                r = bench.finish(raw, case.truth, reference_db, "gradleak")
                evals = r["lbfgs_evaluations"]
                row = {"history": history, "seed": seed, "photo": case.truth.names[0], "steps": r["iterations"],
                       "evaluations": evals, "seconds": round(r["total_seconds"], 2), "psnr": round(r["psnr"], 2),
                       "mse": 10 ** (-r["psnr"] / 10), "mse<=3.3e-06": r["psnr"] >= -10 * math.log10(3.3e-6),
                       "seconds_per_evaluation_ms": round(1e3 * r["total_seconds"] / evals, 3),
                       "optimizer_and_loop_ms_per_evaluation": round(1e3 * r["total_seconds"] / evals - costs["float64"], 3),
                       "floor_seconds": round(evals * costs["float64"] / 1e3, 2),
                       "seconds_to_reference_psnr": r.get("seconds_to_threshold"),
                       "step_to_reference_psnr": r.get("iteration_to_threshold")}
                if seed == 0 and breaching_s:
                    row["breaching_whole_run_seconds"] = round(breaching_s, 2)
                    row["speedup_whole_run"] = round(breaching_s / r["total_seconds"], 2)
                    row["speedup_at_floor"] = round(breaching_s / row["floor_seconds"], 2)
                runs.append(row)
                bench.log(json.dumps(row))
        finally:
            loop_module.LoopSettings.__init__ = original
    summary = {}
    for history in sorted({r["history"] for r in runs}):
        rows = [r for r in runs if r["history"] == history]
        summary[str(history)] = {
            "photos": len(rows), "mean_seconds": round(statistics.mean(r["seconds"] for r in rows), 2),
            "mean_evaluations": round(statistics.mean(r["evaluations"] for r in rows)),
            "mean_floor_seconds": round(statistics.mean(r["floor_seconds"] for r in rows), 2),
            "below_3.3e-6": sum(r["mse<=3.3e-06"] for r in rows),
            "psnr": [r["psnr"] for r in rows]}
    out = {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "machine": bench.machine_info(args.threads), "loadavg_end": bench.loadavg(),
           "reference_psnr_db": reference_db, "reference": "breaching's whole-run final PSNR (whole_runs.json, photo 0)",
           "breaching_whole_run_seconds": breaching_s, "evaluation_ms": costs, "summary": summary, "runs": runs}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"evaluation_ms": costs, "summary": summary}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
