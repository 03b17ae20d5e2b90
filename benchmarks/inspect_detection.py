"""Detection rate of `gradleak inspect` (gradleak/fl/inspect.py) against the share of a layer's
rows a malicious structure takes, and the honest models' largest parallel group (the false
positives the group threshold must avoid).

- imprint: ``k`` of the 128 rows of the mlp's first layer (width 128, reading the 3x32x32
  image) replaced by imprint bins (one measurement, the input's mean as models/imprint.py takes
  it, distinct thresholds), the other rows honest; k = 1, 2, 3, 4, 8, 16, 32, 48, 64, 96, 128;
  seeds 0-4 (the model and which rows).
- trap: ``k`` of the same rows replaced by trap rows (random rows in pixel space with their
  positive entries scaled by 0.5, folded into the normalisation as models/trap.py folds them),
  to show how much of the layer the trap test (a mean over rows) needs.
- honest: random-init mlp, convnet, LeNet and ResNet-18 CIFAR, seeds 0-4: the largest group of
  parallel rows / columns over all their layers, and whether anything was found.

Writes benchmarks/inspect_detection.json (every row; about a minute, one thread).

    .venv/bin/python benchmarks/inspect_detection.py
"""

from __future__ import annotations

import json
import math
import platform
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
SHARES = (1, 2, 3, 4, 8, 16, 32, 48, 64, 96, 128)
SEEDS = range(5)
ROWS = 128


def _mlp(seed: int) -> Any:
    from gradleak.models import build_model

    return build_model("mlp", num_classes=10, width=ROWS, seed=seed)


def _imprint(seed: int, k: int) -> dict[str, torch.Tensor]:
    spec = _mlp(seed)
    state = dict(spec.module.state_dict())
    g = torch.Generator().manual_seed(seed)
    w, b = state["fc1.weight"].clone(), state["fc1.bias"].clone()
    rows = torch.randperm(ROWS, generator=g)[:k].sort().values
    scale = float(w.norm(dim=1).mean()) / math.sqrt(w.shape[1])
    w[rows] = scale
    b[rows] = -scale * torch.linspace(-1.0, 1.0, k) * math.sqrt(w.shape[1])
    return {**state, "fc1.weight": w, "fc1.bias": b}


def _trap(seed: int, k: int, shrink: float = 0.5) -> dict[str, torch.Tensor]:
    spec = _mlp(seed)
    state = dict(spec.module.state_dict())
    g = torch.Generator().manual_seed(seed)
    w = state["fc1.weight"].clone().double()
    rows = torch.randperm(ROWS, generator=g)[:k].sort().values
    pix = torch.randn(k, w.shape[1], generator=g, dtype=torch.float64)
    pix = torch.where(pix > 0, pix * shrink, pix)
    std = torch.tensor(spec.std, dtype=torch.float64).repeat_interleave(32 * 32)
    rms = float(w.pow(2).sum(1).mean().sqrt())
    folded = pix * std
    w[rows] = folded * (rms / float(folded.pow(2).sum(1).mean().sqrt()))
    return {**state, "fc1.weight": w.float()}


def _detect(state: dict[str, torch.Tensor]) -> dict[str, Any]:
    from gradleak.fl.inspect import inspect_model

    r = inspect_model(state, "mlp", num_classes=10, width=ROWS)
    fc1 = r.layers[0].stats
    return {"checks": sorted({f"{name}:{f.check}" for name, f in r.findings}),
            "group": fc1.get("parallel_rows_group"), "median_parallel": round(fc1.get("parallel_rows", 0.0), 4),
            "trap_t": round(fc1.get("trap_t", 0.0), 2), "trap_mean_z": round(fc1.get("trap_mean_z", 0.0), 3)}


def _honest() -> list[dict[str, Any]]:
    from gradleak.fl.inspect import inspect_model
    from gradleak.models import build_model

    rows = []
    for arch, kw in (("mlp", {"width": ROWS}), ("mlp", {}), ("convnet", {}), ("lenet-dlg", {}),
                     ("resnet18-cifar", {})):
        for seed in SEEDS:
            state = build_model(arch, num_classes=10, seed=seed, **kw).module.state_dict()
            r = inspect_model(state, arch, num_classes=10, **kw)
            groups = [v for layer in r.layers for key, v in layer.stats.items() if key.endswith("_group")]
            rows.append({"model": arch, **kw, "seed": seed, "suspicious": r.suspicious,
                         "largest_group": max(groups) if groups else None})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rows = []
    for kind, build in (("imprint", _imprint), ("trap", _trap)):
        for k in SHARES:
            for seed in SEEDS:
                found = _detect(build(seed, k))
                hit = any(c.startswith("fc1:") for c in found["checks"])
                rows.append({"kind": kind, "rows": k, "share": k / ROWS, "seed": seed, "found": hit, **found})
                print(json.dumps(rows[-1]), flush=True)
    table = {kind: {str(k): sum(r["found"] for r in rows if r["kind"] == kind and r["rows"] == k) / len(SEEDS)
                    for k in SHARES} for kind in ("imprint", "trap")}
    honest = _honest()
    out = {"what": "detection rate of gradleak inspect against the share of the mlp's 128 first-layer rows a "
                   "structure takes (5 seeds), and the honest models' largest parallel group",
           "detection_rate": table, "honest_false_positives": sum(r["suspicious"] for r in honest),
           "honest_largest_group": max((r["largest_group"] or 0) for r in honest),
           "rows": rows, "honest": honest, "seconds": round(time.perf_counter() - t0, 1),
           "torch": torch.__version__, "python": platform.python_version()}
    (HERE / "inspect_detection.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
