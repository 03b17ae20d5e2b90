"""Recompute a folder's summary (summary.csv and experiment.json's "summary") from its committed rows
with today's summary code, without rerunning a cell: for folders whose run predates a summary column
(the paper's pairing, the zero and public prior images: issue 62). A summary is a function of the rows
alone, so this is what the experiment writes today from the same cells. Every value the old summary
had must come out the same, or nothing is written. Then ``collect.py --rewrite NAME``.

    python reproduction/resummarise.py defenses optimizers training-stage ...
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable

from gradleak.experiments import defense_tradeoff, identifiability, local_iterations, optimizers, training_stage
from gradleak.experiments.base import OUTPUT_NAMES, output_name, output_rows
from gradleak.experiments.common import summarize, summary_columns

HERE = Path(__file__).resolve().parent
Summary = Callable[[list[dict[str, Any]]], tuple[list[dict[str, Any]], list[str]]]


def _by(by: list[str], values: tuple[str, ...], images: bool = False) -> Summary:
    return lambda rows: (summarize(rows, by, values=values, images=images), summary_columns(by, values, images=images))


#: experiment name -> its summary of the rows, as the experiment computes it
SUMMARIES: dict[str, Summary] = {
    "defenses": lambda rows: (defense_tradeoff.setting_summary(rows), defense_tradeoff.SUMMARY_COLUMNS),
    "optimizers": _by(["optimizer"], optimizers.SUMMARY_VALUES),
    "training-stage": _by(["fraction", "test_accuracy"], training_stage.SUMMARY_VALUES),
    "identifiability": _by(["batch_size", "population"], identifiability.SUMMARY_VALUES, images=True),
    "local-iterations": _by(["sweep", "batch_size", "local_steps", "local_batch_size"],
                            local_iterations.SUMMARY_VALUES),
}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)
    return a == b


def resummarise(folder: Path, suffix: str = "") -> list[str]:
    """Rewrite ``folder``'s summary{suffix}.csv and experiment{suffix}.json's summary; the new columns."""
    doc_path = folder / f"experiment{suffix}.json"
    doc = json.loads(doc_path.read_text())
    inverse = {new: old for old, new in OUTPUT_NAMES.items()}
    rows = [{inverse.get(k, k): v for k, v in r.items()} for r in doc["rows"]]
    summary, columns = SUMMARIES[doc["name"]](rows)
    summary, columns = output_rows(summary), [output_name(c) for c in columns]
    old = doc["summary"]
    if len(old) != len(summary):
        raise SystemExit(f"{doc_path}: {len(old)} summary rows before, {len(summary)} now")
    for before, now in zip(old, summary, strict=True):
        moved = [k for k, v in before.items() if not _same(v, now.get(k))]
        if moved:
            raise SystemExit(f"{doc_path}: the summary's {', '.join(moved)} would change; nothing written")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in summary:
        writer.writerow({k: ("" if v is None else v) for k, v in r.items()})
    added = [c for c in columns if c not in next(csv.reader((folder / f"summary{suffix}.csv").open()))]
    (folder / f"summary{suffix}.csv").write_text(buf.getvalue())
    doc["summary"] = summary
    doc_path.write_text(json.dumps(doc, indent=2, default=str))   # as experiments/base.write_result writes it
    return added


if __name__ == "__main__":
    for name in sys.argv[1:]:
        folder = HERE / name
        for suffix in [""] + sorted(p.stem[len("experiment"):] for p in folder.glob("experiment-*.json")):
            print(f"{name}{suffix}: added {', '.join(resummarise(folder, suffix)) or 'nothing'}")
