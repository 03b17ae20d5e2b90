"""Issue 21's start-up target, measured here (the tests check only what --help imports): the
wall time of `gradleak --help`, `gradleak --version` and `gradleak attack --help` as the user
runs them (the venv's console script, a fresh process each time), target under 1 s each.

For context it also times the interpreter alone (`python -c pass`) and the sub-commands whose
flags come from modules that import torch (`audit-flower --help`, `dashboard --help`). Each
command runs ``--repeat`` times (default 7) after one warm-up run (the page cache); the median
is the number kept, min and max beside it, and the 1-min load average before and after (other
work on the machine inflates every time).

Writes benchmarks/cli_startup.json (a few seconds).

    .venv/bin/python benchmarks/cli_startup.py [--repeat N]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET_S = 1.0
COMMANDS = {
    "gradleak --help": ["--help"],
    "gradleak --version": ["--version"],
    "gradleak attack --help": ["attack", "--help"],
}
CONTEXT = {
    "python -c pass": None,
    "gradleak audit-flower --help": ["audit-flower", "--help"],
    "gradleak dashboard --help": ["dashboard", "--help"],
}


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _time(argv: list[str], repeat: int) -> dict[str, object]:
    env = {**os.environ, "COLUMNS": "80"}
    subprocess.run(argv, capture_output=True, env=env, check=True)   # warm-up: files in the page cache
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(argv, capture_output=True, env=env, check=True)
        times.append(time.perf_counter() - t0)
    return {"median_s": round(statistics.median(times), 3), "min_s": round(min(times), 3),
            "max_s": round(max(times), 3), "runs": repeat}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=7, help="timed runs per command (default 7)")
    p.add_argument("--out", type=Path, default=HERE / "cli_startup.json", help="results file")
    args = p.parse_args(argv)
    script = Path(sys.prefix) / "bin" / "gradleak"     # the console script pip installed
    if not script.is_file():
        print(f"no gradleak console script at {script}: run this with the venv's python", file=sys.stderr)
        return 2
    out: dict[str, object] = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
        "target_s": TARGET_S, "loadavg_start": _loadavg(), "commands": {}, "context": {},
    }
    for group, commands in (("commands", COMMANDS), ("context", CONTEXT)):
        for name, words in commands.items():
            cmd = [sys.executable, "-c", "pass"] if words is None else [str(script), *words]
            row = _time(cmd, args.repeat)
            if group == "commands":
                row["met"] = row["median_s"] < TARGET_S
            out[group][name] = row   # type: ignore[index]
            print(f"{name:32s} median {row['median_s']:.3f} s (min {row['min_s']:.3f}, max {row['max_s']:.3f})",
                  flush=True)
    out["loadavg_end"] = _loadavg()
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(r["met"] for r in out["commands"].values()) else 1   # type: ignore[union-attr]


if __name__ == "__main__":
    raise SystemExit(main())
