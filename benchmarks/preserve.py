"""Before/after check for refactors: run the main cases through the CLI and record their numbers.

    python benchmarks/preserve.py record OUT.json [--src SRC]   # run every case, save the numbers
    python benchmarks/preserve.py compare BEFORE.json AFTER.json

``--src`` puts another checkout's ``src/`` first on PYTHONPATH (e.g. a worktree of the commit
before the change), so both sides run with the same interpreter and packages. Every case runs in
a fresh process with one torch thread and a fixed seed, so on one machine a refactor that did
not change the maths gives identical numbers; ``compare`` prints every difference and exits 1 if
there is any. Issue 16 used it to show that the one-pipeline move preserved results, issue 58
its splits (preserve/before-issue58.json vs after-issue58.json, and -part2 for the second round:
docs/explanation/tests.md).

The GradInversion case passes --share-bn-statistics: before issue 16 the attack's BN prior
("exact") made the simulated client share its BN statistics; now the case alone decides, so the
flag states what the old code did implicitly (the old code gives the same numbers with it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

GRADLEAK = [sys.executable, "-m", "gradleak.cli"]

SENTENCE = "the patient was seen on monday"
# (name, arguments of `gradleak attack`), all small budgets of the main cases
CASES: list[tuple[str, list[str]]] = [
    ("dlg-default", ["--attack", "dlg"]),  # the default attack until 2026-11-26 (now auto)
    ("default", []),
    ("idlg", ["--attack", "idlg", "--seed", "3", "--iterations", "40"]),
    ("gi-convnet-b2", ["--attack", "gradinversion", "--model", "convnet", "--width", "16", "--batch-size", "2",
                       "--preset", "cpu", "--iterations", "60", "--seeds", "2", "--share-bn-statistics"]),
    ("gi-approx-lazy", ["--attack", "gradinversion", "--model", "convnet", "--width", "16", "--batch-size", "2",
                        "--iterations", "40", "--seeds", "2", "--bn", "approx", "--group", "lazy"]),
    ("ig-convnet", ["--attack", "ig", "--model", "convnet", "--width", "16", "--iterations", "40"]),
    ("dlg-fedavg", ["--attack", "dlg", "--threat", "fedavg", "--local-steps", "2", "--local-lr", "0.1", "--iterations", "30"]),
    ("idlg-aggregate", ["--attack", "idlg", "--threat", "aggregate", "--clients", "2", "--iterations", "30"]),
    ("dlg-defended", ["--attack", "dlg", "--defense", "gaussian:1e-2", "--defense", "prune:0.5", "--iterations", "30"]),
    ("dlg-fmnist", ["--model", "convnet", "--width", "16", "--data", "fashion-mnist", "--attack", "idlg",
                    "--iterations", "30"]),
    ("text-dlg", ["--modality", "text", "--attack", "dlg", "--iterations", "30", "--text", SENTENCE]),
    ("text-bow", ["--modality", "text", "--attack", "bow", "--text", SENTENCE, "--text", "a second private line"]),
    # issue 58's splits touched every attack's module: one case each for the rest
    ("analytic-mlp", ["--attack", "analytic", "--model", "mlp"]),
    ("rgap", ["--attack", "rgap", "--model", "lenet-dlg"]),
    ("cpa", ["--attack", "cpa", "--model", "mlp", "--data", "fashion-mnist", "--batch-size", "8"]),
    ("imprint", ["--attack", "imprint", "--server", "imprint:bins=8", "--batch-size", "4"]),
    ("trap", ["--attack", "trap", "--server", "trap:rows=200", "--model", "mlp", "--width", "16", "--data",
              "fashion-mnist", "--batch-size", "2"]),
    ("ig-momentum-epochs", ["--attack", "ig", "--threat", "fedavg", "--local-epochs", "2", "--batch-size", "2",
                            "--local-batch-size", "1", "--local-lr", "0.05", "--local-momentum", "0.9",
                            "--local-weight-decay", "5e-4", "--iterations", "20"]),
    ("text-tag", ["--modality", "text", "--attack", "tag", "--iterations", "30", "--text", SENTENCE]),
    ("text-lamp", ["--modality", "text", "--attack", "lamp", "--iterations", "20", "--text", SENTENCE]),
    ("text-dager", ["--modality", "text", "--attack", "dager", "--text", SENTENCE]),
]
UPDATE_CASE = ("dlg-update-file", ["--model", "lenet-dlg", "--data", "cifar10-samples", "--batch-size", "1",
                                   "--seed", "2"], ["--attack", "dlg", "--seed", "2", "--iterations", "30"])
KEEP = ("psnr_mean", "ssim_mean", "mse_mean", "label_accuracy", "labels_restored", "gradient_distance",
        "token_accuracy", "bleu", "rouge1", "bow_precision", "bow_recall", "recovered_sentences", "iterations",
        "fft2d", "rpsnr", "iip")


def _env(src: str | None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    if src:
        env["PYTHONPATH"] = str(Path(src).resolve()) + os.pathsep + env.get("PYTHONPATH", "")
    return env


class Failed(Exception):
    pass


def _gradleak(args: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(GRADLEAK + args, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise Failed(f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}")


def _digest(run_dir: Path) -> dict[str, str]:
    """SHA-256 of the reconstruction's tensors (their bytes, by name) and of history.csv without its
    clock columns: the answer and the path to it, beyond the headline numbers."""
    import csv
    import hashlib

    out = {}
    rec = run_dir / "reconstruction.safetensors"
    if rec.is_file():
        from safetensors.numpy import load_file

        h = hashlib.sha256()
        for name, array in sorted(load_file(str(rec)).items()):
            h.update(name.encode() + str(array.dtype).encode() + str(array.shape).encode() + array.tobytes())
        out["reconstruction_sha256"] = h.hexdigest()
    hist = run_dir / "history.csv"
    if hist.is_file():
        with hist.open(newline="") as f:
            rows = list(csv.reader(f))
        keep = [i for i, c in enumerate(rows[0] if rows else []) if not any(w in c for w in ("second", "time", "wall"))]
        text = "\n".join(",".join(r[i] for i in keep if i < len(r)) for r in rows)
        out["history_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    return out


def _numbers(run_dir: Path) -> dict[str, Any]:
    m = json.loads((run_dir / "metrics.json").read_text())
    out = {k: m[k] for k in KEEP if k in m}
    out["per_image_psnr"] = [r.get("psnr") for r in m.get("per_image", [])]
    out["verdict"] = m.get("verdict")
    return {**out, **_digest(run_dir)}


def record(path: Path, src: str | None) -> None:
    env = _env(src)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in CASES:
            out = Path(tmp) / name
            try:
                _gradleak(["attack", *args, "--threads", "1", "--no-progress", "--out", str(out)], env)
                results[name] = _numbers(out)
            except Failed as exc:  # recorded: a case that fails on one side is a difference
                results[name] = {"error": str(exc)}
            print(f"{name}: {results[name].get('psnr_mean', results[name].get('token_accuracy'))}", flush=True)
        name, share_args, attack_args = UPDATE_CASE
        upd, truth, out = Path(tmp) / "u.safetensors", Path(tmp) / "t.safetensors", Path(tmp) / name
        _gradleak(["share", *share_args, "--out", str(upd), "--truth", str(truth)], env)
        _gradleak(["attack", *attack_args, "--update", str(upd), "--truth", str(truth), "--threads", "1",
                   "--no-progress", "--out", str(out)], env)
        results[name] = _numbers(out)
        print(f"{name}: {results[name].get('psnr_mean')}", flush=True)
    path.write_text(json.dumps(results, indent=1) + "\n")


def compare(before: Path, after: Path) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    diffs = 0
    for case in sorted(set(a) | set(b)):
        for key in sorted(set(a.get(case, {})) | set(b.get(case, {}))):
            va, vb = a.get(case, {}).get(key), b.get(case, {}).get(key)
            if va != vb:
                diffs += 1
                print(f"{case}.{key}: {va!r} -> {vb!r}")
    print(f"{len(set(a) | set(b))} cases, {diffs} differences")
    return 1 if diffs else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("out", type=Path)
    r.add_argument("--src", default=None)
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = p.parse_args()
    if args.cmd == "record":
        record(args.out, args.src)
    else:
        raise SystemExit(compare(args.before, args.after))


if __name__ == "__main__":
    main()
