"""Two more measurements of issue 6 (gradleak only, no peer):

* ``seeds``: GradInversion with G = 8 seeds as ONE batched computation vs eight sequential
  single-seed runs (seeds 0..7, same iterations; group "none", so the two are the same attack:
  seed g of the batched run draws from the generator seeded ``seed + g``, exactly as the
  sequential run with ``seed = g``). ConvNet, batch 4, 32 px, preset "cpu", client BN
  statistics shared. Target: batched <= 0.5x sequential. The largest pixel difference between
  the batched candidates and the sequential answers is recorded too (the same attack).
* ``dlg_default``: the DLG job of issue 6, ``gradleak attack --attack dlg`` with no other options
  (lenet-dlg, batch 1, cifar10-samples, seed 0, 300 L-BFGS steps per start with the settled stop,
  float64; until 2026-11-26 DLG was the default attack, now ``auto`` is, whose whole run on this
  job whole_runs.py measures): the wall time from calling the attack to
  the first step whose image MSE (gradleak's paired MSE vs the original) is <= 1e-4, and the final
  MSE. Targets: <= 15 s, final MSE <= 3.3e-6 (DLG paper). Measured in-process with a timed observer
  every step (observer time taken out), and once more end to end as the real command
  (``gradleak attack --attack dlg --out TMP --no-progress --threads N``: process start to exit, imports, client simulation and
  the run folder's paper metrics included).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from gradleak.engine import Engine
from gradleak.config import make_config
from gradleak.metrics import evaluate, match
from gradleak.metrics.image import mse
from gradleak.pipeline import build_case

SEEDS_TARGET = 0.5
DLG_SECONDS_TARGET = 15.0
DLG_MSE_REACH = 1e-4
DLG_MSE_FINAL_TARGET = 3.3e-6


def _gi_config(seeds: int, seed: int, iterations: int, threads: int):  # noqa: ANN202
    return make_config(attack="gradinversion", model="convnet", batch_size=4, seed=seed, iterations=iterations,
                       threads=threads, progress=False, preset="cpu", seeds=seeds, group="none",
                       share_bn_statistics=True)


def measure_seeds(*, quick: bool, threads: int, g: int = 8, device: str = "cpu") -> dict[str, Any]:
    """G seeds batched vs G sequential single-seed runs on the same client update (the attack on
    ``device``; benchmarks/gpu.py runs it on a GPU)."""
    iterations, rounds = (5, 1) if quick else (30, 2)
    torch.set_num_threads(threads)
    cfg = _gi_config(g, 0, iterations, threads)
    case = build_case(cfg)  # the client update: the batch is drawn with seed 0 in both settings
    # the typed attack configs, resolved on that one update: G seeds from seed 0, and G single-seed runs
    batched_config = case.attack_config(cfg)
    single = [case.attack_config(_gi_config(1, s, iterations, threads)) for s in range(g)]

    def engine() -> Engine:  # a fresh one per run (its session records that run's recoveries)
        return Engine(device=device, log_every=cfg.log_every, progress=False)

    def run_batched() -> tuple[float, float, Any]:
        t = time.perf_counter()
        rec = engine().run(batched_config, case.update, case.model)
        return time.perf_counter() - t, rec.wall_seconds, rec

    def run_sequential() -> tuple[float, float, list[Any]]:
        t = time.perf_counter()
        recs = [engine().run(s, case.update, case.model) for s in single]
        return time.perf_counter() - t, sum(r.wall_seconds for r in recs), recs

    engine().run(single[0], case.update, case.model)  # warm-up
    rows = []
    b_rec = s_recs = None
    for r in range(rounds):  # alternate the order so drifting load hits both alike
        if r % 2 == 0:
            s_total, s_loop, s_recs = run_sequential()
            b_total, b_loop, b_rec = run_batched()
        else:
            b_total, b_loop, b_rec = run_batched()
            s_total, s_loop, s_recs = run_sequential()
        rows.append({"batched_total_s": b_total, "batched_loop_s": b_loop,
                     "sequential_total_s": s_total, "sequential_loop_s": s_loop,
                     "ratio_total": b_total / s_total, "ratio_loop": b_loop / s_loop})
    assert b_rec is not None and s_recs is not None
    cand = b_rec.candidates  # [G, K, C, H, W] pixels
    diff = max(float((cand[i] - s_recs[i].images).abs().max()) for i in range(g))
    ratio = statistics.median(r["ratio_total"] for r in rows)
    return {
        "seeds": g, "iterations": iterations, "rounds": rounds, "model": "convnet", "batch_size": 4, "device": device,
        "group": "none", "preset": "cpu", "rows": rows,
        "batched_total_s": statistics.median(r["batched_total_s"] for r in rows),
        "sequential_total_s": statistics.median(r["sequential_total_s"] for r in rows),
        "ratio": ratio, "ratio_loop": statistics.median(r["ratio_loop"] for r in rows),
        "target": SEEDS_TARGET, "met": ratio <= SEEDS_TARGET,
        "max_pixel_difference_batched_vs_sequential": diff,
    }


class _MSEObserver:
    """Snapshots every step with a timestamp; its own time is taken out."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.overhead = 0.0
        self.points: list[tuple[int, float, torch.Tensor]] = []

    def __call__(self, iteration: int, images: torch.Tensor) -> None:
        start = time.perf_counter()
        self.points.append((int(iteration), start - self.t0 - self.overhead, images.detach().float().cpu().clone()))
        self.overhead += time.perf_counter() - start


def _paired_mse(images: torch.Tensor, truth: torch.Tensor) -> float:
    imgs = torch.nan_to_num(images.float()).clamp(0, 1)
    return float(mse(imgs[match(imgs, truth)], truth).mean())


def measure_dlg_default(*, quick: bool, threads: int, root: Path) -> dict[str, Any]:
    """The DLG job (``gradleak attack --attack dlg``), in-process with a timed observer, then as the command."""
    torch.set_num_threads(threads)
    extra: dict[str, Any] = {"iterations": 20} if quick else {}
    cfg = make_config(attack="dlg", progress=False, log_every=1, threads=threads, **extra)
    defaults = make_config(attack="dlg")
    t_start = time.perf_counter()
    case = build_case(cfg)
    setup = time.perf_counter() - t_start
    typed = case.attack_config(cfg)
    obs = _MSEObserver()
    rec = Engine(device=torch.device("cpu"), observer=obs, log_every=cfg.log_every, progress=False).run(
        typed, case.update, case.model)
    total = time.perf_counter() - obs.t0 - obs.overhead
    assert case.truth is not None
    ev = evaluate(rec, case.truth)
    trajectory = [{"iteration": it, "seconds": round(t, 4), "mse": _paired_mse(img, case.truth.images)}
                  for it, t, img in obs.points]
    reached = next((p for p in trajectory if p["mse"] <= DLG_MSE_REACH), None)
    out: dict[str, Any] = {
        "config": {"attack": defaults.attack, "model": defaults.model, "data": defaults.data,
                   "batch_size": defaults.batch_size, "seed": defaults.seed},
        "resolved": typed.model_dump(), "iterations": rec.iterations, "trials": rec.extra.get("trials"),
        "quick_iterations_override": extra.get("iterations"),
        "client_setup_s": setup, "attack_total_s": total, "loop_s": rec.wall_seconds - obs.overhead,
        "seconds_to_mse_1e-4": reached["seconds"] if reached else None,
        "iteration_to_mse_1e-4": reached["iteration"] if reached else None,
        "final_mse": ev.mse_mean, "final_psnr": ev.psnr_mean,
        "best_trajectory_mse": min((p["mse"] for p in trajectory), default=None),
        "trajectory": trajectory[:: max(1, len(trajectory) // 50)] + trajectory[-1:],
        "targets": {"seconds_to_mse_1e-4": DLG_SECONDS_TARGET, "final_mse": DLG_MSE_FINAL_TARGET},
    }
    out["met_time"] = reached is not None and reached["seconds"] <= DLG_SECONDS_TARGET
    out["met_final_mse"] = ev.mse_mean <= DLG_MSE_FINAL_TARGET

    # The real command, end to end (process wall time), default threads (torch's choice).
    exe = Path(sys.executable).with_name("gradleak")
    with tempfile.TemporaryDirectory(prefix="bench-dlg-", dir=root) as tmp:
        run_dir = Path(tmp) / "run"
        # --threads: the harness's thread count (the only option added; torch's default is all cores)
        cmd = [str(exe), "attack", "--attack", "dlg", "--out", str(run_dir), "--no-progress", "--threads", str(threads)]
        if quick:
            cmd += ["--iterations", "20"]
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        wall = time.perf_counter() - t
        cli: dict[str, Any] = {"command": " ".join(["gradleak", *cmd[1:4], *(cmd[6:])]) + " (--out a temp folder)",
                               "returncode": proc.returncode, "process_wall_s": wall}
        metrics_file = run_dir / "metrics.json"
        if proc.returncode == 0 and metrics_file.exists():
            m = json.loads(metrics_file.read_text())
            cli.update({"attack_wall_s": m.get("wall_seconds"), "final_mse": m.get("mse_mean"),
                        "final_psnr": m.get("psnr_mean"), "iterations": m.get("iterations")})
        else:
            cli["stderr_tail"] = "\n".join(proc.stderr.splitlines()[-10:])
    out["command_run"] = cli
    return out
