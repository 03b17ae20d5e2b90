"""`gradleak sweep SPEC`: a grid of attacks on a process pool or Ray, resumable."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..console import notice_once
from ..errors import GradleakError


def cmd_sweep(args: argparse.Namespace) -> int:
    from ..sweep import load_spec, run_sweep

    spec = load_spec(args.spec)  # refuses a module:callable model named in the file
    if args.workers is not None and not 1 <= args.workers <= 256:
        raise GradleakError("--workers must be in 1..256")
    if args.address and args.executor != "ray":
        raise GradleakError("--address applies to --executor ray only")
    try:
        summary = run_sweep(spec, Path(args.out), executor=args.executor, workers=args.workers,
                            address=args.address, retry_failed=args.retry_failed, save_runs=args.save_runs,
                            progress=args.progress)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (sweep.engine): finished cells are in the store
        print(f"gradleak: sweep interrupted ({signal_name(exc)}); finished cells are saved in "
              f"{args.out}/results.sqlite; to continue, run: {sweep_command(args)}", file=sys.stderr)
        return int(getattr(exc, "exit_code", 130))
    failed = f", {len(summary.failed)} failed" if summary.failed else ""
    lost = f", {len(summary.lost)} lost (rerun to redo)" if summary.lost else ""
    print(f"sweep: {summary.done}/{summary.total} cells done ({summary.skipped} skipped, "
          f"{len(summary.computed)} run{failed}{lost}) in {summary.wall_seconds:.0f} s; "
          f"wrote {args.out}/results.sqlite, results.csv")
    # LPIPS not computed: said once per sweep, not per cell, and not again for later sweeps
    # into the same parent folder (console.notice_once); each cell's metrics record it.
    if summary.lpips_notice and notice_once(Path(args.out).absolute().parent, "lpips", summary.lpips_notice):
        print(summary.lpips_notice)
    return 0


def signal_name(exc: BaseException) -> str:
    import signal

    signum = getattr(exc, "signum", signal.SIGINT)
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def sweep_command(args: argparse.Namespace) -> str:
    """The command that continues an interrupted sweep: the same spec, --out and options
    (rerunning it skips every cell already in the store; --workers and the executor do not
    change a cell)."""
    words = ["gradleak", "sweep", args.spec, "--out", args.out]
    if args.executor != "local":
        words += ["--executor", args.executor]
    if args.address:
        words += ["--address", args.address]
    if args.workers is not None:
        words += ["--workers", str(args.workers)]
    words += [flag for flag, on in (("--retry-failed", args.retry_failed), ("--save-runs", args.save_runs),
                                    ("--no-progress", not args.progress)) if on]
    return shlex.join(words)


def fill_sweep(w: argparse.ArgumentParser) -> None:
    w.add_argument("spec", help="sweep spec (YAML/JSON): base: {fields}, grid: {field: [values]}")
    w.add_argument("--out", required=True, help="results folder (results.sqlite, results.csv); rerun to resume")
    w.add_argument("--executor", choices=("local", "ray", "inline"), default="local",
                   help="local: process pool (default); ray: Ray tasks; inline: this process")
    w.add_argument("--address", default=None, help="Ray cluster address (default: start a local Ray)")
    w.add_argument("--workers", type=int, default=None, help="parallel cells (default: the CPUs available; "
                   "with --address, the cluster's)")
    w.add_argument("--retry-failed", dest="retry_failed", action="store_true", help="rerun cells that failed")
    w.add_argument("--save-runs", dest="save_runs", action="store_true", help="also write DIR/runs/<cell>/ run folders")
    w.add_argument("--no-progress", dest="progress", action="store_false", help="one line per cell, no bar")
    w.set_defaults(func=cmd_sweep)
