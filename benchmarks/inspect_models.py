"""Issue 41 part 3: false positives and detections of the client's check of a received model
(`gradleak inspect`, gradleak/fl/inspect.py), the measurements its thresholds are declared from.

Honest models (each must come out clean): the pretrained EfficientNet-Lite0 and its random build,
torchvision ResNet-18 / ResNet-50 (random init, 224 px; their pretrained weights are not available
offline), ResNet-18 with the CIFAR stem, the convnet, mlp and DLG LeNet, untrained (model seeds 0-2)
and trained on Fashion-MNIST with `gradleak train` (1 epoch on 2000 images, and the mlp for 2 epochs
on 20000). Malicious servers (each must be found): the imprint block (models/imprint.py) at several
bin counts and gains, the trap weights (models/trap.py) at several shrinks, row counts and firing
rates (the shrink calibrated on public photos), in front of ResNet-18 CIFAR and of ResNet-18 at
224 px, and one residual block's last BatchNorm scaled by 3..1000 (ResNet-18 CIFAR, ResNet-50,
EfficientNet-Lite0 pretrained). Per model: the checks that fired and the statistics each threshold
reads (per-layer maxima and minima), and the margins: the honest models' worst values beside the
thresholds. Writes benchmarks/inspect_models.json (about 2 minutes, one thread).

    .venv/bin/python benchmarks/inspect_models.py
"""

from __future__ import annotations

import contextlib
import io
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent


def _summary(r: Any) -> dict[str, Any]:
    """The checks that fired and the statistics the thresholds read, over the whole model."""
    def stat(key: str, fn: Any, readers: bool = False) -> float | None:
        vals = [layer.stats[key] for layer in r.layers if key in layer.stats and (layer.reads_image or not readers)]
        return round(fn(vals), 4) if vals else None

    trap = [layer.stats for layer in r.layers if layer.reads_image and "trap_t" in layer.stats]
    worst = min(trap, key=lambda s: s["trap_t"]) if trap else None
    return {"suspicious": r.suspicious,
            "checks": sorted({f.check for _, f in r.findings}),
            "findings": [f"{name}: {f.check} {f.score:.4g}" for name, f in r.findings],
            "max_parallel_rows": stat("parallel_rows", max), "max_parallel_columns": stat("parallel_columns", max),
            "max_gain_ratio": stat("gain_ratio", max),
            "image_layer_trap": None if worst is None else {k: round(v, 4) for k, v in worst.items()
                                                             if k.startswith("trap_")}}


def _inspect(name: str, state: dict[str, torch.Tensor], arch: str, **kw: Any) -> dict[str, Any]:
    from gradleak.fl.inspect import inspect_model

    t0 = time.perf_counter()
    r = inspect_model(state, arch, **kw)
    row = {"model": name, "arch": arch, **_summary(r), "seconds": round(time.perf_counter() - t0, 3)}
    print(json.dumps({k: row[k] for k in ("model", "suspicious", "checks", "max_parallel_rows", "max_gain_ratio",
                                         "image_layer_trap", "seconds")}), flush=True)
    return row


def honest(tmp: Path) -> list[dict[str, Any]]:
    from safetensors.torch import load_file

    from gradleak.cli import main as gradleak
    from gradleak.models import build_model

    rows = []
    for arch, classes, seeds in (("efficientnet-lite0", 1000, (0,)), ("efficientnet-lite0-random", 1000, (0, 1)),
                                 ("resnet18", 1000, (0, 1)), ("resnet50", 1000, (0, 1)),
                                 ("resnet18-cifar", 10, (0, 1, 2)), ("convnet", 10, (0, 1, 2)),
                                 ("mlp", 10, (0, 1, 2)), ("lenet-dlg", 10, (0, 1, 2))):
        for seed in seeds:
            spec = build_model(arch, num_classes=classes, seed=seed)
            rows.append(_inspect(f"{arch} seed {seed}" + (" (pretrained)" if arch == "efficientnet-lite0" else ""),
                                 spec.module.state_dict(), arch, num_classes=classes))
    for arch, images, epochs in (("mlp", 2000, 1), ("mlp", 20000, 2), ("convnet", 2000, 1), ("lenet-dlg", 2000, 1)):
        out = tmp / f"{arch}-{images}"
        with contextlib.redirect_stdout(io.StringIO()):
            rc = gradleak(["train", "--model", arch, "--data", "fashion-mnist", "--epochs", str(epochs),
                           "--train-subset", str(images), "--test-subset", "200", "--checkpoints", "1.0",
                           "--threads", "1", "--no-progress", "--out", str(out)])
        assert rc == 0, arch
        acc = json.loads((out / "training.json").read_text())["checkpoints"][-1]["test_accuracy"]
        row = _inspect(f"{arch} trained ({epochs} epoch(s), {images} Fashion-MNIST images, accuracy {acc:.2f})",
                       load_file(out / "checkpoint-1.00.safetensors"), arch, num_classes=10, channels=1)
        rows.append(row)
    return rows


def malicious() -> list[dict[str, Any]]:
    from gradleak.models import build_model
    from gradleak.models.imprint import default_brightness_prior, imprint_model
    from gradleak.models.trap import calibrate_shrink, trap_model

    rows = []
    cifar = build_model("resnet18-cifar", num_classes=10)
    mean, std = default_brightness_prior(cifar)
    for bins in (2, 8, 64, 256):
        for gain in (1.0, 100.0, 1e4):
            m = imprint_model(cifar, bins=bins, mean=mean, std=std, gain=gain)
            row = _inspect(f"imprint bins={bins} gain={gain:g}", m.module.state_dict(), "resnet18-cifar", num_classes=10)
            rows.append({"server": "imprint", "bins": bins, "gain": gain, **row})
    for rows_n in (8, 64, 1000):
        for shrink in (0.01, 0.02, 0.03, 0.06, 0.1, 0.3):
            m = trap_model(cifar, rows=rows_n, shrink=shrink, seed=0)
            row = _inspect(f"trap rows={rows_n} shrink={shrink}", m.module.state_dict(), "resnet18-cifar",
                           num_classes=10)
            rows.append({"server": "trap", "rows": rows_n, "shrink": shrink, **row})
    for rate in (0.05, 0.125, 0.25, 0.4):
        shrink = calibrate_shrink(cifar.input_shape, rate)
        m = trap_model(cifar, rows=1000, shrink=shrink, seed=1)
        row = _inspect(f"trap rows=1000 rate={rate} (shrink {shrink})", m.module.state_dict(), "resnet18-cifar",
                       num_classes=10)
        rows.append({"server": "trap", "rows": 1000, "rate": rate, "shrink": shrink, **row})
    big = build_model("resnet18", num_classes=1000)
    for rate in (0.125, 0.25):
        shrink = calibrate_shrink(big.input_shape, rate)
        m = trap_model(big, rows=256, shrink=shrink, seed=0)
        row = _inspect(f"trap 224 px rows=256 rate={rate} (shrink {shrink})", m.module.state_dict(), "resnet18",
                       num_classes=1000)
        rows.append({"server": "trap", "rows": 256, "rate": rate, "shrink": shrink, "image_size": 224, **row})
    for arch, classes, layer in (("resnet18-cifar", 10, "layer2.0.bn2"), ("resnet50", 1000, "layer3.1.bn3"),
                                 ("efficientnet-lite0", 1000, "_blocks.5._bn2")):
        base = build_model(arch, num_classes=classes).module.state_dict()
        for factor in (3.0, 10.0, 30.0, 100.0, 1000.0):
            state = dict(base)
            state[f"{layer}.weight"] = base[f"{layer}.weight"] * factor
            state[f"{layer}.bias"] = base[f"{layer}.bias"] * factor
            row = _inspect(f"{arch}: {layer} x {factor:g}", state, arch, num_classes=classes)
            rows.append({"server": "scaled-block", "layer": layer, "factor": factor, **row})
    return rows


def margins(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def worst(key: str, fn: Any) -> float | None:
        vals = [r[key] for r in rows if r[key] is not None]
        return fn(vals) if vals else None

    trap = [r["image_layer_trap"] for r in rows if r["image_layer_trap"]]
    return {"max_parallel_rows": worst("max_parallel_rows", max),
            "max_parallel_columns": worst("max_parallel_columns", max),
            "max_gain_ratio": worst("max_gain_ratio", max),
            "image_layers_min_trap_t": min(t["trap_t"] for t in trap),
            "image_layers_min_trap_mean_z": min(t["trap_mean_z"] for t in trap),
            "image_layers_max_trap_negative": max(t["trap_negative"] for t in trap),
            "image_layers_max_abs_trap_mean_z": max(abs(t["trap_mean_z"]) for t in trap)}


def main() -> None:
    from gradleak.fl.inspect import thresholds

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        good = honest(Path(tmp))
    bad = malicious()
    detected: dict[str, list[str]] = {}
    for r in bad:
        detected.setdefault(r["server"], []).append(r["model"])
    result = {"thresholds": thresholds(), "cpu": platform.processor() or platform.machine(),
              "seconds": round(time.perf_counter() - t0, 1),
              "honest": {"models": len(good), "flagged": [r["model"] for r in good if r["suspicious"]],
                         "margins": margins(good), "rows": good},
              "malicious": {"models": len(bad), "missed": [r["model"] for r in bad if not r["suspicious"]],
                            "per_server": {s: {"models": len(v),
                                               "detected": sum(r["suspicious"] for r in bad if r["server"] == s),
                                               "by_check": {c: sum(c in r["checks"] for r in bad if r["server"] == s)
                                                            for c in sorted({c for r in bad for c in r["checks"]})}}
                                           for s, v in detected.items()},
                            "trap_rows_missed": [r["model"] for r in bad
                                                 if r["server"] == "trap" and "trap-rows" not in r["checks"]],
                            "rows": bad}}
    (HERE / "inspect_models.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"honest_flagged": result["honest"]["flagged"], "margins": result["honest"]["margins"],
                      "missed": result["malicious"]["missed"],
                      "trap_rows_missed": result["malicious"]["trap_rows_missed"], "per_server": result["malicious"]["per_server"],
                      "seconds": result["seconds"]}, indent=1))


if __name__ == "__main__":
    main()
