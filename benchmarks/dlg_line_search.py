"""DLG's L-BFGS with and without a strong Wolfe line search (dlg.LBFGS_LINE_SEARCH), on the DLG
LeNet: trained on Fashion-MNIST (`gradleak train`, the training-stage experiment's SGD budget:
one epoch, batch 32, lr 0.01, momentum 0.9; checkpoints at 30 % and 100 %), attacked on held-out
test images (seeds 0-3, as the experiment draws them), and untrained on CIFAR-10 sample photos
(seeds 0-3, `gradleak attack --attack dlg`'s default case). Every other setting is DLG's default
(float64, 300 steps a start, up to 3 restarts; the experiment's zero start on the trained model).

Why it exists: on the trained checkpoints DLG without a line search takes an L-BFGS step of
length lr = 1 into the sigmoids' saturation after ~14 steps (the loss jumps from 2e-3 to 1.3 and
stays there: the gradient vanishes), and every restart ends the same way (relative distance
1e2..1e4). (An earlier attempt to patch the constant through ``import gradleak.attacks.dlg as m``
reached nothing: the package then bound the *function* dlg under the module's name. It no longer
does; importlib.import_module, as here, gives the module either way.)

Writes benchmarks/dlg_line_search.json (about 15 minutes, one thread).

    .venv/bin/python benchmarks/dlg_line_search.py
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import platform
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEEDS = (0, 1, 2, 3)


def main() -> None:
    from gradleak.cli import main as gradleak

    dlg = importlib.import_module("gradleak.attacks.dlg")
    default = dlg.LBFGS_LINE_SEARCH
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        with contextlib.redirect_stdout(io.StringIO()):
            assert gradleak(["train", "--epochs", "1", "--batch-size", "32", "--lr", "0.01", "--momentum", "0.9",
                             "--checkpoints", "0.3,1", "--threads", "1", "--no-progress", "--out", f"{tmp}/train"]) == 0
        training = json.loads(Path(f"{tmp}/train/training.json").read_text())
        cases = [(f"fashion-mnist, trained {c}", ["--model", "lenet-dlg", "--data", "fashion-mnist", "--split", "test",
                                                   "--checkpoint", f"{tmp}/train/checkpoint-{c}.safetensors",
                                                   "--init", "zeros"]) for c in ("0.30", "1.00")]
        cases.append(("cifar10-samples, untrained (the default case)", []))
        for line_search in (None, "strong_wolfe"):
            dlg.LBFGS_LINE_SEARCH = line_search
            for case, flags in cases:
                for seed in SEEDS:
                    out = f"{tmp}/run-{len(rows)}"
                    argv = ["attack", "--attack", "dlg", "--seed", str(seed), *flags, "--threads", "1",
                            "--no-progress", "--no-paper-metrics", "--out", out]
                    with contextlib.redirect_stdout(io.StringIO()):
                        assert gradleak(argv) == 0, argv
                    m = json.loads(Path(out, "metrics.json").read_text())
                    rows.append({"line_search": line_search, "case": case, "seed": seed,
                                 "psnr": round(m["psnr_mean"], 2), "label_accuracy": m["label_accuracy"],
                                 "relative_gradient_distance": m["relative_gradient_distance"],
                                 "verdict": m["verdict"], "iterations": m["iterations"],
                                 "wall_seconds": m["wall_seconds"]})
                    print(json.dumps(rows[-1]), flush=True)
    dlg.LBFGS_LINE_SEARCH = default
    summary = {}
    for line_search in (None, "strong_wolfe"):
        for case, _ in cases:
            sel = [r for r in rows if r["line_search"] == line_search and r["case"] == case]
            summary[f"{line_search or 'none'} | {case}"] = {
                "leaked": sum(r["verdict"] == "leaked" for r in sel), "of": len(sel),
                "psnr": [r["psnr"] for r in sel], "seconds": round(sum(r["wall_seconds"] for r in sel), 1)}
    result = {"command": "gradleak attack --attack dlg --seed S [trained checkpoint, test split, zero start]",
              "training": {k: training.get(k) for k in ("checkpoints", "config") if k in training},
              "cpu": platform.processor() or platform.machine(), "summary": summary, "rows": rows}
    (HERE / "dlg_line_search.json").write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
