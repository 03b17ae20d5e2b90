"""Copy a finished experiment folder into reproduction/NAME, beside the paper.

    python reproduction/collect.py NAME OUT_DIR
    python reproduction/collect.py FOLDER OUT_DIR -- --data fashion-mnist     # the same experiment, other flags
    python reproduction/collect.py NAME RUN_DIR --run "gradleak attack ..."   # one attack run

The second form is for a table that is one long `gradleak attack` run (gradinversion-imagenet):
RUN_DIR is its run folder; results.csv gets one row per image (with the run's verdict),
results.md the setup, the table, the time per iteration and the projection to the paper's budget.

OUT_DIR is the folder `gradleak experiment NAME --out OUT_DIR ...` wrote. Copied: every CSV
(results.csv, summary.csv, ...), results.md, experiment.json and the figures (the cell store, OUT_DIR/cells, stays
where it is: it is what makes a rerun recompute nothing). results.md gets the hand-written
reading of reproduction/NAME/reading.md appended (the paper's numbers beside ours, where we agree
and where we do not), and command.txt records the command that regenerates the folder.
"""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def collect(name: str, out_dir: Path, extra: list[str] | None = None) -> Path:
    """``name``: the folder under reproduction/ (the experiment's own name, or another folder for
    the same experiment with ``extra`` flags, e.g. identifiability-fashion-mnist with --data)."""
    dest = HERE / name
    dest.mkdir(exist_ok=True)
    doc = json.loads((out_dir / "experiment.json").read_text())
    experiment = doc.get("name") or name
    flags = "".join(f" {f}" for f in extra or [])
    for f in sorted({p.name for p in out_dir.glob("*.csv")} | {"experiment.json", *doc.get("figures", [])}):
        if (out_dir / f).is_file():
            shutil.copy2(out_dir / f, dest / f)
    md = (out_dir / "results.md").read_text()
    reading = dest / "reading.md"
    if reading.is_file():
        md = md.rstrip() + "\n\n" + reading.read_text().strip() + "\n"
    (dest / "results.md").write_text(md)
    command = (f"gradleak experiment {experiment}{flags} --out reproduction/{name}/run --workers 1 --threads 1\n"
               f"# then: python reproduction/collect.py {name} reproduction/{name}/run"
               + (f" --{flags}" if flags else "") + "\n")
    (dest / "command.txt").write_text(command)
    return dest


RUN_COLUMNS = ["index", "name", "label_true", "label_restored", "psnr", "zero_psnr", "ssim", "mse", "fft2d", "rpsnr",
               "lpips", "identified", "converged", "verdict", "relative_gradient_distance", "iterations", "seeds",
               "wall_seconds"]
RUN_FILES = ("config.json", "metrics.json", "history.csv", "reconstruction.png", "candidates.png")
# The paper's ResNet-50 budget (Sec. 4, implementation details): 20k iterations x 8 seeds.
PAPER_ITERATIONS, PAPER_SEEDS = 20_000, 8


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if 1e-3 <= abs(v) < 1e5 else f"{v:.3e}"
    return "" if v is None else str(v)


def collect_run(name: str, run_dir: Path, command: str) -> Path:
    """One attack run folder -> reproduction/NAME: results.csv (a row per image, with the run's
    verdict under the experiments' rule), results.md (setup, table, time per iteration and the
    projected cost of the paper's budget at it, then reading.md) and the run's own files."""
    from gradleak.experiments.common import THRESHOLD_DB, verdict_of

    dest = HERE / name
    dest.mkdir(exist_ok=True)
    cfg = json.loads((run_dir / "config.json").read_text())
    m = json.loads((run_dir / "metrics.json").read_text())
    conv = m.get("convergence") or {}
    iterations, seeds = int(m["iterations"]), int(cfg.get("seeds") or 1)
    rows = [{**{c: img.get(c) for c in RUN_COLUMNS[:RUN_COLUMNS.index("converged")]}, "converged": m.get("converged"),
             "verdict": verdict_of(m.get("converged"), img["psnr"] >= THRESHOLD_DB),
             "relative_gradient_distance": conv.get("relative_gradient_distance"), "iterations": iterations,
             "seeds": seeds, "wall_seconds": round(float(m["wall_seconds"]), 1)} for img in m["per_image"]]
    with (dest / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=RUN_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    for f in RUN_FILES:
        if f == "candidates.png" and seeds == 1:
            continue  # one seed: the candidates are the reconstruction
        if (run_dir / f).is_file():
            shutil.copy2(run_dir / f, dest / f)
    per_it = float(m["wall_seconds"]) / max(1, iterations)
    per_image_seed = per_it / (seeds * int(m["batch_size"]))
    paper_s = per_image_seed * int(m["batch_size"]) * PAPER_SEEDS * PAPER_ITERATIONS
    means = {k: m.get(k) for k in ("psnr_mean", "zero_psnr_mean", "above_zero_image", "ssim_mean", "fft2d_mean",
                                   "rpsnr_mean", "lpips_mean", "label_accuracy", "iip")}
    md = [f"# {name}: `{command}`", "",
          "## Setup", "",
          *(f"- **{k}**: {_fmt(cfg.get(k))}" for k in ("attack", "preset", "model", "data", "batch_size", "seeds",
                                                          "group", "bn", "iterations", "threads", "seed")),
          f"- **resolved constants**: {json.dumps(m.get('settings', {}))}",
          f"- **versions**: {json.dumps(m.get('versions', {}))}",
          f"- **IIP pool**: {m.get('iip_pool_size')} images, {m.get('iip_feature_space')}", "",
          "## Results (every image of the batch)", "",
          "| " + " | ".join(RUN_COLUMNS) + " |", "|" + "---|" * len(RUN_COLUMNS),
          *("| " + " | ".join(_fmt(r[c]) for c in RUN_COLUMNS) + " |" for r in rows), "",
          "Means: " + ", ".join(f"{k} {_fmt(v) if v is not None else 'not computed'}" for k, v in means.items())
          + ".", "",
          f"Convergence: {conv.get('reason', 'not recorded')}.", "",
          "## Time", "",
          f"- {_fmt(float(m['wall_seconds']))} s for {iterations} iterations x {seeds} seed(s) x batch "
          f"{m['batch_size']}: {per_it:.2f} s per iteration, {per_image_seed:.3f} s per image and seed.",
          f"- The paper's budget ({PAPER_ITERATIONS} iterations x {PAPER_SEEDS} seeds x batch {m['batch_size']}) at "
          f"that rate: {paper_s / 3600:.0f} h ({paper_s / 86400:.1f} days) on this CPU.", ""]
    reading = dest / "reading.md"
    if reading.is_file():
        md += [reading.read_text().strip(), ""]
    (dest / "results.md").write_text("\n".join(md))
    (dest / "command.txt").write_text(command + f"\n# then: python reproduction/collect.py {name} {run_dir} "
                                      f"--run \"<the command above>\"\n")
    return dest


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[3] == "--run":
        print(collect_run(sys.argv[1], Path(sys.argv[2]), sys.argv[4]))
    elif len(sys.argv) == 3 or (len(sys.argv) > 4 and sys.argv[3] == "--"):
        print(collect(sys.argv[1], Path(sys.argv[2]), sys.argv[4:]))
    else:
        sys.exit(__doc__)
