"""What a dashboard reads of a folder, bounded and never through a link: a Flower audit's audit.csv,
a folder of run folders (metrics.json, config.json), and which of these (or a sweep's or an
experiment's store) the folder holds (:func:`load_source`)."""

from __future__ import annotations

import csv
import errno
import io
import math
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradleak.config import flat_config
from gradleak.errors import ConfigError, DataError
from gradleak.paths import one_line
from gradleak.report.dashboard.data import (AUDIT_NUMERIC, AUDIT_REQUIRED, AUDIT_RUN, EXPERIMENT_CELLS, MAX_AUDIT_BYTES,
                                            RUN_IMAGE, Cell, Item, RunCell, Source, StoreAccess, attacked_fields,
                                            cell_item, load_store, plain_file, separated_text, server_text,
                                            shown_error, store_folder)
from gradleak.report.risk import Verdict, converged_of, finite, inside, judge, psnr_of


# ------------------------------------------------------------------ audit.csv (Flower audit)
def read_audit(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows of a Flower audit's audit.csv. Every row must have as many fields as the
    header, the header must name round and client, round must be an integer, the numeric
    columns numbers (or empty) and a run folder runs/NAME (or empty); otherwise one DataError
    naming the file and line."""
    from gradleak.paths import read_text_file

    text = read_text_file(path, "audit file", max_bytes=MAX_AUDIT_BYTES)
    if "\x00" in text:
        raise DataError(f"audit file {path} holds NUL bytes: not a CSV file")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if not header:
            raise DataError(f"audit file {path} is empty: no header line")
        missing = [c for c in AUDIT_REQUIRED if c not in header]
        if missing:
            raise DataError(f"audit file {path} has no column {', '.join(missing)} "
                            f"(header: {one_line(','.join(header), 120)})")
        if len(set(header)) != len(header):
            raise DataError(f"audit file {path}: a column name appears twice in the header")
        rows: list[dict[str, str]] = []
        for fields in reader:
            line = reader.line_num
            if not fields:
                continue
            if len(fields) != len(header):
                raise DataError(f"audit file {path} line {line}: {len(fields)} fields, the header has {len(header)}")
            row = dict(zip(header, fields, strict=True))
            try:
                rnd = int(row["round"])
            except ValueError:
                raise DataError(f"audit file {path} line {line}: round {one_line(repr(row['round']), 40)} "
                                "is not an integer") from None
            if not 0 <= rnd < 2**31:
                raise DataError(f"audit file {path} line {line}: round {rnd} is out of range")
            for c in AUDIT_NUMERIC:
                v = row.get(c, "")
                if v:
                    try:
                        float(v)
                    except ValueError:
                        raise DataError(f"audit file {path} line {line}: {c} {one_line(repr(v), 40)} "
                                        "is not a number") from None
            run = row.get("run", "")
            if run and not AUDIT_RUN.fullmatch(run):
                raise DataError(f"audit file {path} line {line}: run {one_line(repr(run), 80)} is not a run folder "
                                "of the audit (runs/NAME)")
            rows.append(row)
    except csv.Error as exc:
        raise DataError(f"audit file {path} is not a readable CSV file: {one_line(str(exc))}") from None
    return header, rows


def _bool(text: str | None) -> bool | None:
    t = (text or "").strip().lower()
    return True if t in ("true", "1", "yes") else False if t in ("false", "0", "no") else None


def audit_verdict(row: Mapping[str, str]) -> Verdict:
    """The verdict of one row of an audit.csv written before run folders, from its own columns.
    Audits written before audit.csv had ``noise_floor``: an update with no defenses has none; a
    defended one's is unknown."""
    defenses = [d for d in (row.get("defenses") or "").split(";") if d]
    floor: Any = row.get("noise_floor") if "noise_floor" in row else (0.0 if not defenses else None)
    if floor == "":
        floor = 0.0 if not defenses else None
    unmodelled = [d for d in (row.get("unmodelled_defenses") or "").split(";") if d]
    return judge(row.get("status", "ok") or "ok", row.get("psnr_mean") or None, _bool(row.get("converged")),
                 attack=row.get("attack"), noise_floor=floor, unmodelled=unmodelled, defenses=defenses)


def _text(v: Any) -> str:
    """A value as an audit.csv cell holds it (what the rows of audits before run folders held)."""
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ""
    if isinstance(v, list):
        return ";".join(str(x) for x in v)
    return str(v)


def run_details(metrics: Mapping[str, Any]) -> dict[str, str]:
    """What an audited update's run folder says of it beyond the index, in the columns of audits
    before run folders: its batch, FedAvg hyper-parameters, defenses, scores, convergence and time;
    and what the server sent and a closed form's separated inputs ("S of K")."""
    def part(key: str) -> Mapping[str, Any]:
        v = metrics.get(key)
        return v if isinstance(v, Mapping) else {}

    conv, threat, audit = part("convergence"), part("threat"), part("audit")
    values = {"num_examples": metrics.get("batch_size"), "local_steps": threat.get("local_steps"),
              "local_batch_size": threat.get("local_batch_size"), "local_lr": threat.get("local_lr"),
              "defenses": metrics.get("defenses"), "ssim_mean": metrics.get("ssim_mean"),
              "mse_mean": metrics.get("mse_mean"), "label_accuracy": metrics.get("label_accuracy"),
              "gradient_distance": metrics.get("gradient_distance"), "converged": metrics.get("converged"),
              "noise_floor": conv.get("noise_floor"), "unmodelled_defenses": conv.get("unmodelled_defenses"),
              "iterations": metrics.get("iterations"), "attack_seconds": audit.get("attack_seconds"),
              "update_norm": audit.get("update_norm"), "server": server_text(metrics),
              "separated": separated_text(metrics)}
    return {k: _text(v) for k, v in values.items() if v is not None}


def audit_item(row: dict[str, str], root: Path, files: RunFiles | None = None) -> Item:
    """One index row; with a run folder (``run``), judged on its metrics.json as a cell is (read by
    ``files``: bounded, never through a link)."""
    status = row.get("status", "ok") or "ok"
    run = row.get("run") or None
    if run is None:   # not attacked, or an audit before run folders: the row is all there is
        v = audit_verdict(row)
        return Item(key=(int(row["round"]), row["client"]), verdict=v,
                    psnr=psnr_of(row.get("psnr_mean") or None) if v.truth else None,
                    rel=finite(row.get("relative_gradient_distance") or None), status=status,
                    fields=dict(row), metrics=dict(row), image=row.get("reconstruction") or None,
                    error=shown_error(row.get("error")))
    folder = inside(root, run)
    if folder is None or folder.is_symlink() or not folder.is_dir():
        raise DataError(f"{root / 'audit.csv'}: the run folder of round {row['round']}, client "
                        f"{one_line(row['client'], 80)} ({run}) is missing or not a folder of {root}")
    m = (files or RunFiles(root)).read(folder / "metrics.json", required=True)
    if not isinstance(m, dict):
        raise DataError(f"{one_line(str(folder / 'metrics.json'))} must hold a JSON object")
    fields = {**row, **run_details(m)}
    attack = m.get("attack") if isinstance(m.get("attack"), str) else row.get("attack")
    v = judge(status, m.get("psnr_mean"), converged_of(m), metrics={**m, "attack": attack}) if status == "ok" else \
        judge(status, None, None, attack=attack)
    conv = m.get("convergence") if isinstance(m.get("convergence"), dict) else {}
    image = f"{run}/{RUN_IMAGE}" if plain_file(root, f"{run}/{RUN_IMAGE}") else None
    return Item(key=(int(row["round"]), row["client"]), verdict=v, psnr=psnr_of(m.get("psnr_mean")) if v.truth else None,
                rel=finite(conv.get("relative_gradient_distance", m.get("relative_gradient_distance"))),
                status=status, fields=fields, metrics=dict(fields), image=image, error=shown_error(row.get("error")),
                run=run)


def load_audit(folder: Path) -> Source:
    header, rows = read_audit(folder / "audit.csv")
    files = RunFiles(folder)
    return Source(kind="audit", folder=folder, data=folder, items=[audit_item(r, folder, files) for r in rows],
                  audit_columns=header)


# A folder of runs is read within these bounds, declared here and checked before anything is
# parsed: the scan sums the sizes of every run's metrics.json and config.json (each run counted,
# hard links too: the page's work grows with the runs it shows), and each file's text is bounded
# in the values it can hold before it is parsed (JSON of empty objects costs ~25x its size in
# memory). Past a bound the command stops with one line: a risk report that left runs out could
# miss the one that leaked.
MAX_RUN_FOLDERS = 10_000   # run folders a "runs" dashboard reads
MAX_RUNS_BYTES = 64 * 1024 * 1024   # metrics.json + config.json text, all runs together
MAX_RUNS_VALUES = 2_000_000   # JSON values parsed, all distinct files together
RUN_FILES = ("metrics.json", "config.json")
NO_LINKS = "a dashboard shows only what its folder holds and never follows a link"


def json_values_bound(text: str) -> int:
    """At most how many values (object keys aside) JSON ``text`` holds, without parsing it: every
    value is the document, the first in an array or object, or follows a comma."""
    return 1 + text.count(",") + text.count("[") + text.count("{")


class RunFiles:
    """Reads the JSON files of a folder's run folders within the folder's budget
    (:data:`MAX_RUNS_BYTES`, :data:`MAX_RUNS_VALUES`), never through a symbolic link (the page
    shows only what the folder holds), and each file (inode) parsed once: hard links of one
    metrics.json share one parsed value."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.bytes = 0
        self.values = 0
        self._parsed: dict[tuple[int, int], tuple[tuple[int, int], Any]] = {}

    def _over(self, what: str) -> DataError:
        return DataError(f"{one_line(str(self.folder))}: its run folders hold more than {what}, more than a "
                         "dashboard reads; give a folder with fewer runs (e.g. move some into a subfolder)")

    def charge_bytes(self, n: int) -> None:
        self.bytes += n
        if self.bytes > MAX_RUNS_BYTES:
            raise self._over(f"{MAX_RUNS_BYTES // 2**20} MiB of metrics.json and config.json")

    def read(self, path: Path, *, required: bool) -> Any:
        """The parsed JSON at ``path``; None when absent and not required. A link, a file that is
        not a regular one, too large, not UTF-8 or not JSON is one DataError naming it."""
        from gradleak.paths import loads_json
        from gradleak.report.run_page import MAX_JSON_BYTES

        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        shown = one_line(str(path))
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            if required:
                raise DataError(f"{shown} not found: a run folder needs {path.name} to be shown") from None
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise DataError(f"{shown} is a symbolic link, not a regular file of the folder; {NO_LINKS}") from None
            raise DataError(f"{shown} cannot be read: {exc.strerror or exc}") from None
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise DataError(f"{shown} is not a regular file")
            if st.st_size > MAX_JSON_BYTES:
                raise DataError(f"{shown} is {st.st_size} bytes; at most {MAX_JSON_BYTES} are read")
            self.charge_bytes(st.st_size)
            version = (st.st_size, st.st_mtime_ns)
            cached = self._parsed.get((st.st_dev, st.st_ino))
            if cached is not None and cached[0] == version:
                return cached[1]
            try:
                text = fh.read(MAX_JSON_BYTES + 1).decode("utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{shown} is not UTF-8 text") from None
            except OSError as exc:
                raise DataError(f"{shown} cannot be read: {exc.strerror or exc}") from None
        if len(text) > MAX_JSON_BYTES:
            raise DataError(f"{shown} grew past {MAX_JSON_BYTES} bytes while it was read")
        self.values += json_values_bound(text)
        if self.values > MAX_RUNS_VALUES:
            raise self._over(f"{MAX_RUNS_VALUES:,} JSON values")
        value = loads_json(text, shown)
        self._parsed[(st.st_dev, st.st_ino)] = (version, value)
        return value


@dataclass
class RunScan:
    """The run folders of a folder of runs, and the symbolic links the scan did not follow."""

    runs: list[Path]
    links: list[str]   # relative to the folder: links to a run folder, a metrics.json or a config.json
    bytes: int         # metrics.json + config.json, every run counted


def _run_entry(e: os.DirEntry[str], links: list[str]) -> int | None:
    """The size of a run folder's JSON files, or None when ``e`` is not a run folder to read (not a
    folder, no metrics.json, or a link on the way: added to ``links``)."""
    if e.is_symlink():
        links.append(e.name)
        return None
    if not e.is_dir(follow_symlinks=False):
        return None
    size = 0
    for name in RUN_FILES:
        try:
            st = os.lstat(os.path.join(e.path, name))
        except OSError:
            if name == "metrics.json":
                return None
            continue
        if stat.S_ISLNK(st.st_mode):
            links.append(f"{e.name}/{name}")
            return None
        if name == "metrics.json" and not stat.S_ISREG(st.st_mode):
            return None
        size += st.st_size
    return size


def scan_runs(folder: Path) -> RunScan:
    """The run folders in ``folder`` (gradleak attack's --out folders: a metrics.json inside), in
    name order, hidden (staging) folders left out; a run folder that is a link, or whose
    metrics.json or config.json is one, is never followed (counted in ``links``). At most
    :data:`MAX_RUN_FOLDERS` runs and :data:`MAX_RUNS_BYTES` of their JSON, or one DataError before
    anything is parsed."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return RunScan([], [], 0)
    scan = RunScan([], [], 0)
    budget = RunFiles(folder)
    for e in entries:
        if e.name.startswith("."):
            continue
        size = _run_entry(e, scan.links)
        if size is None:
            continue
        scan.runs.append(Path(e.path))
        if len(scan.runs) > MAX_RUN_FOLDERS:
            raise DataError(f"{one_line(str(folder))} holds more than {MAX_RUN_FOLDERS} run folders, more than a "
                            "dashboard reads; give a folder with fewer runs (e.g. move some into a subfolder)")
        budget.charge_bytes(size)
        scan.bytes += size
    return scan


def load_runs(folder: Path, scan: RunScan) -> Source:
    """A folder of single `gradleak attack` runs (runs/ by default) as a dashboard source: each run
    folder is one cell (its config.json the fields, its metrics.json the evidence; verdicts from
    gradleak.outcome as everywhere), read by :class:`RunFiles` (bounded, no link followed)."""
    from datetime import datetime, timezone

    files = RunFiles(folder)
    records: list[Cell] = []
    for run in scan.runs:
        metrics = files.read(run / "metrics.json", required=True)
        config = files.read(run / "config.json", required=False)
        if isinstance(config, dict) and isinstance(config.get("config"), dict):
            config = config["config"]
        if isinstance(config, dict):   # its run and attack parts, as flat fields
            try:
                config = flat_config(config, one_line(str(run / "config.json")))
            except ConfigError as exc:
                raise DataError(str(exc)) from None
        if not isinstance(metrics, dict):
            raise DataError(f"{run / 'metrics.json'} does not hold a JSON object")
        config = config if isinstance(config, dict) else {k: metrics.get(k) for k in ("attack", "model", "data")}
        config = {**config, **attacked_fields(metrics, config)}  # what the run attacked, not config's defaults
        finished = datetime.fromtimestamp(os.lstat(run / "metrics.json").st_mtime, timezone.utc)
        records.append(RunCell(cell_id=run.name, status="ok", grid={}, config=config, metrics=metrics, error=None,
                               wall_seconds=finite(metrics.get("wall_seconds")), worker=None,
                               finished_at=finished.strftime("%Y-%m-%dT%H:%M:%SZ")))
    src = Source(kind="runs", folder=folder, data=folder, records=records, sweeps=len(records),
                 links_skipped=list(scan.links))
    src.items = [cell_item(r, folder, runs="") for r in records]
    return src


def load_source(folder: Path, stores: StoreAccess) -> Source:
    """The folder as a dashboard reads it: a sweep (results.sqlite, read by ``stores``), an
    experiment (cells/), a Flower audit (audit.csv), a folder of single attack runs (run folders
    with metrics.json), a guard folder (guard.csv); else one DataError."""
    found = store_folder(folder, stores)
    if found is not None:
        _not_a_link(found[1] / stores.name)
        return load_store(found[0], folder, found[1], stores)
    if os.path.lexists(folder / "audit.csv"):
        _not_a_link(folder / "audit.csv")
        return load_audit(folder)
    if os.path.lexists(folder / "guard.csv"):   # gradleak.guard's decisions (report/dashboard/guard_page.py)
        from gradleak.report.dashboard.guard_page import load_guard

        _not_a_link(folder / "guard.csv")
        return load_guard(folder)
    scan = scan_runs(folder)
    if scan.runs:
        return load_runs(folder, scan)
    links = f" ({len(scan.links)} symbolic links not followed)" if scan.links else ""
    raise DataError(f"{folder} holds no sweep results ({stores.name}), no experiment ({EXPERIMENT_CELLS}/"
                    f"{stores.name}), no audit.csv, no guard.csv and no run folders{links}")


def _not_a_link(path: Path) -> None:
    """A folder's index (its store, audit.csv) is read only from the folder itself, never through a link."""
    if path.is_symlink():
        raise DataError(f"{one_line(str(path))} is a symbolic link, not a regular file of the folder; {NO_LINKS}")
