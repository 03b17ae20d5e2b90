"""The results store of a sweep: one SQLite file, DIR/results.sqlite, one row per finished cell.

Why SQLite (the standard library's sqlite3) rather than Parquet:

* appends are transactions: a cell's row is committed whole or not at all, so a crash, a
  SIGKILL or a power cut between two cells leaves a valid store with every finished cell
  (Parquet files are immutable; appending one row per cell means one file per cell or
  rewriting the table, with a torn file if killed mid-write);
* no extra dependency (pyarrow is ~100 MB), readable by anything (``sqlite3 results.sqlite``,
  pandas.read_sql, the dashboard) while a sweep is still writing to it;
* concurrency is simple: only the sweep's parent process writes (workers return results to
  it), readers never block it for long (busy timeout 30 s), and a lock file stops a second
  sweep from writing into the same folder at the same time.

The store keeps every cell ever finished in DIR (several specs may share a folder; they share
the cells they have in common); DIR/results.csv lists the cells of the spec run last, in grid
order, one row each.

The rollback journal (not WAL) with ``synchronous=FULL`` is used so the store stays one
self-contained file and works on network file systems.

Schema (version 1)::

    cells(cell_id TEXT PRIMARY KEY,   -- hash of the full resolved config (spec.cell_identity)
          status TEXT,                -- "ok" | "failed"
          grid TEXT,                  -- JSON {field: value} of the grid fields of the cell
          config TEXT,                -- JSON of the full resolved AttackConfig
          metrics TEXT,               -- JSON of the run's full metrics (NULL when failed)
          error TEXT,                 -- "ErrorType: message" when failed
          wall_seconds REAL, worker TEXT, finished_at TEXT)
    sweeps(started_at TEXT, spec TEXT, executor TEXT, workers INTEGER, cells INTEGER, pending INTEGER)
    meta(key TEXT PRIMARY KEY, value TEXT)      -- schema_version
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..errors import ConfigError, DataError

SCHEMA_VERSION = "1"
STORE_NAME = "results.sqlite"
CSV_NAME = "results.csv"
LOCK_NAME = ".sweep.lock"

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

# Scalar metrics shown first in results.csv (when present), then the others in first-seen order.
PREFERRED_METRICS = ("psnr_mean", "ssim_mean", "mse_mean", "label_accuracy", "fft2d_mean", "rpsnr_mean",
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


class ResultStore:
    """DIR/results.sqlite. Open with ``ResultStore(dir)``; ``close()`` (or use as a context manager)."""

    def __init__(self, folder: str | os.PathLike[str], *, create: bool = True):
        self.folder = Path(folder)
        self.path = self.folder / STORE_NAME
        if not create and not self.path.is_file():
            raise DataError(f"{self.folder} holds no sweep results ({STORE_NAME} is missing)")
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            self.conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            self.conn.execute("PRAGMA synchronous=FULL")
            if create:
                with self._tx():
                    for stmt in _SCHEMA.split(";"):
                        if stmt.strip():
                            self.conn.execute(stmt)
                    self.conn.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)",
                                      (SCHEMA_VERSION,))
            row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise DataError(f"{self.path} is not a readable sweep store: {exc}") from None
        if row is None or row[0] != SCHEMA_VERSION:
            raise DataError(f"{self.path} has schema version {row[0] if row else 'none'}; "
                            f"this gradleak reads version {SCHEMA_VERSION}")

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
        with self._tx():
            self.conn.execute("INSERT INTO sweeps VALUES (?, ?, ?, ?, ?, ?)",
                              (time.strftime("%Y-%m-%dT%H:%M:%S%z"), _json(spec), executor, workers, cells, pending))

    def add(self, cell_id: str, grid: dict[str, Any], config: dict[str, Any], result: dict[str, Any]) -> CellRecord:
        """Commit one finished cell (``result`` as returned by worker.run_cell). Replaces an
        earlier row of the same cell (a retried failure)."""
        rec = CellRecord(cell_id=cell_id, status=str(result.get("status", "failed")), grid=_clean(grid),
                         config=_clean(config), metrics=_clean(result.get("metrics")), error=result.get("error"),
                         wall_seconds=result.get("wall_seconds"), worker=result.get("worker"),
                         finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        with self._tx():
            self.conn.execute(
                "INSERT OR REPLACE INTO cells VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (rec.cell_id, rec.status, _json(rec.grid), _json(rec.config),
                 None if rec.metrics is None else _json(rec.metrics), rec.error, rec.wall_seconds, rec.worker,
                 rec.finished_at))
        return rec

    # ------------------------------------------------------------------ reading
    def finished(self, *, include_failed: bool = True) -> set[str]:
        q = "SELECT cell_id FROM cells" + ("" if include_failed else " WHERE status='ok'")
        return {r[0] for r in self.conn.execute(q)}

    def __len__(self) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0])

    def records(self) -> Iterator[CellRecord]:
        """Every stored cell, in the order they finished."""
        for row in self.conn.execute("SELECT cell_id, status, grid, config, metrics, error, wall_seconds, worker,"
                                     " finished_at FROM cells ORDER BY rowid"):
            yield CellRecord(cell_id=row[0], status=row[1], grid=json.loads(row[2]), config=json.loads(row[3]),
                             metrics=None if row[4] is None else json.loads(row[4]), error=row[5],
                             wall_seconds=row[6], worker=row[7], finished_at=row[8])

    # ------------------------------------------------------------------ results.csv
    def csv_text(self, cell_ids: list[str] | None = None) -> str:
        """One row per stored cell: cell_id, cell_status (ok | failed), the grid fields, the scalar
        metrics, cell_error (the failure's one-line message). With ``cell_ids`` (a sweep's cells),
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
            row.append(r.error or "")
            w.writerow(row)
        return buf.getvalue()

    def write_csv(self, cell_ids: list[str] | None = None) -> Path:
        """Rewrite DIR/results.csv atomically (temporary file + rename); see csv_text."""
        from ..fl.update import atomic_write_bytes

        path = self.folder / CSV_NAME
        atomic_write_bytes(path, self.csv_text(cell_ids).encode("utf-8"))
        readable_by_umask(path)
        return path


def readable_by_umask(path: Path) -> None:
    """Give a file written through mkstemp (mode 0600) the mode a plain open() would have."""
    mask = os.umask(0o022)
    os.umask(mask)
    try:
        os.chmod(path, 0o666 & ~mask)
    except OSError:
        pass


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
    sweeps never write the same folder at once."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / LOCK_NAME
        self.fh: Any = None

    def __enter__(self) -> "FolderLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.path, "a+")
        try:
            import fcntl

            fcntl.flock(self.fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # not POSIX: no lock, SQLite still keeps the store consistent
            pass
        except OSError:
            self.fh.close()
            raise ConfigError(f"another sweep is writing to {self.path.parent}; wait for it or choose another --out") from None
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fh is not None:
            self.fh.close()
