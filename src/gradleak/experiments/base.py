"""Experiment commands: each answers one question from the papers or their reviews with this
project's own measured numbers, and writes results.csv, results.md, a figure and experiment.json.
Its attacks run as cells on the sweep engine, so rerunning the same command resumes."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..config import MAX_SEED, check_path_text, config_error
from ..catalog import unknown
from ..errors import ConfigError
from .cells import Workspace, commit_outputs, folder_lock, open_folder, remove_new_folder, stage_outputs


# An experiment's cells are seeded --seed, --seed + 1, ... (one per sample or batch, at most
# 100,000): the base seed leaves room for them below the attack's own bound.
MAX_EXPERIMENT_SEED = MAX_SEED - 2**20


class ExperimentOptions(BaseModel):
    """Options shared by the experiment commands; each experiment uses those it needs and
    documents its defaults (``--smoke`` switches to its smallest meaningful setting)."""

    model_config = ConfigDict(extra="forbid")

    out: str = Field(..., description="output folder")
    smoke: bool = Field(False, description="smallest meaningful setting (minutes on 2 cores)")
    model: str | None = Field(None, description="victim model")
    width: int | None = Field(None, ge=1, le=4096, description="model width")
    data: str | None = Field(None, description="data source")
    attacks: list[str] | None = Field(None, description="attacks to compare (comma separated)")
    # Upper bounds refuse absurd requests at once (like the attack's own flags).
    batch_sizes: list[Annotated[int, Field(ge=1, le=4096)]] | None = Field(None, max_length=64,
                                                                           description="batch sizes (comma separated)")
    batches: int | None = Field(None, ge=1, le=100_000, description="random batches per setting")
    samples: int | None = Field(None, ge=1, le=100_000, description="samples (batches attacked) per setting")
    iterations: int | None = Field(None, ge=1, le=10_000_000, description="attack iterations")
    seed: int = Field(0, ge=0, le=MAX_EXPERIMENT_SEED, description="base seed")
    threads: int | None = Field(None, ge=1, le=512, description="torch CPU threads (per cell; default: this "
                                "process's threads shared by the workers)")
    executor: Literal["local", "ray", "inline"] = Field(
        "local", description="where the attacks (cells) run: local (process pool) | ray (on loopback) | inline "
                             "(this process)")
    workers: int = Field(1, ge=1, le=512, description="cells run at once")
    retry_failed: bool = Field(False, description="compute again the cells that failed in an earlier run on --out")
    progress: bool = Field(True, description="show progress")
    trained: bool = Field(False, description="attack a victim trained first (SGD, one epoch on the data source's "
                                             "training split) instead of its random initialisation; only the "
                                             "experiments that say so take it")

    @field_validator("out", "data")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None:
            check_path_text(v)
        return v


@dataclass
class ExperimentResult:
    """Rows of results plus a declared setup (data, model, samples, seeds, thresholds)."""

    name: str
    title: str
    columns: list[str]
    rows: list[dict[str, Any]]
    setup: dict[str, Any]
    figures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0
    cells: dict[str, Any] = field(default_factory=dict)   # CellsReport: total, reused, computed, failed
    # Per setting: mean, spread, non-converged and verdict counts (common.summarize), written to
    # summary.csv, results.md and experiment.json; empty for an experiment without attacks.
    summary: list[dict[str, Any]] = field(default_factory=list)
    summary_columns: list[str] = field(default_factory=list)


ExperimentFn = Callable[[ExperimentOptions, Workspace], ExperimentResult]
EXPERIMENTS: dict[str, tuple[ExperimentFn, str]] = {}
# Options only some experiments take (opted into with ``experiment(..., accepts=...)``); any other
# experiment refuses them rather than ignore them.
OPT_IN_OPTIONS = ("trained",)
ACCEPTS: dict[str, frozenset[str]] = {}


def experiment(name: str) -> Callable[[ExperimentFn], ExperimentFn]:
    """Register the experiment ``name`` its module declares in its ``SPEC`` literal (name, one-line
    summary, opt-in ``accepts``; read without torch by specs.declarations, so that `gradleak list`
    and a misspelt name need no experiment module)."""
    from ..specs import declarations

    declared = declarations("experiment").get(name)
    if declared is None:
        raise ValueError(f"experiment {name}: declare it (a SPEC literal with its name and summary) in its module")
    accepts = tuple(declared.get("accepts", ()))
    unknown = set(accepts) - set(OPT_IN_OPTIONS)
    if unknown:
        raise ValueError(f"experiment {name}: unknown opt-in options {sorted(unknown)}")

    def register(fn: ExperimentFn) -> ExperimentFn:
        if fn.__module__ != declared.module:
            raise ValueError(f"experiment {name} is declared in {declared.module}, not {fn.__module__}")
        EXPERIMENTS[name] = (fn, declared.summary)
        ACCEPTS[name] = frozenset(accepts)
        return fn
    return register


def experiment_names() -> list[str]:
    _load_all()
    return sorted(EXPERIMENTS)


def _load_all() -> None:
    import importlib
    import pkgutil

    # the registry finds its plug-ins by name: no import of the package that imports it
    for mod in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if mod.name != "base":
            importlib.import_module(f"{__package__}.{mod.name}")


def make_options(**values: Any) -> ExperimentOptions:
    try:
        return ExperimentOptions(**values)
    except ValidationError as exc:
        raise config_error(exc) from None


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.3e}" if (v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e5)) else f"{v:.3f}"
    return str(v)


def markdown_table(columns: list[str], rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def _csv_text(columns: list[str], rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    return buf.getvalue()


def machine() -> dict[str, Any]:
    """Where the experiment ran: CPU model and count, torch, Python, platform. Cells of attacks
    that do not converge end elsewhere on another CPU model (its kernels round differently), so
    experiment.json records it."""
    import platform

    import torch

    from ..runtime import cpu_model

    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform()}


def atomic_write_text(path: Path, text: str) -> None:
    from ..paths import atomic_write_bytes

    atomic_write_bytes(path, text.encode("utf-8"))


#: The names a row key takes in the files an experiment writes (results.csv, summary.csv, results.md,
#: experiment.json): the PSNR of a slot paired with the truth by pixels is an oracle's pairing
#: (metrics/matching.py), beside ``psnr_by_label``, the paper's and the attacker's. Older folders
#: (their ``psnr``) are read under either name (reproduction/collect.py).
OUTPUT_NAMES = {"psnr": "psnr_oracle_pairing"}
_SUFFIXES = ("", "_mean", "_std", "_min", "_max", "_mean_converged")


def output_name(column: str) -> str:
    """The name ``column`` (a row key, or a summary's ``<key>_mean``...) takes in the written files."""
    for old, new in OUTPUT_NAMES.items():
        for suffix in _SUFFIXES:
            if column == old + suffix:
                return new + suffix
    return column


def output_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with their keys under :func:`output_name`."""
    return [{output_name(k): v for k, v in r.items()} for r in rows]


def write_result(result: ExperimentResult, out: Path) -> None:
    """Write results.csv (one row per sample), summary.csv (per setting, if the experiment has a
    summary), results.md and experiment.json into ``out`` (figures already there), every row key
    under its written name (:func:`output_name`)."""
    # each file is written whole or not at all (an experiment's --out is reused by its reruns, so a
    # file cut short by a signal would stay there)
    columns, rows = [output_name(c) for c in result.columns], output_rows(result.rows)
    summary_columns, summary = [output_name(c) for c in result.summary_columns], output_rows(result.summary)
    atomic_write_text(out / "results.csv", _csv_text(columns, rows))
    if summary_columns:
        atomic_write_text(out / "summary.csv", _csv_text(summary_columns, summary))
    atomic_write_text(out / "results.md", results_markdown(result.name, result.title, result.setup, columns, rows,
                                                           summary_columns, summary, result.notes, result.figures,
                                                           result.wall_seconds, result.cells))
    record = {"name": result.name, "title": result.title, "setup": result.setup, "rows": rows,
              "summary": summary, "notes": result.notes, "figures": result.figures,
              "wall_seconds": result.wall_seconds, "cells": result.cells, "machine": machine()}
    atomic_write_text(out / "experiment.json", json.dumps(record, indent=2, default=str))


MEANS_NOTE = ("Summary per setting: `<metric>_mean`, `_std` (sample standard deviation, n - 1), `_min`, `_max` "
              "are over ALL samples, the inconclusive ones included (a failed attack lowers the mean: it is not "
              "evidence of protection); `<metric>_mean_converged` is over the samples whose attack converged only. "
              "`non_converged`: samples whose attack did not converge (attacks/verdict.py); `leaked`, "
              "`inconclusive`, `defended`: the verdicts of results.csv's rows (gradleak/outcome.py).")
#: Added to MEANS_NOTE where a sample is a batch of images (a summary with an ``images`` column).
IMAGES_NOTE = ("Here a sample is one attack on a batch of `images` images: `samples` and `non_converged` count "
               "batches; the means, spreads and verdict columns are over images (results.csv has a row per image).")


def results_markdown(name: str, title: str, setup: dict[str, Any], columns: list[str], rows: list[dict[str, Any]],
                     summary_columns: list[str], summary: list[dict[str, Any]], notes: list[str],
                     figures: list[str], wall_seconds: float, cells: dict[str, Any] | None = None) -> str:
    """results.md of an experiment from what its files hold (rows and summary under their written
    names): what :func:`write_result` writes, and what reproduction/collect.py writes again from a
    folder's committed results.csv, summary.csv and experiment.json. ``cells`` (CellsReport.to_dict):
    a run that replayed cells from its store says so beside its time, which is then no compute time."""
    summary_md = ""
    if summary_columns:
        means_note = MEANS_NOTE + (f" {IMAGES_NOTE}" if "images" in summary_columns else "")
        summary_md = (f"## Summary per setting (summary.csv)\n\n{markdown_table(summary_columns, summary)}"
                      f"\n\n{means_note}\n\n")
    setup_md = "\n".join(f"- **{k}**: {_fmt(v) if not isinstance(v, (list, dict)) else json.dumps(v)}"
                         for k, v in setup.items())
    notes_md = "\n".join(f"- {n}" for n in notes)
    figs = "\n".join(f"![{f}]({f})" for f in figures)
    took = f"{wall_seconds:.0f} s"
    if cells and cells.get("reused"):
        took += (f" for this run, which computed {cells.get('computed', 0)} of its {cells.get('total', 0)} cells and "
                 f"replayed {cells['reused']} from its cell store (not what computing them takes)")
    return (f"# {title}\n\nExperiment `{name}`, {len(rows)} rows, "
            f"{took}.\n\n## Setup\n\n{setup_md}\n\n## Results\n\n"
            f"{markdown_table(columns, rows)}\n\n" + summary_md
            + (f"## Notes\n\n{notes_md}\n\n" if notes_md else "") + figs + "\n")


def run_experiment(name: str, options: ExperimentOptions) -> tuple[ExperimentResult, Path]:
    """Run an experiment into ``options.out`` (DIR): a new folder, or an earlier run's of the same
    experiment, which is resumed (see cells.py). The outputs are written into a staging folder
    and moved into DIR when complete; a new DIR is removed again if the experiment fails before
    any cell finished. Cells that failed are listed in the notes and experiment.json, and said on
    stderr."""
    _load_all()
    if name not in EXPERIMENTS:
        raise unknown("experiment", name, EXPERIMENTS)
    if options.threads:
        import torch

        torch.set_num_threads(options.threads)
    for option in OPT_IN_OPTIONS:
        if getattr(options, option) and option not in ACCEPTS.get(name, frozenset()):
            raise ConfigError(f"--{option.replace('_', '-')} does not apply to experiment {name}")
    fn, _ = EXPERIMENTS[name]
    start = time.perf_counter()
    folder, new = open_folder(options.out, name)  # checked (and created) before any work
    try:
        with folder_lock(folder):
            stage = stage_outputs(folder)
            try:
                ws = Workspace(name, options, folder, stage)
                result = fn(options, ws)
                result.cells = ws.report.to_dict()
                result.notes = result.notes + ws.report.notes()
                result.wall_seconds = time.perf_counter() - start
                write_result(result, stage)
                commit_outputs(stage, folder)
            except BaseException:
                shutil.rmtree(stage, ignore_errors=True)
                raise
    except BaseException:
        if new is not None:
            remove_new_folder(folder, new)
        raise
    if ws.report.failed:
        import sys

        print(f"gradleak: {len(ws.report.failed)} of {ws.report.total} cells of experiment {name} failed "
              f"(listed in {Path(options.out) / 'results.md'}); rerun with --retry-failed to compute them again",
              file=sys.stderr)
    return result, Path(options.out)

