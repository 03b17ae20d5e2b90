"""attacks/grouped_conv: what writing out the double backward of grouped (depthwise) convolutions
buys a GradInversion step on EfficientNet-Lite0 (224 px, batch 8, one seed, the issue-39 case).

torch's ``_convolution_double_backward`` computes its weight term one convolution PER GROUP; a
depthwise layer has one group per channel. gradleak's attacker copy of the victim routes grouped
convolutions through attacks/grouped_conv.py (native grouped kernels, one call per term). This
measures one Eq. 3 step (the gradient distance, its image gradient: a double backward) both ways
on this CPU, with 1 and 2 threads (median of 3 after a warm-up), and the image gradients'
relative difference (float32; the float64 identity is tested in tests/attacks/test_grouped_conv.py).
The H200 numbers are the ones benchmarks/imagenet_levers.py measured on a lent GPU machine the
same day, before and after the change (imagenet_levers_h200_before.json, imagenet_levers_h200.json;
its ``seconds_per_step``: the same objective pieces).

    .venv/bin/python benchmarks/grouped_conv.py     # ~2 minutes; writes benchmarks/grouped_conv.json
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import imagenet_levers as L  # noqa: E402


def step(case: L.Case, x0: torch.Tensor) -> torch.Tensor:
    from gradleak.attacks.objectives import layer_l2_batched
    x = x0.clone().requires_grad_(True)
    grads, _, _ = case.forward(x, double=True)
    dist = layer_l2_batched([g[None] for g in grads], case.victim.gradient.target)[0]
    return torch.autograd.grad(dist, [x])[0]


def main() -> int:
    case = L.Case("cpu")
    x0 = torch.randn((L.K, 3, L.SIZE, L.SIZE), generator=torch.Generator().manual_seed(0))
    rows, grads = [], {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for routed in (False, True):
            case.victim.gradient.grouped = routed
            step(case, x0)  # warm-up
            times = []
            for _ in range(3):
                t = time.perf_counter()
                grads[routed] = step(case, x0)
                times.append(time.perf_counter() - t)
            rows.append({"threads": threads, "path": "grouped_conv" if routed else "torch",
                         "seconds_per_step": round(statistics.median(times), 3), "seconds": [round(v, 3) for v in times]})
            print(rows[-1], flush=True)
    rel = float((grads[True] - grads[False]).norm() / grads[False].norm())
    gpu = {}
    for name, file in (("torch", "imagenet_levers_h200_before.json"), ("grouped_conv", "imagenet_levers_h200.json")):
        d = json.loads((HERE / file).read_text())
        gpu[name] = {"device": d.get("gpu"), "date": d["date"], "file": file,
                     **{f"{k}_seconds_per_step": round(v, 4) for k, v in d["schedules"]["seconds_per_step"].items()}}
    out = {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S%z"), "torch": torch.__version__,
           "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
           "load_at_end": list(os.getloadavg()),
           "what": "one GradInversion Eq. 3 step (gradient distance + its image gradient), EfficientNet-Lite0 "
                   "pretrained, batch 8, 224 px, one seed, N(0, I) input",
           "cpu_rows": rows, "image_gradient_relative_difference_float32": rel,
           "h200": gpu, "h200_note": "eq3: a step with the double backward, cheap: forward + backward without it "
                                    "(imagenet_levers.step_seconds; torch 2.11 there)"}
    (HERE / "grouped_conv.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("cpu_rows", "image_gradient_relative_difference_float32", "h200")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
