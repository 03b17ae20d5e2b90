"""gradleak vs breaching: the same attacks on the same photos, model and batch, on this CPU.

    python benchmarks/run.py                     # all cases, both tools, intrinsic cost
    python benchmarks/run.py --quick             # few iterations: checks the harness in minutes
    python benchmarks/run.py --cases dlg,ig --skip-breaching

Runs in gradleak's venv (``make bench``). The peer framework breaching 0.1.2 runs in its own
venv, ``benchmarks/.venv-breaching`` (created here when missing: ``python -m venv``, then pip
installs torch 2.14.1 / torchvision 0.29.1, the versions gradleak uses, and breaching 0.1.2), as
a subprocess running ``breaching_driver.py``. gradleak's tests never need that venv.

For every case (cases.py) and tool the harness records: time per 1000 iterations (the attack's
optimisation loop, observer time taken out), final PSNR/SSIM of the returned images (gradleak's
``evaluate``: Hungarian pairing by MSE, then per-image PSNR), the PSNR trajectory every
``log_every`` iterations (same pairing + PSNR code on both tools' snapshots) and from it the wall
time to first reach the case's stated PSNR threshold (seconds since the attack was called, setup
included, observer time taken out), and the ratios gradleak / breaching.

Outputs: ``benchmarks/results.json`` and ``benchmarks/RESULTS.md`` (``--quick``: under
``benchmarks/out/quick/`` instead, leaving the recorded results alone), plus per case under
``benchmarks/out/<case>/``: the exchanged case files, breaching's raw output and a PNG with the
originals and both tools' reconstructions.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from cases import CASES, CaseSpec  # noqa: E402
from extras import measure_dlg_default, measure_seeds  # noqa: E402
from intrinsic import lbfgs_evaluations, lbfgs_instances, measure_all  # noqa: E402
from report import render_markdown  # noqa: E402
from whole_runs import OUT_JSON as WHOLE_JSON  # noqa: E402
from whole_runs import whole_case, write_markdown as write_whole_runs  # noqa: E402

import gradleak  # noqa: E402
from gradleak.attacks import Engine, Reconstruction, attack_names  # noqa: E402
from gradleak.config import make_config  # noqa: E402
from gradleak.data import Batch  # noqa: E402
from gradleak.metrics import evaluate, match, psnr  # noqa: E402
from gradleak.pipeline import build_case  # noqa: E402

BREACHING_VENV = HERE / ".venv-breaching"
BREACHING_STAMP = BREACHING_VENV / ".bench-stamp"
# Same torch/torchvision as gradleak (requirements.lock), from this machine's wheels via pip.
BREACHING_PINS = (["torch==2.14.1", "torchvision==0.29.1"], ["breaching==0.1.2"])
DEFAULT_OUT = HERE / "out"


# ----------------------------------------------------------------------------- environment
def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def ensure_breaching_venv() -> Path:
    """The breaching venv's python; create and install it on first use."""
    python = BREACHING_VENV / "bin" / "python"
    wanted = json.dumps(BREACHING_PINS)
    if python.exists() and BREACHING_STAMP.exists() and BREACHING_STAMP.read_text() == wanted:
        return python
    if not python.exists():
        log(f"creating {BREACHING_VENV.relative_to(ROOT)} (python -m venv)")
        subprocess.run([sys.executable, "-m", "venv", str(BREACHING_VENV)], check=True)
    for pins in BREACHING_PINS:
        log(f"pip install {' '.join(pins)} into the breaching venv")
        subprocess.run([str(python), "-m", "pip", "install", "-q", *pins], check=True)
    BREACHING_STAMP.write_text(wanted)
    return python


def breaching_version(python: Path) -> str:
    out = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('breaching'))"],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


def machine_info(threads: int) -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu_model": cpu, "torch_threads": threads,
            "platform": platform.platform(), "python": platform.python_version()}


def loadavg() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


# ----------------------------------------------------------------------------- scoring (both tools)
def paired_psnr(images: torch.Tensor, truth: Batch) -> float:
    """Mean PSNR after optimal pairing: what gradleak's pipeline observer (PSNRObserver) computes."""
    imgs = torch.nan_to_num(images.float()).clamp(0, 1)
    perm = match(imgs, truth.images)
    return float(psnr(imgs[perm], truth.images).mean())


def score(final: torch.Tensor, labels: torch.Tensor, points: list[tuple[int, float]], snapshots: list[torch.Tensor],
          truth: Batch, threshold: float) -> dict[str, Any]:
    """Final quality and trajectory of one tool's run, scored by gradleak's metric code."""
    ev = evaluate(Reconstruction(images=final, labels=labels.reshape(-1).long()), truth)
    trajectory = [{"iteration": it, "seconds": round(t, 4), "psnr": round(paired_psnr(s, truth), 3)}
                  for (it, t), s in zip(points, snapshots)]
    reached = next((p for p in trajectory if p["psnr"] >= threshold), None)
    return {
        "psnr": ev.psnr_mean, "mse": ev.mse_mean, "ssim": ev.ssim_mean, "label_accuracy": ev.label_accuracy,
        "psnr_per_image": [s.psnr for s in ev.per_image],
        "best_trajectory_psnr": max((p["psnr"] for p in trajectory), default=None),
        "threshold_db": threshold,
        "seconds_to_threshold": reached["seconds"] if reached else None,
        "iteration_to_threshold": reached["iteration"] if reached else None,
        "trajectory": trajectory,
        "paired_images": ev.paired_images,
    }


# ----------------------------------------------------------------------------- gradleak
class TimedObserver:
    """gradleak attack observer: snapshots the candidate images with a timestamp; its own cost is
    measured and taken out of every later timestamp (and out of the loop time)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.overhead = 0.0
        self.points: list[tuple[int, float]] = []
        self.snapshots: list[torch.Tensor] = []

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0 - self.overhead

    def __call__(self, iteration: int, images: torch.Tensor) -> None:
        start = time.perf_counter()
        if images.ndim == 5:  # [G, K, ...] candidates: the first seed, as the pipeline's observer does
            images = images[0]
        self.points.append((int(iteration), start - self.t0 - self.overhead))
        self.snapshots.append(images.detach().float().cpu().clone())
        self.overhead += time.perf_counter() - start


def gradleak_config(spec: CaseSpec, iterations: int, threads: int, extra: dict[str, Any] | None = None):  # noqa: ANN201
    return make_config(attack=spec.attack, model=spec.model, data="cifar10-samples", batch_size=spec.batch_size,
                       seed=0, iterations=iterations, threads=threads, log_every=spec.log_every, progress=False,
                       **spec.fields, **(extra or {}))


def typed_attack(case, cfg, attack_kwargs: dict[str, Any] | None = None):  # noqa: ANN001, ANN201
    """The typed attack config ``cfg`` resolves to on ``case`` (as ``gradleak.pipeline.run``
    resolves it), with ``attack_kwargs`` (fields of that config, e.g. IG's alpha_tv) on top."""
    typed = case.attack_config(cfg)
    if attack_kwargs:
        typed = type(typed)(**{**typed.model_dump(), **attack_kwargs})  # validated like the resolved one
    return typed


def run_gradleak(spec: CaseSpec, case, cfg, attack_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:  # noqa: ANN001
    """One gradleak attack on the built case, as ``gradleak.pipeline.run`` does it (same typed
    attack config, same Engine), with the timed observer instead of the PSNR one.
    ``attack_kwargs``: fields of the typed attack config set on top (e.g. IG's alpha_tv)."""
    typed = typed_attack(case, cfg, attack_kwargs)
    load_before = loadavg()
    with lbfgs_instances() as made:
        obs = TimedObserver()
        engine = Engine(device=torch.device("cpu"), observer=obs, log_every=cfg.log_every, progress=cfg.progress)
        rec = engine.run(typed, case.update, case.model)
        total = obs.elapsed()
    loop = rec.wall_seconds - obs.overhead
    resolved = typed.model_dump()  # the typed attack config that ran
    return {
        "tool": "gradleak", "version": gradleak.__version__, "torch": torch.__version__,
        "threads": torch.get_num_threads(), "dtype": cfg.dtype or resolved.get("dtype") or "float32",
        "iterations": rec.iterations, "loop_seconds": loop, "total_seconds": total,
        "observer_seconds": obs.overhead, "lbfgs_evaluations": lbfgs_evaluations(made) if made else None,
        "labels_restored": rec.labels.tolist(), "loadavg_before": load_before, "loadavg_after": loadavg(),
        "attack_used": rec.extra.get("attack_used"),  # attack auto: the attack whose answer it kept
        "_final": rec.images, "_labels": rec.labels, "_points": obs.points, "_snapshots": obs.snapshots,
    }


# ----------------------------------------------------------------------------- breaching
def export_case(case_dir: Path, spec: CaseSpec, case, iterations: int, threads: int) -> None:  # noqa: ANN001
    """Write what breaching_driver.py needs: the photos, labels, global weights (by position)
    and gradleak's shared gradient (to check that both clients share the same thing)."""
    case_dir.mkdir(parents=True, exist_ok=True)
    module = case.model.module
    arrays: dict[str, np.ndarray] = {
        "images": case.truth.images.numpy().astype(np.float32),
        "labels": case.truth.labels.numpy().astype(np.int64),
    }
    for i, p in enumerate(module.parameters()):
        arrays[f"param_{i:03d}"] = p.detach().numpy().astype(np.float32)
    for i, g in enumerate(case.update.gradients.values()):
        arrays[f"grad_{i:03d}"] = g.detach().numpy().astype(np.float32)
    np.savez(case_dir / "case.npz", **arrays)
    meta = {
        "case": spec.key, "breaching_model": spec.breaching_model, "breaching_attack": spec.breaching_attack,
        "iterations": iterations, "log_every": spec.log_every, "batch_size": spec.batch_size,
        "num_classes": case.model.num_classes, "width": case.model.kwargs.get("width"),
        "mean": list(case.model.mean), "std": list(case.model.std), "threads": threads, "seed": 0,
        "provide_buffers": spec.provide_buffers,
    }
    (case_dir / "case.json").write_text(json.dumps(meta, indent=2) + "\n")


def run_breaching(python: Path, case_dir: Path) -> dict[str, Any]:
    """breaching_driver.py in the breaching venv; its JSON plus the images it saved."""
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"})
    load_before = loadavg()
    proc = subprocess.run([str(python), str(HERE / "breaching_driver.py"), str(case_dir)], env=env,
                          capture_output=True, text=True, cwd=str(case_dir))
    (case_dir / "breaching.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        raise RuntimeError(f"breaching driver failed (rc {proc.returncode}):\n{tail}")
    out = case_dir / "breaching"
    res = json.loads((out / "result.json").read_text())
    res["dtype"] = {"float": "float32", "double": "float64"}.get(res["attack_config"]["dtype"], res["attack_config"]["dtype"])
    res["loadavg_before"], res["loadavg_after"] = load_before, loadavg()
    res["_final"] = torch.from_numpy(np.load(out / "final.npy"))
    res["_labels"] = torch.from_numpy(np.load(out / "final_labels.npy"))
    res["_points"] = [(p["iteration"], p["seconds"]) for p in res.pop("trajectory")]
    res["_snapshots"] = list(torch.from_numpy(np.load(out / "snapshots.npy")))
    return res


# ----------------------------------------------------------------------------- one case
def finish(raw: dict[str, Any], truth: Batch, threshold: float, label: str) -> dict[str, Any]:
    """Score a tool's raw result and keep only JSON-friendly fields."""
    scored = score(raw["_final"], raw["_labels"], raw["_points"], raw["_snapshots"], truth, threshold)
    row = {k: v for k, v in raw.items() if not k.startswith("_")}
    row.update({k: v for k, v in scored.items() if k != "paired_images"})
    row["label"] = label
    it = max(1, row["iterations"])
    row["seconds_per_1000_iterations"] = 1000 * row["loop_seconds"] / it
    ev = row.get("lbfgs_evaluations")
    row["seconds_per_1000_evaluations"] = 1000 * row["loop_seconds"] / ev if ev else None
    if row["seconds_to_threshold"] is None and row["psnr"] >= threshold:
        # no logged iterate reached it (a closed-form attack logs none): the returned answer does,
        # available when the run ends
        row["seconds_to_threshold"], row["iteration_to_threshold"] = row["total_seconds"], row["iterations"]
    row["_paired"] = scored["paired_images"]
    return row


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b not in (None, 0) else None


def run_case(spec: CaseSpec, *, quick: bool, threads: int, breaching_python: Path | None, out: Path,
             iterations: int | None = None, reduced: str | None = None) -> dict[str, Any]:
    if iterations is None:
        iterations = spec.quick_iterations if quick else spec.iterations
    result: dict[str, Any] = {"key": spec.key, "title": spec.title, "iterations": iterations,
                              "batch_size": spec.batch_size, "threshold_db": spec.threshold_db,
                              "notes": list(spec.notes), "rows": [], "skipped": None,
                              "planned_iterations": spec.quick_iterations if quick else spec.iterations,
                              "iterations_reduced": reduced}
    if spec.attack not in attack_names():
        result["skipped"] = (f"gradleak has no attack {spec.attack!r} yet (attack_names() = {attack_names()}); "
                             "re-run this case when it lands")
        log(f"{spec.key}: skipped: {result['skipped']}")
        return result
    cfg = gradleak_config(spec, iterations, threads)
    case = build_case(cfg)
    truth = case.truth
    assert truth is not None
    result["photos"] = list(truth.names)
    result["labels"] = truth.labels.tolist()
    case_dir = out / spec.key
    rows, pictures = [], [truth.images]
    titles = ["original"]

    log(f"{spec.key}: gradleak {spec.attack} on {spec.model}, batch {spec.batch_size}, {iterations} iterations")
    row = finish(run_gradleak(spec, case, cfg), truth, spec.threshold_db, "gradleak")
    rows.append(row)
    log(f"{spec.key}: gradleak {row['seconds_per_1000_iterations']:.1f} s/1000 it, PSNR {row['psnr']:.2f} dB")
    for variant in spec.variants:
        vcfg = gradleak_config(spec, iterations, threads, variant.fields)
        log(f"{spec.key}: {variant.label}")
        vrow = finish(run_gradleak(spec, case, vcfg, variant.attack_kwargs), truth, spec.threshold_db, variant.label)
        rows.append(vrow)
        log(f"{spec.key}: {variant.label}: {vrow['seconds_per_1000_iterations']:.1f} s/1000 it, "
            f"PSNR {vrow['psnr']:.2f} dB")

    if breaching_python is not None:
        export_case(case_dir, spec, case, iterations, threads)
        log(f"{spec.key}: breaching {spec.breaching_attack} on {spec.breaching_model} (subprocess)")
        brow = finish(run_breaching(breaching_python, case_dir), truth, spec.threshold_db, "breaching")
        rows.append(brow)
        log(f"{spec.key}: breaching {brow['seconds_per_1000_iterations']:.1f} s/1000 it, PSNR {brow['psnr']:.2f} dB, "
            f"client gradient rel. diff vs gradleak {brow['gradient_rel_diff_vs_gradleak']:.2e}")
        g = rows[0]
        result["ratios"] = {
            "seconds_per_1000_iterations": ratio(g["seconds_per_1000_iterations"], brow["seconds_per_1000_iterations"]),
            "seconds_per_1000_evaluations": ratio(g["seconds_per_1000_evaluations"], brow["seconds_per_1000_evaluations"]),
            "seconds_to_threshold": ratio(g["seconds_to_threshold"], brow["seconds_to_threshold"]),
            "psnr_difference_db": g["psnr"] - brow["psnr"],
        }
        for v in rows[1:-1]:
            result.setdefault("variant_ratios", {})[v["label"]] = {
                "seconds_per_1000_iterations": ratio(v["seconds_per_1000_iterations"], brow["seconds_per_1000_iterations"]),
                "seconds_per_1000_evaluations": ratio(v["seconds_per_1000_evaluations"], brow["seconds_per_1000_evaluations"]),
                "seconds_to_threshold": ratio(v["seconds_to_threshold"], brow["seconds_to_threshold"]),
                "psnr_difference_db": v["psnr"] - brow["psnr"],
            }

    for r in rows:
        pictures.append(r.pop("_paired"))
        titles.append(f"{r['label']}: {r['psnr']:.1f} dB")
    try:  # a picture of the originals and both tools' (paired) reconstructions
        from gradleak.report import save_image_grid

        case_dir.mkdir(parents=True, exist_ok=True)
        save_image_grid(case_dir / "comparison.png", pictures, titles)
        result["picture"] = str((case_dir / "comparison.png").relative_to(ROOT))
    except Exception as exc:  # noqa: BLE001 - a picture is a nicety, never a failure
        log(f"{spec.key}: no picture ({exc})")
    result["rows"] = rows
    return result


# ----------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="dlg,ig,ig-convnet,gi", help="comma-separated subset of: " + ",".join(CASES))
    p.add_argument("--quick", action="store_true", help="few iterations: check the harness works (minutes)")
    p.add_argument("--skip-breaching", action="store_true", help="run gradleak only")
    p.add_argument("--skip-intrinsic", action="store_true", help="skip the intrinsic-cost measurement")
    p.add_argument("--skip-extras", action="store_true",
                   help="skip the G=8-seeds and default-DLG-job measurements (extras.py)")
    p.add_argument("--skip-whole-runs", action="store_true",
                   help="skip the whole default runs of both tools (issue 20; whole_runs.py; ~3 h with ig) and "
                        "the DLG floor (dlg_floor.py); --quick skips them too")
    p.add_argument("--iterations", action="append", default=[], metavar="CASE=N",
                   help="override a case's iterations (both tools), e.g. ig=500; repeatable")
    p.add_argument("--note", action="append", default=[], help="a line for RESULTS.md (e.g. about the machine); repeatable")
    p.add_argument("--deadline", default=None, metavar="HH:MM",
                   help="local time the whole run must end by: the slowest case (ig) runs last, with its "
                        "iterations cut (stated in the results) so that both tools fit before it")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads for both tools (default: all cores on a quiet machine, one fewer when "
                        "the 1-min load average is >= 1, see choose_threads)")
    p.add_argument("--out", type=Path, default=None, help="results folder (default: benchmarks/, --quick: benchmarks/out/quick)")
    return p.parse_args(argv)


def choose_threads() -> tuple[int, str]:
    """All cores on a quiet machine; one fewer when other work holds a core (1-min load >= 1).
    Why: torch's intra-op threads wait for each other at every parallel op, so a thread that shares
    its core with another process stalls the rest. Measured here at load ~4 on 2 cores: a DLG
    L-BFGS step took 1.6 s with 2 threads and 0.18 s with 1 thread; ResNet-18 IG 7.9 s vs 0.62 s."""
    cores = os.cpu_count() or 1
    load = (loadavg() or [0.0])[0]
    if load < 1.0 or cores == 1:
        return cores, f"all {cores} cores: 1-min load {load:.2f} < 1 at start"
    n = max(1, cores - 1)
    return n, (f"{n} of {cores} cores: 1-min load {load:.2f} >= 1 at start (other work on the machine); "
               "oversubscribed torch threads stall each other")


SLOW_CASE = "ig"
SETUP_SECONDS = 60.0      # per case: client simulation, breaching's start-up, scoring, picture
BREACHING_FACTOR = 1.15   # breaching's IG step relative to gradleak's (quick runs: ~1.0)


def fit_iterations(spec: CaseSpec, planned: int, deadline: _dt.datetime | None, intrinsic: Any,
                   threads: int) -> tuple[int, str | None]:
    """Iterations of the slow case that let both tools finish before the deadline, from gradleak's
    measured step time (the intrinsic-cost row of the same model, else a short probe)."""
    if deadline is None:
        return planned, None
    step = None
    for r in intrinsic or []:
        if r.get("attack") == spec.attack and r.get("model") == spec.model:
            step = r["attack_step_ms"] / 1000
    if step is None:
        cfg = gradleak_config(spec, 5, threads)
        case = build_case(cfg)
        rec = Engine(device=torch.device("cpu"), log_every=cfg.log_every, progress=cfg.progress).run(
            case.attack_config(cfg), case.update, case.model)
        step = rec.wall_seconds / max(1, rec.iterations)
    left = (deadline - _dt.datetime.now()).total_seconds() - 2 * SETUP_SECONDS
    fit = int(left / (step * (1 + BREACHING_FACTOR)))
    if fit >= planned:
        return planned, None
    n = fit // 50 * 50
    if n < 50:
        return 0, (f"skipped: not even 50 iterations of both tools fit before the deadline "
                   f"{deadline.strftime('%H:%M')} (gradleak's step {step:.2f} s, {left / 60:.1f} min left)")
    return n, (f"iterations cut from {planned} to {n} so that both tools finish by the deadline "
               f"{deadline.strftime('%H:%M')} (gradleak's step measured {step:.2f} s just before; "
               f"{left / 60:.1f} min left)")


def run_whole(keys: list[str], deadline: _dt.datetime | None, threads: int, breaching_python: Path | None,
              work: Path, results_dir: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """Issue 20: each case's whole default run of both tools (whole_runs.py), then, with the DLG
    case, the floor of DLG's method (dlg_floor.py, which divides by breaching's whole DLG run).
    With a deadline, a case whose last whole run (whole_runs.json) would not fit is skipped (said
    in the results). Rows are merged into whole_runs.json / WHOLE_RUNS.md when the results go to
    benchmarks/ itself; another results folder gets its own whole_runs.json and dlg_floor.json."""
    runs: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    if breaching_python is None:
        return runs, {k: "--skip-breaching" for k in keys}
    known = json.loads(WHOLE_JSON.read_text()) if WHOLE_JSON.exists() else {"cases": {}}
    bench = sys.modules[__name__]
    for key in keys:
        last = known["cases"].get(key, {}).get("wall_minutes")
        if deadline is not None and last is not None:
            left = (deadline - _dt.datetime.now()).total_seconds() / 60
            if last > left:
                skipped[key] = (f"its last whole run took {last:.0f} min, {left:.0f} min were left before the deadline "
                                f"{deadline.strftime('%H:%M')}")
                log(f"whole run {key}: skipped: {skipped[key]}")
                continue
        started = time.time()
        row = whole_case(bench, key, threads, breaching_python, work)
        row["date"] = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        row["wall_minutes"] = round((time.time() - started) / 60, 1)
        row["note"] = "measured by make bench (benchmarks/run.py)"
        runs[key] = row
        own = known if results_dir == HERE else {"cases": runs}
        own["cases"][key] = row
        own["machine"] = machine_info(threads)
        (results_dir / WHOLE_JSON.name).write_text(json.dumps(own, indent=1, default=str) + "\n")
        if results_dir == HERE:
            write_whole_runs(known, tuple(CASES))
    if "dlg" in runs:
        import dlg_floor
        log("DLG floor: evaluations x cost of one evaluation (dlg_floor.py)")
        dlg_floor.main(["--threads", str(threads), "--out", str(results_dir / "dlg_floor.json"),
                        "--whole-runs", str(results_dir / WHOLE_JSON.name)])
    return runs, skipped


def strip_private(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: strip_private(v) for k, v in obj.items() if not str(k).startswith("_")}
    if isinstance(obj, list):
        return [strip_private(v) for v in obj]
    return obj


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    keys = [k.strip() for k in args.cases.split(",") if k.strip()]
    unknown = [k for k in keys if k not in CASES]
    if unknown:
        print(f"unknown case(s) {unknown}; known: {', '.join(CASES)}", file=sys.stderr)
        return 2
    overrides: dict[str, int] = {}
    for item in args.iterations:
        key, _, n = item.partition("=")
        if key not in CASES or not n.isdigit() or int(n) < 1:
            print(f"--iterations {item!r}: expected CASE=N with CASE in {', '.join(CASES)}", file=sys.stderr)
            return 2
        overrides[key] = int(n)
    deadline = None
    if args.deadline:
        hh, _, mm = args.deadline.partition(":")
        now = _dt.datetime.now()
        deadline = now.replace(hour=int(hh), minute=int(mm), second=0, microsecond=0)
        if deadline <= now:
            print(f"--deadline {args.deadline} is already past", file=sys.stderr)
            return 2
    threads_rule = "--threads given"
    if args.threads is None:
        args.threads, threads_rule = choose_threads()
    log(f"torch threads {args.threads} ({threads_rule})")
    torch.set_num_threads(args.threads)
    results_dir = args.out or (DEFAULT_OUT / "quick" if args.quick else HERE)
    results_dir.mkdir(parents=True, exist_ok=True)
    work = DEFAULT_OUT / ("quick" if args.quick else "full")

    started = time.time()
    command = "python benchmarks/run.py " + " ".join(argv if argv is not None else sys.argv[1:])
    breaching_python = None if args.skip_breaching else ensure_breaching_venv()
    results: dict[str, Any] = {
        "command": command.strip(),
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": {**machine_info(args.threads), "threads_rule": threads_rule},
        "versions": {"gradleak": gradleak.__version__, "torch": torch.__version__,
                     "breaching": breaching_version(breaching_python) if breaching_python else None},
        "loadavg_start": loadavg(),
        "notes": list(args.note),
        "cases": [],
        "intrinsic": None,
    }
    if deadline is not None:
        results["deadline"] = deadline.astimezone().isoformat(timespec="minutes")
    # With a deadline the slow case (ig) goes last, after the intrinsic cost that times its step.
    late = [k for k in keys if deadline is not None and k == SLOW_CASE]
    for key in [k for k in keys if k not in late]:
        results["cases"].append(run_case(CASES[key], quick=args.quick, threads=args.threads,
                                         breaching_python=breaching_python, out=work,
                                         iterations=overrides.get(key)))
    if not args.skip_extras:
        log("G = 8 seeds batched vs 8 sequential runs (gradinversion, convnet batch 4)")
        results["seeds"] = measure_seeds(quick=args.quick, threads=args.threads)
        log(f"  batched {results['seeds']['batched_total_s']:.1f} s, sequential {results['seeds']['sequential_total_s']:.1f} s: "
            f"{results['seeds']['ratio']:.2f}x")
        log("the DLG job (gradleak attack --attack dlg): time to MSE <= 1e-4, final MSE")
        results["dlg_default"] = measure_dlg_default(quick=args.quick, threads=args.threads, root=DEFAULT_OUT)
        d = results["dlg_default"]
        log(f"  to MSE 1e-4: {d['seconds_to_mse_1e-4']} s; final MSE {d['final_mse']:.2e}; command "
            f"{d['command_run'].get('process_wall_s', float('nan')):.1f} s")
    if not args.skip_intrinsic:
        log("intrinsic cost: attack step / training step (gradleak)")
        results["intrinsic"] = measure_all(quick=args.quick, threads=args.threads)
        for r in results["intrinsic"]:
            log(f"  {r['label']}: attack {r['attack_ratio']:.2f}x, naive {r['naive_ratio']:.2f}x of a training step")
    for key in late:
        spec = CASES[key]
        planned = overrides.get(key) or (spec.quick_iterations if args.quick else spec.iterations)
        n, reason = fit_iterations(spec, planned, deadline, results.get("intrinsic"), args.threads)
        if reason:
            log(f"{key}: {reason}")
        if n == 0:
            results["cases"].append({"key": key, "title": spec.title, "iterations": 0, "rows": [], "skipped": reason,
                                     "threshold_db": spec.threshold_db, "notes": list(spec.notes)})
            continue
        results["cases"].append(run_case(spec, quick=args.quick, threads=args.threads,
                                         breaching_python=breaching_python, out=work, iterations=n, reduced=reason))
    results["cases"].sort(key=lambda c: list(CASES).index(c["key"]))
    if not (args.quick or args.skip_whole_runs):
        results["whole_runs"], results["whole_runs_skipped"] = run_whole(keys, deadline, args.threads,
                                                                         breaching_python, work, results_dir)
    results["loadavg_end"] = loadavg()
    results["wall_seconds"] = time.time() - started

    clean = strip_private(results)
    (results_dir / "results.json").write_text(json.dumps(clean, indent=2) + "\n")
    gpu_file = results_dir / "gpu.json"  # benchmarks/gpu.py's GPU section, when it has been run
    gpu = json.loads(gpu_file.read_text()) if gpu_file.exists() else None
    floor_file = results_dir / "dlg_floor.json"
    floor = json.loads(floor_file.read_text()) if floor_file.exists() and clean.get("whole_runs") else None
    (results_dir / "RESULTS.md").write_text(render_markdown(clean, gpu, floor))
    log(f"wrote {results_dir / 'results.json'} and {results_dir / 'RESULTS.md'} ({results['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
