"""Every committed reproduction folder's results.md is what reproduction/collect.py writes today
from the folder's own files (issue 62): rewrite a copy of reproduction/ and compare."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "reproduction"


def _collect(here: Path):
    spec = importlib.util.spec_from_file_location("reproduction_collect", ROOT / "collect.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.HERE = here
    return module


def test_every_results_md_is_what_collect_writes(tmp_path):
    copy = tmp_path / "reproduction"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("run", "run-*", "cells", "*.png"))
    collect = _collect(copy)
    names = collect.folders()
    assert len(names) >= 20
    stale = []
    for name in names:
        before = (copy / name / "results.md").read_text()
        collect.rewrite(name)
        if (copy / name / "results.md").read_text() != before:
            stale.append(name)
    assert stale == [], f"results.md not what collect.py writes today: {stale}"


def test_every_recomputed_summary_is_what_the_experiments_summary_code_writes(tmp_path):
    """reproduction/resummarise.py (summaries recomputed from committed rows, no rerun) leaves the
    folders it was run on as they are: their summary.csv and experiment.json are today's summary code's."""
    spec = importlib.util.spec_from_file_location("reproduction_resummarise", ROOT / "resummarise.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in ("defenses-malicious", "optimizers", "training-stage", "identifiability"):
        folder = tmp_path / name
        shutil.copytree(ROOT / name, folder, ignore=shutil.ignore_patterns("run", "run-*", "*.png"))
        for suffix in ["", *sorted(p.stem[len("experiment"):] for p in folder.glob("experiment-*.json"))]:
            before = [(folder / f).read_text() for f in (f"summary{suffix}.csv", f"experiment{suffix}.json")]
            assert module.resummarise(folder, suffix) == [], (name, suffix)
            after = [(folder / f).read_text() for f in (f"summary{suffix}.csv", f"experiment{suffix}.json")]
            assert after == before, (name, suffix)
