"""Copy a finished experiment folder into reproduction/NAME, beside the paper.

    python reproduction/collect.py NAME OUT_DIR
    python reproduction/collect.py FOLDER OUT_DIR -- --data fashion-mnist     # the same experiment, other flags
    python reproduction/collect.py NAME RUN_DIR --run "gradleak attack ..."   # one attack run
    python reproduction/collect.py --rewrite [NAME ...]   # results.md again from the committed files

The second form is for a table that is one long `gradleak attack` run (gradinversion-imagenet):
RUN_DIR is its run folder; results.csv gets one row per image (with the run's verdict),
results.md the setup, the table, the time per iteration and the projection to the paper's budget.

OUT_DIR is the folder `gradleak experiment NAME --out OUT_DIR ...` wrote. Copied: every CSV
(results.csv, summary.csv, ...), results.md, experiment.json and the figures (the cell store, OUT_DIR/cells, stays
where it is: it is what makes a rerun recompute nothing). results.md gets the hand-written
reading of reproduction/NAME/reading.md appended (the paper's numbers beside ours, where we agree
and where we do not), and command.txt records the command that regenerates the folder.

``--rewrite`` writes each folder's results.md (every folder without a NAME) from what the folder
holds: results.csv, summary.csv and experiment.json (setup, notes, figures) for an experiment,
config.json and metrics.json for an attack run; then reading.md. A results.csv written before
issue 62 (no ``psnr_by_label``, no verdict per image) is shown as it is, and results.md says so.
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
    (dest / "results.md").write_text(experiment_markdown(dest))
    command = (f"gradleak experiment {experiment}{flags} --out reproduction/{name}/run --workers 1 --threads 1\n"
               f"# then: python reproduction/collect.py {name} reproduction/{name}/run"
               + (f" --{flags}" if flags else "") + "\n")
    (dest / "command.txt").write_text(command)
    return dest


#: What says a results.csv was written by today's experiments (issue 62): the paper's pairing and a
#: verdict per image (image rows: batch_verdict beside it; batch rows: images_leaked).
NEW_COLUMNS = ("psnr_by_label",)
PRE_62 = ("> **Computed before issue 62.** This folder's results.csv predates the paper's pairing: its `psnr` "
          "is the PSNR after pairing each photo with its closest reconstruction in pixels (an oracle's pairing, "
          "today's `psnr_oracle_pairing`), and it has no `psnr_by_label` (each slot paired with the photo of its "
          "restored label, as GradInversion pairs), no public prior image's PSNR{verdicts}. Nothing here is "
          "filled in afterwards: the numbers need the run again (command.txt; the cell store under run/ is "
          "git-ignored and gone, so that is a full rerun).")


def _typed(v: str) -> Any:
    """A CSV field back as the value an experiment wrote: int, float, else the text ("" -> None)."""
    if v == "":
        return None
    for kind in (int, float):
        try:
            return kind(v)
        except ValueError:
            pass
    return v


def _read_csv(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = [{k: _typed(v) for k, v in r.items()} for r in reader]
        return list(reader.fieldnames or []), rows


def experiment_markdown(dest: Path) -> str:
    """results.md of an experiment folder, from its results.csv, summary.csv and experiment.json
    (experiments/base.results_markdown, what the experiment itself writes), then reading.md."""
    from gradleak.experiments.base import results_markdown

    doc = json.loads((dest / "experiment.json").read_text())
    columns, rows = _read_csv(dest / "results.csv")
    summary_columns, summary = _read_csv(dest / "summary.csv") if (dest / "summary.csv").is_file() else ([], [])
    md = results_markdown(doc.get("name") or dest.name, doc.get("title") or dest.name, doc.get("setup") or {},
                          columns, rows, summary_columns, summary, doc.get("notes") or [], doc.get("figures") or [],
                          float(doc.get("wall_seconds") or 0.0), doc.get("cells") or None)
    images = any(c in columns for c in ("psnr", "psnr_oracle_pairing"))
    if images and not all(c in columns for c in NEW_COLUMNS):
        verdicts = (" and no verdict per image (each image row's `verdict` is its batch's, judged on the whole "
                    "batch)" if "image" in columns else
                    " and no count of its images that leaked by today's per-image rule (its verdict is the batch's)")
        title, _, rest = md.partition("\n\n")
        md = f"{title}\n\n{PRE_62.format(verdicts=verdicts)}\n\n{rest}"
    reading = dest / "reading.md"
    if reading.is_file():
        md = md.rstrip() + "\n\n" + reading.read_text().strip() + "\n"
    return md


def rewrite(name: str) -> Path:
    """results.md of reproduction/NAME again from its committed files (no rerun): an experiment
    folder's (experiment.json) or an attack run's (metrics.json, command.txt's first line)."""
    dest = HERE / name
    if (dest / "experiment.json").is_file():
        (dest / "results.md").write_text(experiment_markdown(dest))
        return dest
    if (dest / "metrics.json").is_file():
        command = (dest / "command.txt").read_text().splitlines()[0]
        return collect_run(name, dest, command)
    raise SystemExit(f"{dest}: neither experiment.json nor metrics.json")


def folders() -> list[str]:
    """Every folder (and nested run folder) under reproduction/ that has a results.md."""
    return sorted(str(p.parent.relative_to(HERE)) for p in HERE.glob("**/results.md")
                  if "run" not in p.relative_to(HERE).parts[:-1])


RUN_COLUMNS = ["index", "name", "label_true", "label_restored", "psnr_by_label", "psnr_oracle_pairing", "zero_psnr",
               "prior_psnr", "ssim", "mse", "fft2d", "rpsnr", "lpips", "identified", "converged", "verdict",
               "batch_verdict", "relative_gradient_distance", "iterations", "seeds", "wall_seconds"]
#: metrics.json's per-image key of a column, where it is named otherwise
RUN_KEYS = {"psnr_oracle_pairing": "psnr"}
RUN_FILES = ("config.json", "metrics.json", "history.csv", "reconstruction.png", "candidates.png", "by_label.json")
# The paper's ResNet-50 budget (Sec. 4, implementation details): 20k iterations x 8 seeds.
PAPER_ITERATIONS, PAPER_SEEDS = 20_000, 8


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if 1e-3 <= abs(v) < 1e5 else f"{v:.3e}"
    return "" if v is None else str(v)


BY_LABEL_AFTER = ("> **Scored after the run (issue 62).** This run predates `psnr_by_label`; its full-precision "
                  "reconstructions are gone, but reconstruction.png holds both rows pixel-exact (8-bit tiles at "
                  "scale 1). `by_label.py` scores each photo against the slot of its own restored label (the "
                  "paper's pairing), and the zero and public prior images, from those tiles (by_label.json); it "
                  "first recomputes every recorded oracle-pairing PSNR from the tiles, here within {err:.4f} dB. "
                  "The verdicts are today's rules applied to the recorded per-image scores.")


def _scored_after(run_dir: Path, m: dict[str, Any]) -> dict[str, Any] | None:
    """by_label.json (written by a folder's by_label.py from its reconstruction.png) merged into a
    metrics.json that predates psnr_by_label; None where there is none or metrics.json has it."""
    path = run_dir / "by_label.json"
    if "psnr_by_label" in m["per_image"][0] or not path.is_file():
        return None
    doc = json.loads(path.read_text())
    for img, extra in zip(m["per_image"], doc["per_image"], strict=True):
        if (img["index"], img["name"]) != (extra["index"], extra["name"]):
            raise SystemExit(f"{path}: image {extra['name']} does not match metrics.json's {img['name']}")
        img.update({k: extra[k] for k in ("psnr_by_label", "zero_psnr", "prior_psnr")})
    m.update({k: doc[k] for k in ("psnr_by_label_mean", "zero_psnr_mean", "prior_psnr_mean")})
    m["above_zero_image"] = sum(1 for img in m["per_image"] if img["psnr"] > img["zero_psnr"])
    if doc["prior_psnr_mean"] is not None:
        m["above_prior_image"] = sum(1 for img in m["per_image"] if img["psnr"] > img["prior_psnr"])
    return doc


def collect_run(name: str, run_dir: Path, command: str) -> Path:
    """One attack run folder -> reproduction/NAME: results.csv (a row per image, with the run's
    verdict under the experiments' rule), results.md (setup, table, time per iteration and the
    projected cost of the paper's budget at it, then reading.md) and the run's own files."""
    from gradleak.experiments.common import THRESHOLD_DB, verdict_of

    dest = HERE / name
    dest.mkdir(exist_ok=True)
    cfg = json.loads((run_dir / "config.json").read_text())
    m = json.loads((run_dir / "metrics.json").read_text())
    after = _scored_after(run_dir, m)
    conv = m.get("convergence") or {}
    iterations, seeds = int(m["iterations"]), int(cfg.get("seeds") or 1)
    batch = verdict_of(m, None)
    rows = [{**{c: img.get(RUN_KEYS.get(c, c)) for c in RUN_COLUMNS[:RUN_COLUMNS.index("converged")]},
             "converged": m.get("converged"), "verdict": verdict_of(m, img["psnr"] >= THRESHOLD_DB, image=img["index"]),
             "batch_verdict": batch, "relative_gradient_distance": conv.get("relative_gradient_distance"),
             "iterations": iterations, "seeds": seeds, "wall_seconds": round(float(m["wall_seconds"]), 1)}
            for img in m["per_image"]]
    with (dest / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=RUN_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    for f in RUN_FILES:
        if f == "candidates.png" and seeds == 1:
            continue  # one seed: the candidates are the reconstruction
        if (run_dir / f).is_file() and (run_dir / f).resolve() != (dest / f).resolve():
            shutil.copy2(run_dir / f, dest / f)
    per_it = float(m["wall_seconds"]) / max(1, iterations)
    per_image_seed = per_it / (seeds * int(m["batch_size"]))
    paper_s = per_image_seed * int(m["batch_size"]) * PAPER_SEEDS * PAPER_ITERATIONS
    means = {k: m.get(k) for k in ("psnr_by_label_mean", "psnr_mean", "zero_psnr_mean", "above_zero_image",
                                   "prior_psnr_mean", "above_prior_image", "ssim_mean", "fft2d_mean", "rpsnr_mean",
                                   "lpips_mean", "label_accuracy", "iip")}
    means["psnr_oracle_pairing_mean"] = means.pop("psnr_mean")
    own = sum(1 for img in m["per_image"] if img.get("label_true") == img.get("label_restored"))
    pre = [] if after is None and "psnr_by_label" in m["per_image"][0] else [BY_LABEL_AFTER.format(
        err=after["oracle_check_max_error_db"]), ""] if after is not None else [
        PRE_62.format(verdicts=" (the verdicts below are today's rules applied to its per-image scores)").replace(
            "results.csv", "metrics.json").replace("the cell store under run/ is git-ignored and gone, so that is a "
                                                   "full rerun", "the run folder is git-ignored"), "",
        f"What metrics.json does say about the pairing: {own} of the {len(m['per_image'])} photos were paired (by "
        "pixels) with the slot of their own restored label.", ""]
    md = [f"# {name}: `{command}`", "", *pre,
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
    if run_dir.resolve() != dest.resolve():   # a rewrite from the folder itself keeps its command.txt
        (dest / "command.txt").write_text(command + f"\n# then: python reproduction/collect.py {name} {run_dir} "
                                          f"--run \"<the command above>\"\n")
    return dest


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--rewrite":
        for folder in sys.argv[2:] or folders():
            print(rewrite(folder))
    elif len(sys.argv) == 5 and sys.argv[3] == "--run":
        print(collect_run(sys.argv[1], Path(sys.argv[2]), sys.argv[4]))
    elif len(sys.argv) == 3 or (len(sys.argv) > 4 and sys.argv[3] == "--"):
        print(collect(sys.argv[1], Path(sys.argv[2]), sys.argv[4:]))
    else:
        sys.exit(__doc__)
