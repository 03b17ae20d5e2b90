"""What the DLG rebuttal's Table 1 may have measured: an attacker that reads a FedAvg update as
one gradient ("it can be approximated as multi-batch case", rebuttal line 9) instead of unrolling
the client's local steps as gradleak's attacks do (attacks/simulate.py).

For 1..4 full-batch local steps (LeNet-dlg, one CIFAR-10 sample photo, local lr 0.1, seeds 0 and
1), the client's update W_S - W_0 is divided by -lr * steps (the mean gradient it would be after
one step) and handed to DLG as a FedSGD gradient (float64 L-BFGS, 300 steps, mid-grey start, the
portfolio of starts). Writes benchmarks/naive_fedavg.json; about 6 minutes on one thread.

    .venv/bin/python benchmarks/naive_fedavg.py
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from gradleak.attacks import Engine
from gradleak.attacks.configs import resolve_attack
from gradleak.config import make_config
from gradleak.metrics import evaluate
from gradleak.pipeline.image import simulate_client

LOCAL_LR = 0.1


def main() -> int:
    torch.set_num_threads(1)
    rows = []
    for steps in (1, 2, 3, 4):
        for seed in (0, 1):
            case = simulate_client(make_config(model="lenet-dlg", threat="fedavg", local_steps=steps,
                                               local_lr=LOCAL_LR, seed=seed, progress=False))
            u = case.update
            naive = u.replace(gradients={k: -v / (LOCAL_LR * steps) for k, v in u.gradients.items()},
                              meta=dataclasses.replace(u.meta, threat={"name": "fedsgd"}))
            cfg = resolve_attack({"attack": "dlg", "seed": seed, "init": "zeros", "dtype": "float64"},
                                 bn_statistics_shared=True)
            rec = Engine().run(cfg, naive, case.model)
            ev = evaluate(rec, case.truth)
            rows.append({"local_steps": steps, "seed": seed, "psnr": round(ev.psnr_mean, 2), "mse": ev.mse_mean,
                         "relative_gradient_distance": rec.extra["relative_gradient_distance"]})
            print(json.dumps(rows[-1]), flush=True)
    out = Path(__file__).with_name("naive_fedavg.json")
    out.write_text(json.dumps({"attacker": "reads the FedAvg update as one gradient", "local_lr": LOCAL_LR,
                               "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
