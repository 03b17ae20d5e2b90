"""Why the GradInversion run on EfficientNet-Lite0 did not converge: each term of the objective (Eq. 3, 9, 10, with the run's resolved alphas) for the client's true batch, the
run's answer and a fresh N(0, I) start, on the same shared update.

If the truth scored a lower objective than the answer, more iterations could get there (the
optimisation is the limit); if the truth scored higher, the objective itself prefers other
images (the weighting is the limit). Writes terms.json beside this file (or OUT); ~1-2 minutes on CPU.

    .venv/bin/python reproduction/gradinversion-imagenet/terms.py [RUN_DIR [OUT]]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from gradleak.attacks.labels import restore_labels
from gradleak.attacks.priors import bn_prior, bn_targets, l2_norm, total_variation
from gradleak.attacks.simulate import UpdateSimulator
from gradleak.cli import refuse_model_code
from gradleak.config import load_config, make_config
from gradleak.pipeline.image import simulate_client

HERE = Path(__file__).resolve().parent


def main() -> int:
    run = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "run"
    torch.set_num_threads(1)
    values = {k: v for k, v in load_config(run / "config.json").items() if k not in ("out",)}
    # a file never makes gradleak import code: a module:callable model named in it is refused
    refuse_model_code(values.get("model"), None, f"{run / 'config.json'}")
    cfg = make_config(**values)
    metrics = json.loads((run / "metrics.json").read_text())
    s = metrics["settings"]
    case = simulate_client(cfg)
    model, update = case.model, case.update
    victim = UpdateSimulator(model, update)
    labels = restore_labels(update, model, int(update.meta.batch_size), s["labels"])
    targets = bn_targets(update, victim.bn_names, s["bn"])
    answer = load_file(str(run / "reconstruction.safetensors"))["images"]
    gen = torch.Generator().manual_seed(12345)
    batches = {"truth (the client's photos)": model.normalize(case.truth.images),
               f"answer after {metrics['iterations']} iterations (clamped to [0, 1])": model.normalize(answer),
               "N(0, I) start": torch.randn(case.truth.images.shape, generator=gen)}
    rows = []
    for name, x in batches.items():
        # the answer's images are in the slots the attack used; the truth's in the client's order:
        # the truth is scored with the labels in the client's order, the others with the restored ones
        y = case.truth.labels if name.startswith("truth") else labels
        grads, stats = victim.batched(x.unsqueeze(0), y)
        distance = float(victim.gradient.layer_l2(grads)[0].detach())
        bn = float(bn_prior(stats, targets)[0].detach())
        tv, l2 = float(total_variation(x.unsqueeze(0))[0]), float(l2_norm(x.unsqueeze(0))[0])
        terms = {"alpha_G L_grad": s["alpha_g"] * distance, "alpha_BN R_BN": s["alpha_bn"] * bn,
                 "alpha_TV R_TV": s["alpha_tv"] * tv, "alpha_l2 R_l2": s["alpha_l2"] * l2}
        rows.append({"batch": name, "L_grad (Eq. 3 without alpha_G)": distance, "R_BN": bn, "R_TV": tv, "R_l2": l2,
                     **terms, "objective": sum(terms.values())})
        print(json.dumps(rows[-1]), flush=True)
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else HERE / "terms.json"
    out.write_text(json.dumps({"run": str(run.relative_to(HERE.parent.parent)) if run.is_relative_to(
        HERE.parent.parent) else str(run), "alphas": {k: s[k] for k in ("alpha_g", "alpha_bn", "alpha_tv", "alpha_l2")},
        "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
