"""What the shared update cannot tell apart at 224 px: the client's own photos moved (shifted,
rolled, flipped) or blurred, scored like an attack's answer. For each variant of the true batch:
its relative gradient distance to the update (the verdict's quantity, attacks/verdict.py; the
line is 0.4), its BN-statistics distance R_BN (Eq. 10), and its PSNR against the photos, beside
the zero image's (a flat image of the model's normalisation mean colour).

A variant that explains the update better than any attack's answer (1.3-3.1 here) while it
scores a PSNR below the zero image shows that the PSNR goal asks for something the update does
not pin down: where the content sits in the frame. Builds the case from this folder's committed
config.json (EfficientNet-Lite0, 8 ImageNet photos, batch 8, BN statistics shared); ~3 minutes on
2 CPU threads. Writes ambiguity.json beside this file (or OUT).

    .venv/bin/python reproduction/gradinversion-imagenet/ambiguity.py [OUT]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from gradleak.attacks.priors import bn_prior, bn_targets
from gradleak.attacks.simulate import UpdateSimulator
from gradleak.attacks.verdict import relative_distance
from gradleak.cli import refuse_model_code
from gradleak.config import load_config, make_config
from gradleak.metrics.image import psnr
from gradleak.pipeline.image import simulate_client

HERE = Path(__file__).resolve().parent


def shift(x: torch.Tensor, dx: int, dy: int) -> torch.Tensor:
    """Translate by (dx, dy) pixels (right, down), the uncovered border replicated from the edge
    (no wrap-around)."""
    h, w = x.shape[-2:]
    y = F.pad(x, (max(dx, 0), max(-dx, 0), max(dy, 0), max(-dy, 0)), mode="replicate")
    top, left = max(-dy, 0), max(-dx, 0)
    return y[..., top:top + h, left:left + w]


def blur(x: torch.Tensor, size: int) -> torch.Tensor:
    """The photos at size x size px, bilinear back up to their size (the low-resolution oracle)."""
    small = F.interpolate(x, size=(size, size), mode="area")
    return F.interpolate(small, size=x.shape[-2:], mode="bilinear", align_corners=False)


def depth_groups(names: list[str]) -> dict[str, list[int]]:
    """The update's tensors by depth: the stem (the tensors before the first block), four quarters
    of the blocks' tensors in network order, and the head and classifier (the tensors after the
    last block), so each row says where in the network its distance comes from."""
    blocks = [i for i, n in enumerate(names) if n.startswith(("blocks.", "_blocks."))] or list(range(len(names)))
    first, last = blocks[0], blocks[-1]
    quarter = [blocks[round(j * len(blocks) / 4):round((j + 1) * len(blocks) / 4)] for j in range(4)]
    out = {"stem": list(range(first)), **{f"blocks {j + 1}/4": q for j, q in enumerate(quarter)},
           "head + classifier": list(range(last + 1, len(names)))}
    return {g: idx for g, idx in out.items() if idx}


def main() -> int:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    values = {k: v for k, v in load_config(HERE / "config.json").items() if k not in ("out",)}
    refuse_model_code(values.get("model"), None, f"{HERE / 'config.json'}")  # a file never imports code
    cfg = make_config(**values)
    case = simulate_client(cfg)
    model, update = case.model, case.update
    victim = UpdateSimulator(model, update)
    targets = bn_targets(update, victim.bn_names, "exact")
    truth, labels = case.truth.images, case.truth.labels
    mean = torch.tensor(model.mean).view(1, -1, 1, 1)
    variants = {"truth": truth, "zero image (flat normalisation mean colour)": mean.expand_as(truth).clone()}
    for d in (1, 2, 4, 8, 16, 32, 56):
        variants[f"shifted right {d} px (edge replicated)"] = shift(truth, d, 0)
    variants["shifted down 16 px (edge replicated)"] = shift(truth, 0, 16)
    variants["shifted right 16, down 16 px"] = shift(truth, 16, 16)
    variants["rolled right 56 px (wrapped)"] = torch.roll(truth, 56, dims=-1)
    variants["rolled right 112 px (wrapped)"] = torch.roll(truth, 112, dims=-1)
    variants["flipped left-right"] = torch.flip(truth, dims=(-1,))
    variants["flipped upside down"] = torch.flip(truth, dims=(-2,))
    for s in (7, 28, 56, 112):
        variants[f"blurred: {s} px bilinear up"] = blur(truth, s)
    for sigma in (0.02, 0.05, 0.1):
        noise = torch.randn(truth.shape, generator=torch.Generator().manual_seed(2))
        variants[f"truth + N(0, {sigma}^2) pixel noise"] = truth + sigma * noise
    variants["uniform noise"] = torch.rand(truth.shape, generator=torch.Generator().manual_seed(1))
    groups = depth_groups(victim.names)
    rows = []
    for name, x in variants.items():
        x = x.clamp(0, 1)
        with torch.enable_grad():
            grads, stats = victim.batched(model.normalize(x).unsqueeze(0), labels)
        grads = [g[0] for g in grads]   # batched: one candidate, G = 1
        rel = relative_distance(grads, victim.target)
        by_depth = {g: relative_distance([grads[i] for i in idx], [victim.target[i] for i in idx])
                    for g, idx in groups.items()}
        per_image = psnr(x, truth)
        rows.append({"variant": name, "relative_gradient_distance": rel,
                     "r_bn": float(bn_prior(stats, targets)[0].detach()), "relative_distance_by_depth": by_depth,
                     "psnr": float(per_image.mean()), "psnr_per_image": [round(float(v), 2) for v in per_image]})
        print(json.dumps(rows[-1]), flush=True)
    zero = next(r for r in rows if r["variant"].startswith("zero"))
    for r in rows:
        r["above_zero_image"] = sum(a > z for a, z in zip(r["psnr_per_image"], zero["psnr_per_image"], strict=True))
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "ambiguity.json"
    out.write_text(json.dumps({"what": __doc__.split("\n\n")[0], "verdict_line": 0.4, "threads": 2,
                               "depth_groups": {g: [victim.names[i] for i in (idx[0], idx[-1])] for g, idx in groups.items()},
                               "torch": torch.__version__, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
