"""The one skeleton of a run folder's report.html, image or text (issue 58): it checks and reads
the folder (bounded, never through a link), frames the page (title, subtitle, the verdict notice,
the history plot's slot, versions, the config) and writes it atomically. A modality supplies only
its own sections, as a :class:`RunPage` (gradleak.report.html, gradleak.text.report)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from gradleak.errors import DataError
from gradleak.paths import check_output_file, loads_json, one_line, read_text_file
from gradleak.report.page import html_page, kv_table, verdict_notice, write_page

# Bounds on the run folder's files, which are read whole: metrics.json and config.json are a few
# KB, history.csv one line per logged iteration.
MAX_JSON_BYTES = 8 * 1024 * 1024
MAX_HISTORY_BYTES = 32 * 1024 * 1024
# A run folder being written is a hidden staging folder next to its final place:
# ".<name>.partial-<host>-<pid>-<random>" (gradleak.paths.StagedDir) or, from older writers,
# ".<name>.partial-<pid>". The report names the run by its final name.
_STAGING = re.compile(r"^\.(?P<name>.+)\.partial-(?:[A-Za-z0-9_-]+-\d+-[A-Za-z0-9_]+|\d+)$")


# --------------------------------------------------------------------------- names


def display_name(path: str | os.PathLike[str], *, full: bool = False) -> str:
    """A path's name (or, with ``full``, the whole path) as text that can always be printed and
    encoded as UTF-8: bytes that are not UTF-8 (surrogate escapes) show as U+FFFD; ``.`` and
    ``..`` show as the folder they name."""
    text = os.fspath(path)
    if not full:
        p = Path(text)
        text = p.name if p.name not in ("", ".", "..") else Path(os.path.abspath(text)).name or text
    return os.fsencode(text).decode("utf-8", "replace")


def run_name(run_dir: str | os.PathLike[str]) -> str:
    """The name a run folder is known by: its staging folder's name without the hidden-staging
    decoration (``.r01-dlg.partial-host-8807-x1y2`` -> ``r01-dlg``)."""
    name = display_name(run_dir)
    m = _STAGING.match(name)
    return m["name"] if m else name


# --------------------------------------------------------------------------- reading


def check_folder(folder: Path, what: str, hint: str) -> None:
    """DataError unless ``folder`` is a folder: "WHAT FOLDER does not exist" / "WHAT FOLDER is a
    file; HINT" (``hint`` says what to give instead)."""
    if not os.path.lexists(folder):
        raise DataError(f"{what} {folder} does not exist")
    if not folder.is_dir():
        kind = "a file" if folder.is_file() else "not a folder"
        raise DataError(f"{what} {folder} is {kind}; {hint}")


def check_run_dir(run_dir: Path) -> None:
    check_folder(run_dir, "run folder", "give the folder of a run")


def check_not_link(path: Path) -> None:
    """A run's file is read from the run folder itself, never through a symbolic link: a report
    shows only what its folder holds (a link could bring any file of the machine into the page)."""
    if path.is_symlink():
        raise DataError(f"{one_line(str(path))} is a symbolic link, not a regular file of the run folder; a report "
                        "shows only what its run folder holds and never follows a link")


def read_json_file(path: Path, required: bool, what: str = "run file") -> Any:
    """Parsed JSON at ``path`` (a regular file of at most MAX_JSON_BYTES, nested at most
    MAX_JSON_DEPTH levels); None if absent and not required. Present but unusable (a link, a
    folder, a device or FIFO, too large, not UTF-8, not JSON, too deep) is one DataError."""
    if not os.path.lexists(path):
        if required:
            raise DataError(f"{path} not found: a run folder needs {path.name} to be reported")
        return None
    check_not_link(path)
    text = read_text_file(path, what, max_bytes=MAX_JSON_BYTES)
    return loads_json(text, str(path))


def read_metrics(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """RUN/metrics.json as a dict (what ``gradleak report`` reads to choose the image or text
    report), or one DataError / InputFileError."""
    path = Path(run_dir) / "metrics.json"
    metrics = read_json_file(path, required=True)
    if not isinstance(metrics, dict):
        raise DataError(f"{path} must hold a JSON object")
    return metrics


def read_csv_rows(path: Path, what: str = "run file") -> list[dict[str, Any]] | None:
    """Rows of a small CSV file as dicts of strings (empty cells kept as ""), None if absent.
    A link, folder, device, too large a file, undecodable text or broken CSV is one DataError."""

    if not os.path.lexists(path):
        return None
    check_not_link(path)
    text = read_text_file(path, what, max_bytes=MAX_HISTORY_BYTES)
    try:
        return [dict(row) for row in csv.DictReader(io.StringIO(text, newline=""))]
    except csv.Error as exc:
        raise DataError(f"{path} is not a readable CSV file: {exc}") from None


def check_report_target(run_dir: Path) -> Path:
    """RUN/report.html may be written: not a folder, link or device, in a folder that can be
    written (checked before anything is read or drawn)."""

    return check_output_file(run_dir / "report.html", "report")


# --------------------------------------------------------------------------- the frame's sections


def folded_json(value: Any, summary: str) -> str:
    """A JSON dump folded behind a <details> element: the raw record is there for whoever wants
    it, without pushing a long block of text onto every reader of the page."""
    text = json.dumps(value, indent=2, default=str, ensure_ascii=False)
    return f"<details><summary>{summary}</summary><pre>{escape(text)}</pre></details>"


def report_subtitle(kind: str, run_dir: Path, name: str | None) -> str:
    """A run report's subtitle (HTML): ``gradleak KIND · NAME``, NAME the run's (escaped) name,
    by default the folder's (see :func:`run_name`)."""
    return f"gradleak {kind} &middot; {escape(name if name is not None else run_name(run_dir))}"


def run_title(metrics: Mapping[str, Any]) -> str:
    """A run report's title (HTML): ``ATTACK on MODEL, DATA``, each escaped, "?" where metrics.json
    leaves it out, null or empty."""

    def field(key: str) -> str:
        v = metrics.get(key)
        return escape(str(v)) if v not in (None, "") else "?"

    return f"{field('attack')} on {field('model')}, {field('data')}"


def versions_section(metrics: Mapping[str, Any], fmt: Callable[[str, Any], str]) -> str:
    """The versions the run recorded (metrics.json's ``versions``), as a table; "" when none."""
    versions = metrics.get("versions")
    if isinstance(versions, Mapping) and versions:
        return "<h2>Versions</h2>" + kv_table(versions, fmt)
    return ""


def config_section(config: Any) -> str:
    """The run's resolved config (config.json), folded, or a note that the folder has none."""
    if config is None:
        return '<h2>Config</h2><p class="muted">no config.json in this run folder</p>'
    return "<h2>Config</h2>" + folded_json(
        config, "the run's resolved config (config.json; <code>gradleak attack --config</code> reruns it)")


# --------------------------------------------------------------------------- the skeleton


@dataclass(frozen=True)
class RunFolder:
    """What every run report reads of its folder before any section is built: metrics.json
    (required, an object), config.json and history.csv (None when absent)."""

    path: Path
    metrics: dict[str, Any]
    config: Any
    history: list[dict[str, Any]] | None


@dataclass(frozen=True)
class RunPage:
    """A modality's part of its run report. ``kind`` names the page in its subtitle ("run
    report"); ``css`` is its stylesheet; ``fmt`` writes a value with the modality's units (the
    versions table). ``summary`` gives the summary's table and notes (under the heading and the
    verdict notice), ``evidence`` the modality's own sections in page order, ``history`` the
    history plot's section; each reads what it needs of the :class:`RunFolder`."""

    kind: str
    css: str
    fmt: Callable[[str, Any], str]
    summary: Callable[[RunFolder], str]
    evidence: Callable[[RunFolder], Sequence[str]]
    history: Callable[[RunFolder], str]


def read_run_folder(run_dir: Path) -> RunFolder:
    """metrics.json, config.json and history.csv of ``run_dir``, in that order (the first unusable
    one is the error)."""
    return RunFolder(run_dir, read_metrics(run_dir), read_json_file(run_dir / "config.json", required=False),
                     read_csv_rows(run_dir / "history.csv"))


def render_run_report(run_dir: str | os.PathLike[str], page: RunPage, *, name: str | None = None) -> Path:
    """Write ``run_dir/report.html`` with the modality's ``page`` in the one frame and return its
    path: the title, the subtitle (``name``, by default the folder's, see :func:`run_name`), the
    summary under the verdict notice, the modality's evidence, its history plot, the versions and
    the config. The folder and the target are checked, and the folder's files read, before any
    section is built; nothing is written when one of them is unusable (one DataError)."""
    run_dir = Path(run_dir)
    check_run_dir(run_dir)
    target = check_report_target(run_dir)
    run = read_run_folder(run_dir)
    body = "\n".join([
        f"<h2>Summary</h2>{verdict_notice(run.metrics)}{page.summary(run)}",
        *page.evidence(run),
        page.history(run),
        versions_section(run.metrics, page.fmt),
        config_section(run.config),
    ])
    return write_page(target, html_page(run_title(run.metrics), report_subtitle(page.kind, run_dir, name), body,
                                        css=page.css))
