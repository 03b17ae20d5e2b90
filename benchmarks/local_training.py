"""Issue 59's "Done when": is a FedAvg client that trains as people configure it (SGD with momentum
and weight decay, or Adam, over epochs of mini-batches) attacked as well as the plain-SGD client,
once the attacker models the announced optimizer, and worse when it does not?

Per photo pair (``--data``: CIFAR-100 samples by default, which the project's attacks were not
tuned on), LeNet, a client of 2 photos, 2 local epochs in mini-batches of 1 (4 steps, private
order), local lr 0.05:

* plain:       plain SGD client, attacked by today's default attack (``auto``);
* momentum:    SGD momentum 0.9, weight decay 5e-4, attacked with the announced optimizer modelled;
* mismodelled: the same momentum update, the attacker told the client was plain SGD (the update
               file's record stripped of the optimizer: what gradleak's attacker did before);
* adam:        Adam (lr 1e-3, torch's betas and eps), 2 epochs, attacked with Adam modelled: the
               verdict must be leaked or inconclusive, never defended.

Every run is the CLI (share, then attack with --truth), one thread, one at a time, and every client
is attacked with the same attack flags (equal budgets; default ``dlg``, what ``auto`` runs on this
case, with its default restarts: a start that stalls is restarted up to 3 times, whichever client).

    nice -n 10 .venv/bin/python benchmarks/local_training.py [--seeds 0,1] [--attack "dlg --stall-restarts 0"]

Writes benchmarks/local_training.json after every attack (3-28 minutes a run on one loaded CPU thread).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
OUT = HERE / "local_training.json"
GRADLEAK = [str(Path(sys.executable).parent / "gradleak")]
CLIENT = ["--model", "lenet-dlg", "--batch-size", "2", "--threat", "fedavg", "--local-epochs", "2",
          "--local-batch-size", "1"]
CLIENTS = {
    "plain": ["--local-lr", "0.05"],
    "momentum": ["--local-lr", "0.05", "--local-momentum", "0.9", "--local-weight-decay", "5e-4"],
    "adam": ["--local-lr", "1e-3", "--local-optimizer", "adam"],
}
PLAIN_KEYS = ("name", "local_steps", "local_batch_size", "local_lr", "local_epochs")
# The rows a seed's summary compares (client, attacker).
SUMMARY_ROWS = (("plain", "modelled"), ("momentum", "modelled"), ("momentum", "as plain SGD"), ("adam", "modelled"))


def _run(args: list[str]) -> None:
    proc = subprocess.run([*GRADLEAK, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"gradleak {' '.join(args[:3])} failed ({proc.returncode}): {proc.stderr[-2000:]}")


def _as_plain_sgd(src: Path, dst: Path) -> None:
    """The same update, its record stripped of the optimizer: the attacker models plain SGD."""
    from gradleak.fl import load_update, save_update

    update, _ = load_update(src)
    update.meta.threat = {k: v for k, v in update.meta.threat.items() if k in PLAIN_KEYS}
    save_update(update, dst)


def _attack(update: Path, truth: Path, out: Path, attack: list[str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    _run(["attack", "--update", str(update), "--truth", str(truth), "--out", str(out), "--threads", "1",
          "--no-progress", *attack])
    return metrics_row(json.loads((out / "metrics.json").read_text()), round(time.perf_counter() - t0, 1))


def metrics_row(m: dict[str, Any], seconds: float | None) -> dict[str, Any]:
    """One attack's row from its metrics.json (also for a cut run's finished run folders)."""
    return {"psnr": m.get("psnr_mean"), "ssim": m.get("ssim_mean"), "label_accuracy": m.get("label_accuracy"),
            "verdict": m.get("verdict"), "verdict_reason": m.get("verdict_reason"), "next_step": m.get("next_step"),
            "client_model": m.get("client_model"), "attack_used": m.get("attack_used") or m.get("attack"),
            "relative_gradient_distance": m.get("relative_gradient_distance"),
            "truth_relative_distance": m.get("truth_relative_distance"), "threat": m.get("threat"),
            "seconds": seconds}


def measure(data: str, seed: int, tmp: Path, attack: list[str], clients: list[str],
            done: Callable[[dict[str, Any]], None]) -> None:
    """Every client of one seed, each row handed to ``done`` as soon as its attack ends."""
    for client, flags in ((c, CLIENTS[c]) for c in clients):
        u, t = tmp / f"{client}-{seed}.safetensors", tmp / f"{client}-{seed}-truth.safetensors"
        _run(["share", *CLIENT, "--data", data, *flags, "--seed", str(seed), "--out", str(u), "--truth", str(t)])
        attacks = [("modelled", u)]
        if client == "momentum":
            _as_plain_sgd(u, tmp / f"plain-model-{seed}.safetensors")
            attacks.append(("as plain SGD", tmp / f"plain-model-{seed}.safetensors"))
        for attacker, path in attacks:
            row = {"data": data, "seed": seed, "client": client, "attacker": attacker,
                   **_attack(path, t, tmp / f"run-{client}-{attacker.replace(' ', '-')}-{seed}", attack)}
            print(json.dumps({k: row[k] for k in ("seed", "client", "attacker", "psnr", "verdict", "seconds")}),
                  flush=True)
            done(row)


def _code() -> str:
    """The commit of the gradleak that ran (the package's checkout), "+changes" if it had any."""
    import gradleak

    where = Path(gradleak.__file__).parent
    head = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--", "."], capture_output=True, text=True)
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0", help="photo pairs (batch seeds), comma-separated")
    ap.add_argument("--data", default="cifar100-samples", help="data source (default: CIFAR-100 samples, which "
                    "the attacks were not tuned on; the issue's 35 dB reference is on cifar10-samples)")
    ap.add_argument("--attack", default="dlg", help="the attack flags, space-separated, the same for every client "
                    "(default: dlg, auto's choice on this case, with its default restarts; 'auto' runs the whole "
                    "portfolio; 'dlg --stall-restarts 0' one start per label ordering, minutes a run)")
    ap.add_argument("--clients", default=",".join(CLIENTS), help=f"which clients ({', '.join(CLIENTS)})")
    ap.add_argument("--out", default=str(OUT), help="the JSON written")
    args = ap.parse_args()
    attack = ["--attack", *args.attack.split()]
    clients = args.clients.split(",")
    rows: list[dict[str, Any]] = []

    def done(row: dict[str, Any]) -> None:
        rows.append(row)
        write(Path(args.out), args.data, attack, rows, clients)

    with TemporaryDirectory() as d:
        for seed in (int(s) for s in args.seeds.split(",")):
            measure(args.data, seed, Path(d), attack, clients, done)
    print(json.dumps(_summary(rows, clients), indent=1))


def write(out: Path, data: str, attack: list[str], rows: list[dict[str, Any]], clients: list[str]) -> None:
    """The JSON, written after every attack: a cut run keeps its finished rows (the summary: whole seeds)."""
    out.write_text(json.dumps({"date": _dt.date.today().isoformat(), "code": _code(), "data": data, "attack": attack,
                               "client": CLIENT, "clients": CLIENTS, "summary": _summary(rows, clients),
                               "rows": rows}, indent=1) + "\n")


def _summary(rows: list[dict[str, Any]], clients: list[str]) -> list[dict[str, Any]]:
    """Per seed: the plain, modelled-momentum, mis-modelled and Adam PSNRs and the Done-when checks."""
    by = {(r["seed"], r["client"], r["attacker"]): r for r in rows}
    summary = []
    whole = {s for s in {r["seed"] for r in rows} if all((s, c, a) in by for c, a in SUMMARY_ROWS)}
    for seed in sorted(whole) if set(clients) == set(CLIENTS) else ():
        plain, mom = by[(seed, "plain", "modelled")]["psnr"], by[(seed, "momentum", "modelled")]["psnr"]
        mis, adam = by[(seed, "momentum", "as plain SGD")]["psnr"], by[(seed, "adam", "modelled")]
        summary.append({"seed": seed, "plain_sgd_db": plain, "momentum_modelled_db": mom,
                        "momentum_as_plain_sgd_db": mis, "within_3_db": abs(plain - mom) <= 3,
                        "mismodelled_worse_by_db": round(mom - mis, 2),
                        "adam_db": adam["psnr"], "adam_verdict": adam["verdict"],
                        "adam_never_defended": adam["verdict"] != "defended"})
    return summary


if __name__ == "__main__":
    main()
