"""The console summary of a run: its table, what auto tried, the control and the verdict."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..console import notice_once
from .flags import EXIT_USAGE


def attack_status(metrics: dict[str, Any], run_dir: Path | None) -> int:
    """0, or 2 with one error line when the attack diverged beyond its retries (results kept)."""
    if metrics.get("status") != "diverged":
        return 0
    where = f"; partial results in {run_dir} (metrics.json status \"diverged\")" if run_dir is not None else ""
    print(f"gradleak: error: the attack diverged: {metrics.get('divergence', {}).get('message', '')}{where}",
          file=sys.stderr)
    return EXIT_USAGE


def _summary_rows(metrics: dict[str, Any], modality: Any) -> list[tuple[str, str]]:
    """The summary table's rows: the modality's keys (modalities.Modality), then the defenses,
    epsilon, the inputs a closed form separated and the attack's own convergence; the worst
    image's PSNR beside the mean."""
    from ..report.html import convergence_text, worst_image
    from ..report.page import inputs_exact

    rows: list[tuple[str, str]] = []

    def fmt(v: Any) -> str:
        if v is None:
            return modality.no_value
        if isinstance(v, float):
            return f"{v:.3e}" if (abs(v) < 1e-2 and v != 0) else f"{v:.3f}"
        return str(v)

    for key in modality.summary_keys:
        if key == "lpips_mean" and metrics.get(key) is None:
            continue  # metrics.json's lpips_notice says why (and the notice below, once)
        if key == "iterations" and isinstance(metrics.get("iterations_per_start"), int):
            # DLG/iDLG: --iterations is each start's budget; the total counts every start's steps
            starts = metrics.get("trials")
            rows.append(("iterations", f"{metrics['iterations']} in all ({metrics['iterations_per_start']} per start"
                         + (f", {starts} start{'s' if starts != 1 else ''})" if isinstance(starts, int) else ")")))
        elif key in metrics:
            rows.append((key, fmt(metrics[key])))
        if key == "psnr_mean" and len(metrics.get("per_image") or ()) > 1 and worst_image(metrics):
            low, name = worst_image(metrics)  # the mean hides the image that failed
            rows.append(("psnr_min", f"{low:.3f} (worst image: {name})"))
    if metrics.get("defenses"):
        rows.append(("defenses", ", ".join(metrics["defenses"])))
    if isinstance(metrics.get("dp_epsilon"), (int, float)):
        rows.append(("DP-SGD epsilon", f"{metrics['dp_epsilon']:.3g} (this one update, delta {metrics.get('dp_delta')})"))
    if inputs_exact(metrics):  # a closed form on an undefended update: the inputs it read off exactly
        rows.append(("inputs separated", f"{inputs_exact(metrics)} inputs exact (read off the update)"))
    elif isinstance(metrics.get("separated"), int):  # the closed-form attacks on a batch
        rows.append(("inputs separated", f"{metrics['separated']} of {metrics['batch_size']}"))
    if "converged" in metrics:
        rows.append(("attack converged", convergence_text(metrics)))
    return rows


def _summary_lines(metrics: dict[str, Any], modality: Any) -> list[str]:
    """The lines under the table: what auto tried, the positive control, the verdict and what
    would decide it, the BN prior's note, and the modality's own lines (a text run's sentences)."""
    from ..outcome import tried_summary

    lines = []
    auto = metrics.get("auto")
    if isinstance(auto, dict):  # --attack auto: what it tried and what it used
        lines.append(f"auto: used {auto.get('used')}: {auto.get('why')}. Tried: {tried_summary(auto)}")
    if isinstance(metrics.get("control"), dict):   # the positive control outcome.py asked for
        c = metrics["control"]
        lines.append(f"control (the same attack without the defenses): {c.get('verdict')}"
                     + (f", PSNR {c['psnr_mean']:.1f} dB" if isinstance(c.get("psnr_mean"), (int, float)) else ""))
    if metrics.get("verdict"):   # every run: the verdict on the client (outcome.py), and what would decide it
        line = f"verdict: {metrics['verdict']}: {metrics.get('verdict_reason', '')}"
        if metrics.get("next_step") and metrics["verdict"] != "leaked":
            line += f". Next: {metrics['next_step']}"
        lines.append(line)
    if metrics.get("bn_prior_note"):
        lines.append(f"note: {metrics['bn_prior_note']}")
    return lines + modality.summary_lines(metrics)


def print_summary(metrics: dict[str, Any], run_dir: Path | None) -> None:
    from rich.console import Console

    from ..console import print_table
    from ..modalities import recorded_modality

    modality = recorded_modality(metrics.get("modality"))
    where = modality.data_label or metrics["data"]
    console = Console()
    print_table(console, ["metric", "value"], _summary_rows(metrics, modality),
                title=f"{metrics['attack']} on {metrics['model']} ({where}, batch {metrics['batch_size']})")
    for line in _summary_lines(metrics, modality):
        console.print(line, markup=False, highlight=False)
    # LPIPS not computed: said once per folder of runs (runs/ by default), not on every run;
    # metrics.json and report.html keep saying it for each run (lpips_notice).
    notice = metrics.get("lpips_notice")
    if notice and notice_once(run_dir.absolute().parent if run_dir is not None else None, "lpips", notice):
        console.print(notice, markup=False, highlight=False)
    if run_dir is not None:
        console.print(f"run folder: {run_dir}  (report.html, {modality.files}, metrics.json)", markup=False,
                      highlight=False)
