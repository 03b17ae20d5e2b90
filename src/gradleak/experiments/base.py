"""Experiment commands: each answers one question from the papers or their reviews with this
project's own measured numbers, and writes results.csv, results.md (setup + table), a figure and
experiment.json. Experiments only call the public API (runner, attacks, metrics), never reach
inside.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..config import config_error
from ..paths import StagedDir
from ..errors import UnknownNameError


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
    seed: int = Field(0, ge=0, description="base seed")
    threads: int | None = Field(None, ge=1, le=512, description="torch CPU threads")
    progress: bool = Field(True, description="show progress")


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


ExperimentFn = Callable[[ExperimentOptions, Path], ExperimentResult]
EXPERIMENTS: dict[str, tuple[ExperimentFn, str]] = {}


def experiment(name: str, description: str) -> Callable[[ExperimentFn], ExperimentFn]:
    def register(fn: ExperimentFn) -> ExperimentFn:
        EXPERIMENTS[name] = (fn, description)
        return fn
    return register


def experiment_names() -> list[str]:
    _load_all()
    return sorted(EXPERIMENTS)


def _load_all() -> None:
    import importlib
    import pkgutil

    from .. import experiments as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        if mod.name != "base":
            importlib.import_module(f"{pkg.__name__}.{mod.name}")


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


def write_result(result: ExperimentResult, out: Path) -> None:
    """Write results.csv, results.md and experiment.json into ``out`` (figures already there)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=result.columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in result.rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    (out / "results.csv").write_text(buf.getvalue())
    setup = "\n".join(f"- **{k}**: {_fmt(v) if not isinstance(v, (list, dict)) else json.dumps(v)}"
                      for k, v in result.setup.items())
    notes = "\n".join(f"- {n}" for n in result.notes)
    figs = "\n".join(f"![{f}]({f})" for f in result.figures)
    md = (f"# {result.title}\n\nExperiment `{result.name}`, {len(result.rows)} rows, "
          f"{result.wall_seconds:.0f} s.\n\n## Setup\n\n{setup}\n\n## Results\n\n"
          f"{markdown_table(result.columns, result.rows)}\n\n" + (f"## Notes\n\n{notes}\n\n" if notes else "") + figs + "\n")
    (out / "results.md").write_text(md)
    (out / "experiment.json").write_text(json.dumps({"name": result.name, "title": result.title,
                                                      "setup": result.setup, "rows": result.rows,
                                                      "notes": result.notes, "figures": result.figures,
                                                      "wall_seconds": result.wall_seconds}, indent=2, default=str))


def run_experiment(name: str, options: ExperimentOptions) -> tuple[ExperimentResult, Path]:
    """Run an experiment into a hidden sibling folder, then rename it to ``options.out``."""
    _load_all()
    if name not in EXPERIMENTS:
        raise UnknownNameError(f"unknown experiment {name!r}; known: {', '.join(sorted(EXPERIMENTS))}")
    if options.threads:
        import torch

        torch.set_num_threads(options.threads)
    fn, _ = EXPERIMENTS[name]
    start = time.perf_counter()
    with StagedDir(options.out) as stage:  # checked and created before the experiment runs
        result = fn(options, stage.path)
        result.wall_seconds = time.perf_counter() - start
        write_result(result, stage.path)
        out = stage.commit()
    return result, out
