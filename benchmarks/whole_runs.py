"""Issue 20: whole default runs, gradleak vs breaching 0.1.2, what a user of either tool waits for.

benchmarks/run.py compares the two tools at EQUAL iteration counts (the cost of an iteration and
the quality it buys). A user does not choose the count: each tool runs its own default length.
This runs, per case of cases.py (same photos, labels, model weights and shared gradient as run.py):

* gradleak as `gradleak attack` runs it with no length given: on the DLG case the default job
  itself (`--attack auto`, the default attack: R-GAP applies to DLG's LeNet at batch 1), and DLG's
  own method beside it (`--attack dlg`: 300 L-BFGS steps per start with the settled stop,
  dlg.SETTLE_*); IG 1000 iterations (its default since 2026-11-26, 4800 before: attacks/ig.py);
  GradInversion's cpu preset 600 iterations;
* breaching with its preset's own ``optim.max_iterations`` (deepleakage 1200, invertinggradients
  24 000, seethroughgradients 20 000; read from breaching's config, nothing overridden but the
  case's threat model, as in run.py).

For each: wall time of the whole run (set-up included, observer time out), final PSNR, and the
time gradleak took to reach breaching's FINAL PSNR (from its logged trajectory). The target of
issue 20: gradleak's whole run >= 3x faster at equal or better final PSNR. breaching's IG run
is long (24 000 ResNet-18 iterations, ~1.9 h on one thread here): choose cases with --cases.

    .venv/bin/python benchmarks/whole_runs.py --cases dlg,ig-convnet,gi [--threads 1]

Writes benchmarks/whole_runs.json (merged per case: a later run of one case keeps the others)
and benchmarks/WHOLE_RUNS.md. ``--keep-breaching`` reruns gradleak only, against each case's
recorded breaching row (e.g. after a change of a gradleak default; breaching's IG run is the
long one); the table then gives the date breaching's row was measured.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
OUT_JSON = HERE / "whole_runs.json"
OUT_MD = HERE / "WHOLE_RUNS.md"
FLOOR_JSON = HERE / "dlg_floor.json"
TARGET = 3.0


def _bench():  # noqa: ANN202 - benchmarks/run.py as a module (its harness: cases, both tools, scoring)
    spec = importlib.util.spec_from_file_location("gradleak_bench_run_whole", HERE / "run.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


# The attack `gradleak attack` runs on a case when the user gives no --attack: the DLG case is the
# default job itself (DLG's LeNet, one CIFAR-10 photo), whose default attack is "auto" (config.py):
# the closed-form attacks first (issue 20's lever "closed form first"; here R-GAP applies), the
# optimisation attack only when none explains the update. The IG and GradInversion cases are
# `gradleak attack --attack ig` / `--attack gradinversion` at those attacks' defaults.
DEFAULT_ATTACK: dict[str, str] = {"dlg": "auto"}

# Other whole gradleak runs of a case, beside its default run (reported, not counted in "met"):
# on the DLG case, DLG's own method.
ALTERNATIVES: dict[str, tuple[tuple[str, str], ...]] = {
    "dlg": (("dlg", "DLG's own method, `--attack dlg` (float64 L-BFGS, settled stop)"),),
}


def default_attack(key: str, spec) -> str:  # noqa: ANN001
    """The attack of the case's whole default run."""
    return DEFAULT_ATTACK.get(key, spec.attack)


def baselines(images: torch.Tensor, mean: tuple[float, ...]) -> dict[str, float]:
    """Two trivial answers of a case, scored like a reconstruction (mean PSNR over its photos):

    * ``zero_answer_psnr``: a flat image of the model's normalisation mean colour, i.e. the zero
      image in the model's input space. An attacker returns it without looking at the update (it
      knows the model), so a reconstruction below it carries no information about the photo that
      PSNR can see.
    * ``mean_colour_psnr``: a flat image of each photo's own mean colour (three numbers per photo,
      read from the truth: an upper bound for any flat answer).

    Where both tools end below these, "equal or better PSNR" compares failed reconstructions."""
    from gradleak.metrics import psnr

    zero = torch.tensor(mean, dtype=images.dtype).view(1, -1, 1, 1).expand_as(images)
    flat = images.mean(dim=(2, 3), keepdim=True).expand_as(images)
    return {"zero_answer_psnr": float(psnr(zero, images).mean()), "mean_colour_psnr": float(psnr(flat, images).mean())}


def _config(bench, spec, attack: str, threads: int):  # noqa: ANN001, ANN202
    return bench.make_config(attack=attack, model=spec.model, data="cifar10-samples", batch_size=spec.batch_size,
                             seed=0, threads=threads, log_every=spec.log_every, progress=False,
                             **(spec.fields if attack == spec.attack else {}))


def kept_breaching(data: dict[str, Any], key: str, threads: int) -> dict[str, Any]:
    """The recorded breaching row of case ``key`` (``--keep-breaching``), with the date it was
    measured. Refused unless it ran at ``threads`` torch threads: a whole-run speed-up compares
    two runs at the same thread count."""
    row = data["cases"].get(key)
    if row is None:
        raise SystemExit(f"--keep-breaching: no recorded breaching run of case {key} in {OUT_JSON.name}")
    b = row["breaching"]
    if b.get("threads") != threads:
        raise SystemExit(f"--keep-breaching: case {key}'s breaching run used {b.get('threads')} torch thread(s), "
                         f"not --threads {threads}")
    return {"breaching": b, "date": row.get("breaching_date") or row["date"]}


def whole_case(bench, key: str, threads: int, python: Path | None, out: Path,  # noqa: ANN001
               kept: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = bench.CASES[key]
    attack = default_attack(key, spec)
    cfg = _config(bench, spec, attack, threads)
    case = bench.build_case(cfg)
    truth = case.truth
    if kept is None:
        case_dir = out / f"whole-{key}"
        bench.export_case(case_dir, spec, case, None, threads)  # iterations null: breaching's own length
        bench.log(f"{key}: breaching {spec.breaching_attack}, its own length (subprocess)")
        b = bench.finish(bench.run_breaching(python, case_dir), truth, spec.threshold_db, "breaching")
    else:  # the same photos, weights and update: the case is built from the same seed (cases.py)
        b = kept["breaching"]
        bench.log(f"{key}: breaching's row kept from its run of {kept['date']}")
    bench.log(f"{key}: breaching {b['iterations']} iterations, {b['total_seconds']:.1f} s, PSNR {b['psnr']:.2f} dB")
    bench.log(f"{key}: gradleak --attack {attack} at its defaults")
    g = bench.finish(bench.run_gradleak(spec, case, cfg), truth, b["psnr"], "gradleak")
    g["attack"] = attack
    bench.log(f"{key}: gradleak {g['iterations']} iterations, {g['total_seconds']:.1f} s, PSNR {g['psnr']:.2f} dB")
    alternatives = []
    for alt, what in ALTERNATIVES.get(key, ()):
        alt_cfg = _config(bench, spec, alt, threads)
        alt_case = bench.build_case(alt_cfg)  # the same photos, weights and update (seed 0)
        bench.log(f"{key}: gradleak --attack {alt}")
        a = bench.finish(bench.run_gradleak(spec, alt_case, alt_cfg), alt_case.truth, b["psnr"], "gradleak " + alt)
        a.pop("_paired", None)
        a.pop("trajectory", None)
        a["attack"] = alt
        bench.log(f"{key}: gradleak --attack {alt}: {a['total_seconds']:.1f} s, PSNR {a['psnr']:.2f} dB")
        alternatives.append({"attack": alt, "what": what, "run": a,
                             "whole_run_speedup": b["total_seconds"] / a["total_seconds"] if a["total_seconds"] else None,
                             "psnr_difference_db": a["psnr"] - b["psnr"]})
    for r in (b, g):
        r.pop("_paired", None)
    speed = b["total_seconds"] / g["total_seconds"] if g["total_seconds"] else None
    return {
        **baselines(truth.images, case.model.mean),
        "key": key, "title": spec.title, "photos": list(truth.names), "labels": truth.labels.tolist(),
        "gradleak_attack": attack, "gradleak": g, "breaching": b,
        "breaching_max_iterations": (b.get("attack_config") or {}).get("optim", {}).get("max_iterations"),
        "whole_run_speedup": speed, "psnr_difference_db": g["psnr"] - b["psnr"],
        "met": bool(speed is not None and speed >= TARGET and g["psnr"] >= b["psnr"]),
        "gradleak_seconds_to_breaching_final_psnr": g.get("seconds_to_threshold"),
        "alternatives": alternatives,
        **({"breaching_date": kept["date"]} if kept is not None else {}),
    }


def _threads(data: dict[str, Any]) -> str:
    """The torch threads of the rows (both tools of a case run with the same count; cases may differ)."""
    per_case = {key: c["gradleak"].get("threads") for key, c in data["cases"].items()}
    counts = set(per_case.values())
    if len(counts) == 1 and None not in counts:
        return f"{counts.pop()} torch thread(s) for both tools"
    return "torch threads for both tools, per case: " + ", ".join(f"{k} {n}" for k, n in per_case.items())


def write_markdown(data: dict[str, Any], known: tuple[str, ...] = ("dlg", "ig", "gi")) -> None:
    from report import whole_runs_section  # benchmarks/ is on sys.path (run.py put it there)
    floor = json.loads(FLOOR_JSON.read_text()) if FLOOR_JSON.exists() else None
    m = data["machine"]
    lines = ["# Whole default runs: gradleak vs breaching 0.1.2", "",
             "Generated by `benchmarks/whole_runs.py` (issue 20; `make bench` runs it too, after the equal-iteration "
             "cases); raw data in `whole_runs.json`. Each tool runs its own default length on the same photos, "
             "weights and shared gradient as `benchmarks/run.py`; whole-run time includes set-up, observer time taken "
             "out; PSNR by gradleak's metric code for both.",
             "", f"Target: gradleak's whole run >= {TARGET:g}x faster than breaching's at equal or better final PSNR.", "",
             *whole_runs_section(data["cases"], floor, known), "",
             f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), {_threads(data)}, {m['platform']}, Python {m['python']}.", ""]
    OUT_MD.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    bench = _bench()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="dlg,ig-convnet,gi", help="comma-separated subset of: " + ",".join(bench.CASES))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=HERE / "out")
    p.add_argument("--note", default=None, help="a line on the conditions of this run (e.g. other load), kept per case")
    p.add_argument("--keep-breaching", action="store_true",
                   help="rerun gradleak only: keep each case's recorded breaching row (same threads), its date shown")
    args = p.parse_args(argv)
    keys = [k for k in args.cases.split(",") if k]
    unknown = [k for k in keys if k not in bench.CASES]
    if unknown:
        print(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(bench.CASES)}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    data = json.loads(OUT_JSON.read_text()) if OUT_JSON.exists() else {"cases": {}}
    kept = {key: kept_breaching(data, key, args.threads) for key in keys} if args.keep_breaching else {}
    python = None if args.keep_breaching else bench.ensure_breaching_venv()
    data["machine"] = bench.machine_info(args.threads)
    for key in keys:
        started = time.time()
        row = whole_case(bench, key, args.threads, python, args.out, kept.get(key))
        row["date"] = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        row["wall_minutes"] = round((time.time() - started) / 60, 1)
        row["note"] = args.note
        data["cases"][key] = row
        OUT_JSON.write_text(json.dumps(data, indent=1, default=str) + "\n")
        write_markdown(data, tuple(bench.CASES))
    bench.log(f"wrote {OUT_JSON} and {OUT_MD}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
