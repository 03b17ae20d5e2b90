"""Issue 60 item 5: what the guard costs. The example federation of examples/flower_guarded_app.py
(Fashion-MNIST, LeNet (DLG's), 2 clients, one image each per round, one local SGD step, lr 0.01,
FedAvg), run twice on Flower's simulation engine (a local Ray on loopback): unguarded, and with the
``noise`` policy (clip off, schedule z = 0.3, 1, 3, 10; budget 600 s; 50 steps per optimisation
attack). Both times the server audits what it receives (AuditedStrategy, ``auto``, scored against
the clients' batches). Records per client-round the guard's seconds beside the training's, the
decisions and verdicts (guard.csv), the server-side audit's verdicts and PSNR, and the global
model's accuracy on 500 test images after each round. The ``withhold`` and ``report`` policies
run too (``--policies``): withhold must send no leaking update, report must change nothing (the
server receives, and the audit rebuilds, what it does unguarded). Writes benchmarks/guard_cost.json.

    nice -n 10 .venv/bin/python benchmarks/guard_cost.py [--rounds 3] [--policies none,noise,withhold,report]
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import platform
import statistics
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parent / "examples" / "flower_guarded_app.py"


def example():  # noqa: ANN201 - the example module (examples/ is not a package)
    spec = importlib.util.spec_from_file_location("gradleak_example_flower_guarded_app", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def summary(record: dict, guard_rows: list[dict]) -> dict:
    audit = record["audit"]
    for a in audit:   # why, from the update's run folder (the audit's metrics.json)
        run = Path(record["out"]) / "audit" / str(a.get("run") or "")
        if a.get("run") and (run / "metrics.json").is_file():
            a["verdict_reason"] = json.loads((run / "metrics.json").read_text()).get("verdict_reason")
    psnr = [float(a["psnr_mean"]) for a in audit if a.get("psnr_mean") not in (None, "")]
    out = {"wall_seconds": record["wall_seconds"], "accuracy": record["accuracy"],
           "audit_rows": [{k: a.get(k) for k in ("round", "client", "attack", "verdict", "psnr_mean", "verdict_reason")}
                          for a in audit], "audit_updates": len(audit), "audit_leaked": sum(a.get("verdict") == "leaked" for a in audit),
           "audit_verdicts": [a.get("verdict") for a in audit], "audit_psnr": psnr,
           "audit_min_psnr_leaked": min((float(a["psnr_mean"]) for a in audit if a.get("verdict") == "leaked"),
                                        default=None)}
    if guard_rows:
        g = [float(r["seconds"]) for r in guard_rows]
        t = [float(r["train_seconds"]) for r in guard_rows if r["train_seconds"]]
        out.update(guard_rows=guard_rows, guard_seconds_mean=statistics.mean(g), guard_seconds_max=max(g),
                   train_seconds_mean=statistics.mean(t) if t else None,
                   decisions={d: sum(r["decision"] == d for r in guard_rows)
                              for d in ("passed", "remedied", "withheld", "refused model")},
                   leaking_rounds=sum(r["verdict_before"] == "leaked" for r in guard_rows))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--policies", default="none,noise,withhold,report", help="comma-separated; none: unguarded")
    p.add_argument("--keep", default=None, help="a folder to keep the federations' outputs in (default: a temporary one)")
    a = p.parse_args()
    ex = example()
    results = {}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as scratch:
        tmp = a.keep or scratch
        for policy in a.policies.split(","):
            name = "unguarded" if policy == "none" else policy
            out = Path(tmp) / name
            s, pol, _, audit = ex.parse(["--policy", policy, "--out", str(out), "--rounds", str(a.rounds),
                                         "--clients", str(a.clients), "--iterations", "50", "--no-progress"])
            record = ex.run_guarded(s, pol, out, audit_attack=audit)
            record["out"] = str(out)
            rows = list(csv.DictReader(open(out / "guard.csv", newline=""))) if (out / "guard.csv").exists() else []
            results[name] = summary(record, rows)
            print(name, json.dumps({k: v for k, v in results[name].items() if k != "guard_rows"}), flush=True)
            write(a, commit, results)   # after each federation: a stopped run keeps the ones done


def write(a: argparse.Namespace, commit: str, results: dict) -> None:
    doc = {"benchmark": "guard_cost", "issue": 60, "python": platform.python_version(), "machine": platform.machine(),
           "commit": commit, "iterations": 50,
           "note": "2 CPU cores shared with other work while it ran: seconds are this machine's, under load; "
                   "the audit scores each update against the truth's own source (Fashion-MNIST) since 161c9ff",
           "rounds": a.rounds, "clients": a.clients, "results": results}
    (HERE / "guard_cost.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
