"""The results store of a sweep: one SQLite file, DIR/results.sqlite, one row per finished cell."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import re
import sqlite3
import stat
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..errors import ConfigError, DataError
from ..paths import MAX_JSON_DEPTH, check_tree, loads_json, one_line  # noqa: F401  (re-exported)

SCHEMA_VERSION = "1"
STORE_NAME = "results.sqlite"
CSV_NAME = "results.csv"
LOCK_NAME = ".sweep.lock"
# Files SQLite keeps next to the store while it writes (rollback journal; WAL files if a reader
# switched the mode): nothing else may ever be written under these names.
STORE_SIDE_FILES = (STORE_NAME + "-journal", STORE_NAME + "-wal", STORE_NAME + "-shm")
# The files of a sweep folder that hold or guard its results (a dashboard page never replaces one).
STORE_FILES = (STORE_NAME, *STORE_SIDE_FILES, CSV_NAME, LOCK_NAME)

# Bounds on what is read back from a store or a run folder (JSON written by gradleak is a few
# levels deep and a few KB per cell): deeper or larger values are corruption, not data.
MAX_COLUMN_CHARS = 8 * 1024 * 1024
_COLUMNS = {"cell_id": "TEXT", "status": "TEXT", "grid": "TEXT", "config": "TEXT", "metrics": "TEXT", "error": "TEXT",
            "wall_seconds": "REAL", "worker": "TEXT", "finished_at": "TEXT"}
_SWEEPS_COLUMNS = ("started_at", "spec", "executor", "workers", "cells", "pending")
STATUSES = ("ok", "failed")
_CELL_ID = re.compile(r"[0-9a-f]{16}")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cells(
    cell_id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    grid TEXT NOT NULL,
    config TEXT NOT NULL,
    metrics TEXT,
    error TEXT,
    wall_seconds REAL,
    worker TEXT,
    finished_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sweeps(
    started_at TEXT NOT NULL, spec TEXT NOT NULL, executor TEXT NOT NULL, workers INTEGER,
    cells INTEGER NOT NULL, pending INTEGER NOT NULL
);
"""

# A failed cell's error in results.csv: one line of at most this many characters (the store keeps
# it whole; results.csv is rewritten after every cell).
CSV_ERROR_CHARS = 1000
# Scalar metrics shown first in results.csv (when present), then the others in first-seen order.
PREFERRED_METRICS = ("verdict", "verdict_reason", "converged", "psnr_mean", "ssim_mean", "mse_mean", "label_accuracy", "fft2d_mean", "rpsnr_mean",
                     "lpips_mean", "iip", "gradient_distance", "iterations", "wall_seconds")
# Scalars of metrics.json that repeat the config or describe the machine: not CSV columns.
CSV_SKIPPED_METRICS = frozenset({"attack", "model", "data", "seed", "lpips_notice"})


@dataclass
class CellRecord:
    cell_id: str
    status: str
    grid: dict[str, Any]
    config: dict[str, Any]
    metrics: dict[str, Any] | None
    error: str | None
    wall_seconds: float | None
    worker: str | None
    finished_at: str


@contextlib.contextmanager
def _db_errors(path: Path, doing: str = "read") -> Iterator[None]:
    """SQLite errors (a corrupt page met while reading, a missing table, a disk that is full)
    become one DataError naming the store."""
    try:
        yield
    except sqlite3.Error as exc:
        raise DataError(f"sweep store {path} cannot be {doing}: {one_line(str(exc))} "
                        "(a damaged or foreign file; move it away to start a new store)") from None


def _json(value: Any) -> str:
    return json.dumps(_clean(value), sort_keys=True, allow_nan=False)


def _clean(value: Any) -> Any:
    """JSON-ready: NaN/Inf -> None, tuples -> lists, unknown objects -> str."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def _sqlite_uri(path: Path, mode: str) -> str:
    """A ``file:`` URI for sqlite3.connect(uri=True): ``mode=rw`` opens an existing database
    without ever creating one (``rwc`` creates it); any byte in the path is quoted."""
    return "file:" + urllib.parse.quote(os.fsencode(os.path.abspath(path))) + f"?mode={mode}"


def check_store_file(path: Path, *, writing: bool) -> None:
    """An existing results.sqlite must be a regular file (not a folder, FIFO or device: SQLite
    would block on a FIFO); a sweep that writes to it refuses a symbolic link too."""
    if writing and path.is_symlink():
        raise ConfigError(f"sweep store {path} is a symbolic link; a sweep writes only to a store in its own folder")
    from ..paths import check_input_file

    check_input_file(path, "sweep store")


class ResultStore:
    """DIR/results.sqlite. Open with ``ResultStore(dir)``; ``close()`` (or use as a context manager).

    ``create=False`` opens an existing store only (DataError if absent) and never creates one.
    An existing store must have this schema (DataError naming the store otherwise); nothing is
    written to it until a method that writes is called. :meth:`validate` reads every row.
    """

    def __init__(self, folder: str | os.PathLike[str], *, create: bool = True):
        self.folder = Path(folder)
        self.path = self.folder / STORE_NAME
        existed = os.path.lexists(self.path)
        if existed:
            check_store_file(self.path, writing=create)
        elif not create:
            raise DataError(f"{self.folder} holds no sweep results ({STORE_NAME} is missing)")
        new = not existed or self.path.stat().st_size == 0
        if create:
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"sweep folder {self.folder} cannot be created: {exc.strerror or exc}") from None
        try:
            self.conn = sqlite3.connect(_sqlite_uri(self.path, "rwc" if create else "rw"), uri=True, timeout=30.0,
                                        isolation_level=None)
        except sqlite3.Error as exc:
            raise DataError(f"sweep store {self.path} cannot be opened: {one_line(str(exc))}") from None
        try:
            with _db_errors(self.path, "opened"):
                self.conn.execute("PRAGMA synchronous=FULL")
                if new and create:
                    with self._tx():
                        for stmt in _SCHEMA.split(";"):
                            if stmt.strip():
                                self.conn.execute(stmt)
                        self.conn.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)",
                                          (SCHEMA_VERSION,))
                self._check_schema()
        except BaseException:
            self.conn.close()
            raise

    def _check_schema(self) -> None:
        def foreign(why: str) -> DataError:
            return DataError(f"sweep store {self.path} is not a gradleak sweep store: {why} "
                             "(move it away to start a new store)")

        tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        for table in ("meta", "cells", "sweeps"):
            if table not in tables:
                raise foreign(f"it has no table {table!r}")
        row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None or row[0] != SCHEMA_VERSION:
            shown = one_line(repr(row[0]), 40) if row else "none"
            raise DataError(f"sweep store {self.path} has schema version {shown}; "
                            f"this gradleak reads version {SCHEMA_VERSION}")
        for table, expected in (("cells", tuple(_COLUMNS)), ("sweeps", _SWEEPS_COLUMNS)):
            cols = tuple(r[1] for r in self.conn.execute(f"PRAGMA table_info({table})"))
            if cols != expected:
                raise foreign(f"table {table} has columns {', '.join(map(str, cols))[:200]}, "
                              f"not {', '.join(expected)}")

    # ------------------------------------------------------------------ plumbing
    def _tx(self) -> "_Transaction":
        return _Transaction(self.conn)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ writing
    def record_sweep(self, spec: dict[str, Any], executor: str, workers: int | None, cells: int, pending: int) -> None:
        with _db_errors(self.path, "written"), self._tx():
            self.conn.execute("INSERT INTO sweeps VALUES (?, ?, ?, ?, ?, ?)",
                              (time.strftime("%Y-%m-%dT%H:%M:%S%z"), _json(spec), executor, workers, cells, pending))

    def add(self, cell_id: str, grid: dict[str, Any], config: dict[str, Any], result: dict[str, Any]) -> CellRecord:
        """Commit one finished cell (``result`` as returned by worker.run_cell). Replaces an
        earlier row of the same cell (a retried failure)."""
        status = str(result.get("status", "failed"))
        rec = CellRecord(cell_id=cell_id, status=status if status in STATUSES else "failed", grid=_clean(grid),
                         config=_clean(config), metrics=_clean(result.get("metrics")), error=result.get("error"),
                         wall_seconds=result.get("wall_seconds"), worker=result.get("worker"),
                         finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        with _db_errors(self.path, "written"), self._tx():
            self.conn.execute(
                "INSERT OR REPLACE INTO cells VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (rec.cell_id, rec.status, _json(rec.grid), _json(rec.config),
                 None if rec.metrics is None else _json(rec.metrics), rec.error, rec.wall_seconds, rec.worker,
                 rec.finished_at))
        return rec

    # ------------------------------------------------------------------ reading
    def finished(self, *, include_failed: bool = True) -> set[str]:
        q = "SELECT cell_id FROM cells" + ("" if include_failed else " WHERE status='ok'")
        with _db_errors(self.path):
            return {r[0] for r in self.conn.execute(q) if isinstance(r[0], str)}

    def __len__(self) -> int:
        with _db_errors(self.path):
            return int(self.conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0])

    def sweep_count(self) -> int:
        """How many sweep runs wrote to this store."""
        with _db_errors(self.path):
            return int(self.conn.execute("SELECT COUNT(*) FROM sweeps").fetchone()[0])

    def get_meta(self, key: str) -> str | None:
        """A value of the meta table (e.g. ``experiment``: the experiment whose cells these are)."""
        with _db_errors(self.path):
            row = self.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row is not None and isinstance(row[0], str) else None

    def set_meta(self, key: str, value: str) -> None:
        if key == "schema_version":
            raise ValueError("the schema version is not set by hand")
        with _db_errors(self.path, "written"), self._tx():
            self.conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    def quick_check(self) -> None:
        """SQLite's structural check of the whole file (pages, b-trees, indexes): DataError if
        damaged, so that a write does not meet the damage after a cell has run."""
        with _db_errors(self.path):
            row = self.conn.execute("PRAGMA quick_check").fetchone()
        if row is None or row[0] != "ok":
            raise DataError(f"sweep store {self.path} is damaged: {one_line(str(row[0] if row else 'no answer'))} "
                            "(move it away to start a new store)")

    def validate(self) -> int:
        """Check the whole store before a sweep writes to it: :meth:`quick_check`, then every
        row (:meth:`records`). Returns the number of cells."""
        self.quick_check()
        return sum(1 for _ in self.records())

    def records(self) -> Iterator[CellRecord]:
        """Every stored cell, in the order they finished. A row that gradleak cannot have
        written (bad JSON, wrong types, an unknown status, a huge value) is a DataError naming
        the store and the row, never a half-read record."""
        with _db_errors(self.path):
            big = self.conn.execute(
                "SELECT rowid FROM cells WHERE length(cell_id) > 200 OR length(status) > 20 OR length(grid) > ?1 "
                "OR length(config) > ?1 OR length(metrics) > ?1 OR length(error) > ?1 OR length(worker) > ?1 "
                "OR length(finished_at) > 100 LIMIT 1", (MAX_COLUMN_CHARS,)).fetchone()
            if big is not None:
                raise DataError(f"sweep store {self.path}: row {big[0]} is corrupt: a column is larger than "
                                "gradleak writes (move the store away to start a new one)")
            cursor = self.conn.execute("SELECT rowid, cell_id, status, grid, config, metrics, error, wall_seconds, "
                                       "worker, finished_at FROM cells ORDER BY rowid")
            for row in cursor:
                yield self._record(row)

    def _record(self, row: tuple[Any, ...]) -> CellRecord:
        rowid, cell_id, status, grid, config, metrics, error, wall, worker, finished_at = row
        where = f"sweep store {self.path}: row {rowid}"

        def corrupt(why: str) -> DataError:
            return DataError(f"{where} is corrupt: {why} (move the store away to start a new one)")

        if not isinstance(cell_id, str) or not _CELL_ID.fullmatch(cell_id):
            raise corrupt(f"cell_id {one_line(repr(cell_id), 60)} is not a cell id (16 hex digits)")
        where += f" (cell {cell_id})"
        if status not in STATUSES:
            raise corrupt(f"status {one_line(repr(status), 40)} is not one of {', '.join(STATUSES)}")

        def obj(name: str, text: Any, optional: bool = False) -> Any:
            if text is None and optional:
                return None
            if not isinstance(text, str):
                raise corrupt(f"column {name} holds {type(text).__name__}, not JSON text")
            value = loads_json(text, f"{where}: column {name}")
            if not isinstance(value, dict):
                raise corrupt(f"column {name} holds a JSON {type(value).__name__}, not an object")
            return value

        grid_v, config_v, metrics_v = obj("grid", grid), obj("config", config), obj("metrics", metrics, True)
        for name, v in (("error", error), ("worker", worker)):
            if v is not None and not isinstance(v, str):
                raise corrupt(f"column {name} holds {type(v).__name__}, not text")
        if wall is not None and (isinstance(wall, bool) or not isinstance(wall, (int, float))
                                 or not math.isfinite(wall)):
            raise corrupt(f"wall_seconds {one_line(repr(wall), 40)} is not a number")
        if not isinstance(finished_at, str):
            raise corrupt(f"finished_at {one_line(repr(finished_at), 40)} is not a time stamp")
        return CellRecord(cell_id=cell_id, status=status, grid=grid_v, config=config_v, metrics=metrics_v,
                          error=error, wall_seconds=None if wall is None else float(wall), worker=worker,
                          finished_at=finished_at)

    # ------------------------------------------------------------------ results.csv
    def csv_text(self, cell_ids: list[str] | None = None) -> str:
        """One row per stored cell: cell_id, cell_status (ok | failed), the grid fields, the scalar
        metrics, cell_error (the failure's message as one line of at most :data:`CSV_ERROR_CHARS`
        characters; the store keeps it whole). With ``cell_ids`` (a sweep's cells),
        only those that finished, in that order; else every stored cell in the order they finished."""
        records = list(self.records())
        if cell_ids is not None:
            by_id = {r.cell_id: r for r in records}
            records = [by_id[c] for c in cell_ids if c in by_id]
        grid_cols: list[str] = []
        metric_cols: list[str] = []
        for r in records:
            for k in r.grid:
                if k not in grid_cols:
                    grid_cols.append(k)
        for r in records:
            for k, v in (r.metrics or {}).items():
                if k in grid_cols or k in CSV_SKIPPED_METRICS or k in metric_cols or k.startswith("cell_"):
                    continue
                if v is None or isinstance(v, (bool, int, float, str)) or k == "defenses":
                    metric_cols.append(k)
        metric_cols.sort(key=lambda k: (PREFERRED_METRICS.index(k) if k in PREFERRED_METRICS else len(PREFERRED_METRICS)))
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["cell_id", "cell_status", *grid_cols, *metric_cols, "cell_error"])
        for r in records:
            row = [r.cell_id, r.status]
            row += [_csv_value(r.config.get(k, r.grid.get(k))) for k in grid_cols]
            row += [_csv_value((r.metrics or {}).get(k)) for k in metric_cols]
            row.append(one_line(r.error, CSV_ERROR_CHARS) if r.error else "")
            w.writerow(row)
        return buf.getvalue()

    def write_csv(self, cell_ids: list[str] | None = None) -> Path:
        """Rewrite DIR/results.csv atomically (temporary file + rename); see csv_text."""
        from ..paths import atomic_write_bytes

        path = self.folder / CSV_NAME
        data = self.csv_text(cell_ids).encode("utf-8")
        try:
            atomic_write_bytes(path, data)
        except OSError as exc:
            raise DataError(f"{path} cannot be written: {exc.strerror or exc} "
                            f"(every finished cell is in {self.path})") from None
        return path


def read_cells(folder: Path) -> tuple[list[CellRecord], int, str | None]:
    """What a dashboard shows of DIR/results.sqlite (never creating one): every cell, the file
    checked whole first (:meth:`ResultStore.quick_check`, then every row, :meth:`ResultStore.records`),
    how many sweep runs wrote it, and the experiment whose cells these are (None for a sweep)."""
    with ResultStore(folder, create=False) as store:
        store.quick_check()
        return list(store.records()), store.sweep_count(), store.get_meta("experiment")


def remove_csv_temps(folder: Path) -> list[Path]:
    """Remove the temporary files of results.csv (``.results.csv.<random>.tmp``, from
    gradleak.paths.atomic_write_bytes) that a killed sweep left in ``folder``. Only for a caller
    that holds the folder's :class:`FolderLock`: no other sweep can be writing one then."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if entry.name.startswith(f".{CSV_NAME}.") and entry.name.endswith(".tmp") \
                and entry.is_file(follow_symlinks=False):
            try:
                os.unlink(entry.path)
            except OSError:
                continue
            removed.append(Path(entry.path))
    return removed


def _csv_value(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return ";".join(v)
    if isinstance(v, (list, dict)):
        return json.dumps(v, sort_keys=True)
    return str(v)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error) on an autocommit connection."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.conn.execute("ROLLBACK" if exc_type is not None else "COMMIT")


class FolderLock:
    """An exclusive lock on DIR/.sweep.lock (released by the OS if the process dies), so two
    sweeps never write the same folder at once. The lock file is opened without following a
    symbolic link and must be a regular file."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / LOCK_NAME
        self.fd: int | None = None

    def __enter__(self) -> "FolderLock":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
                         | getattr(os, "O_NONBLOCK", 0), 0o666)
        except OSError as exc:
            raise ConfigError(f"sweep lock {self.path} cannot be opened: {exc.strerror or exc} "
                              "(it must be a regular file in a folder this process can write)") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ConfigError(f"sweep lock {self.path} is not a regular file; move it away")
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # not POSIX: no lock, SQLite still keeps the store consistent
            pass
        except OSError:
            os.close(fd)
            raise ConfigError(f"another sweep is writing to {self.path.parent}; "
                              "wait for it or choose another --out") from None
        self.fd = fd
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# Everything a sweep (and the dashboard) may leave in its folder.
SWEEP_NAMES = frozenset({STORE_NAME, *STORE_SIDE_FILES, CSV_NAME, LOCK_NAME, "runs", "dashboard.html"})


def _is_sweep_name(name: str) -> bool:
    # atomic_write_bytes' temporary files (".results.csv.XXXX.tmp") of a killed sweep count too
    return name in SWEEP_NAMES or (name.startswith((f".{CSV_NAME}.", ".dashboard.html.")) and name.endswith(".tmp"))


def check_sweep_folder(out: str | os.PathLike[str], *, save_runs: bool = False, what: str = "--out") -> Path:
    """The results folder of a sweep, checked before any work: absent or empty (every rule of
    :func:`gradleak.paths.check_output_dir`: not a link, not ``.``, not below a regular file, in
    a folder that can be written, a UTF-8 name), or an earlier sweep's folder to resume (a real,
    writable folder holding results.sqlite, or only files a sweep writes). The files the sweep
    will write there (results.sqlite, results.csv, .sweep.lock, runs/ with ``save_runs``) must be
    what they claim to be. Raises ConfigError (InputFileError for the store)."""
    from ..paths import check_output_dir

    text = os.fspath(out)
    p = Path(text)
    if not os.path.lexists(p) or (p.is_dir() and not p.is_symlink() and not any(p.iterdir())):
        return check_output_dir(p, what)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{what} {os.fsencode(text)!r} is not valid UTF-8; use a UTF-8 path") from None
    if p.name in ("", ".", ".."):
        raise ConfigError(f"{what} {text!r} is a folder reference; name the sweep folder itself")
    if p.is_symlink():
        raise ConfigError(f"{what} {p} is a symbolic link; give the sweep folder itself")
    if not p.is_dir():
        kind = "a file" if p.is_file() else "not a folder"
        raise ConfigError(f"{what} {p} is {kind}; give a folder for the sweep's results")
    names = os.listdir(p)
    # Resumable: it holds a store, or only what a sweep killed before its store existed leaves
    # (the lock file comes first): never an arbitrary folder that happens to hold a runs/.
    if STORE_NAME not in names and not (LOCK_NAME in names and all(_is_sweep_name(n) for n in names)):
        raise ConfigError(f"{what} {p} holds other files and no sweep results ({STORE_NAME}); "
                          f"choose a new or empty folder, or an earlier sweep's {what} to resume it")
    if not os.access(p, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {p}: folder is not writable")
    if STORE_NAME in names:
        check_store_file(p / STORE_NAME, writing=True)
    for name in (CSV_NAME, LOCK_NAME, *STORE_SIDE_FILES):
        f = p / name
        if os.path.lexists(f) and (f.is_symlink() or not f.is_file()):
            raise ConfigError(f"{f} is not a regular file (a folder, link or device); "
                              "the sweep writes it: move it away")
    runs = p / "runs"
    if save_runs and os.path.lexists(runs) and (runs.is_symlink() or not runs.is_dir()):
        raise ConfigError(f"{runs} is not a folder; --save-runs writes the run folders there: move it away")
    return p
