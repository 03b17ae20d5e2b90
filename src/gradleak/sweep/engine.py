"""Run a sweep: expand the spec, skip the cells already in the store, run the rest on an
executor, and commit each finished cell at once (store row, then results.csv rewritten)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection

from ..errors import ConfigError, Terminated, sigterm_as_interrupt  # noqa: F401 - where sweeps (and tests) find them
from ..paths import one_line
from .executors import EXECUTORS, available_cpus, run_cells
from .spec import Cell, SweepSpec
from .store import STORE_NAME, FolderLock, ResultStore, check_sweep_folder, remove_csv_temps


# A failed cell's error as the console shows it (--no-progress): one line of at most this many
# characters (the store keeps it whole).
ERROR_CHARS = 300


@dataclass
class SweepSummary:
    out: Path
    total: int                       # cells in the spec
    skipped: int                     # already in the store when the sweep started
    computed: list[str] = field(default_factory=list)   # cell ids finished by this run
    failed: list[str] = field(default_factory=list)     # of those, the failed ones
    lost: list[str] = field(default_factory=list)       # lost to the infrastructure (not recorded)
    wall_seconds: float = 0.0
    # Why the cells run did not compute LPIPS (their metrics' lpips_notice), said once per sweep
    # by the CLI rather than per cell; lpips_cells: how many cells recorded it.
    lpips_notice: str | None = None
    lpips_cells: int = 0

    @property
    def done(self) -> int:
        return self.skipped + len(self.computed)




def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA --:--"
    s = int(round(seconds))
    return f"ETA {s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"ETA {s // 60:02d}:{s % 60:02d}"


def _progress_columns() -> list[Any]:
    """The sweep's progress line: the bar takes the width the text leaves (a fixed 40-column bar
    pushed the note and the times past an 80-column terminal, where rich cut them with "...")."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    return [TextColumn("[bold]sweep[/]"), BarColumn(bar_width=None), MofNCompleteColumn(), TextColumn("cells"),
            TimeElapsedColumn(), TextColumn("{task.fields[eta]}"), TextColumn("{task.fields[note]}")]


def _checked_before_start(out: str | Path, executor: str, workers: int | None, address: str | None,
                          save_runs: bool) -> Path:
    """The options, ``out`` (check_sweep_folder) and, when resuming, every row of the existing
    store, checked before anything runs (ConfigError / DataError): the sweep folder."""
    if executor not in EXECUTORS:
        raise ConfigError(f"executor: unknown {executor!r}; known: {', '.join(EXECUTORS)}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"--workers must be an integer >= 1 (got {workers!r})")
    if address and executor != "ray":
        raise ConfigError("--address applies to --executor ray only")
    out = check_sweep_folder(out, save_runs=save_runs)
    store_path = out / STORE_NAME
    if store_path.exists() and store_path.stat().st_size > 0:  # resuming: a damaged store fails now, not mid-sweep
        with ResultStore(out, create=False) as existing:
            existing.validate()
    return out


def _commit(store: ResultStore, ids: list[str], summary: SweepSummary, cell: Cell, result: dict[str, Any]) -> None:
    """A finished cell: its store row, results.csv rewritten, and its count in ``summary``."""
    store.add(cell.cell_id, cell.grid, cell.config, result)
    store.write_csv(ids)
    summary.computed.append(cell.cell_id)
    notice = (result.get("metrics") or {}).get("lpips_notice")
    if isinstance(notice, str) and notice:
        summary.lpips_notice = summary.lpips_notice or notice
        summary.lpips_cells += 1
    if result.get("status") != "ok":
        summary.failed.append(cell.cell_id)


def _cell_line(summary: SweepSummary, cell: Cell, result: dict[str, Any], eta: float) -> str:
    """The console line of a finished cell (--no-progress): its grid values, PSNR or error, ETA."""
    psnr = (result.get("metrics") or {}).get("psnr_mean")
    shown = f"psnr {psnr:.2f} dB" if isinstance(psnr, (int, float)) \
        else one_line(str(result.get("error") or ""), ERROR_CHARS)
    return (f"[{summary.done}/{summary.total}] {cell.cell_id} "
            + " ".join(f"{k}={one_line(str(v), 80)}" for k, v in cell.grid.items())
            + f": {shown} {_eta(eta)}")


def run_sweep(spec: SweepSpec, out: str | Path, *, executor: str = "local", workers: int | None = None,
              address: str | None = None, retry_failed: bool = False, save_runs: bool | Collection[str] = False,
              redo: Collection[str] = (), progress: bool = True, console: Any = None) -> SweepSummary:
    """Run every cell of ``spec`` not yet finished in ``out``; return what happened.

    Finished cells (ok, and failed unless ``retry_failed``) are skipped, except those in
    ``redo`` (cell ids run again, e.g. a cell whose run folder is needed but missing).
    ``save_runs``: write the run folder DIR/runs/<cell> of every cell run (True) or of the
    cells whose ids it lists. Each cell that
    finishes is committed to DIR/results.sqlite at once and DIR/results.csv is rewritten
    atomically. KeyboardInterrupt (Ctrl-C, or SIGTERM) stops the workers and propagates; the
    store then holds every cell that finished.

    Everything that could stop the sweep after a cell has run is checked first, before any
    worker starts and before anything is written: the options, ``out``
    (:func:`~gradleak.sweep.store.check_sweep_folder`) and, when resuming, every row of the
    existing store (ConfigError / DataError naming what is wrong).
    """
    from rich.console import Console
    from rich.progress import Progress

    out = _checked_before_start(out, executor, workers, address, bool(save_runs))
    console = console or Console(stderr=True)
    t0 = time.perf_counter()
    with FolderLock(out), ResultStore(out) as store, sigterm_as_interrupt():
        remove_csv_temps(out)                   # what a killed sweep left (the lock is ours)
        ids = [c.cell_id for c in spec.cells]   # results.csv: this spec's cells, in grid order
        finished = store.finished(include_failed=not retry_failed) - set(redo)
        pending = [c for c in spec.cells if c.cell_id not in finished]
        summary = SweepSummary(out=out, total=len(spec.cells), skipped=len(spec.cells) - len(pending))
        n_workers = workers or (available_cpus() if executor == "local" else None)
        store.record_sweep(spec.to_dict(), executor, n_workers, len(spec.cells), len(pending))
        store.write_csv(ids)
        with_runs = save_runs if not isinstance(save_runs, bool) else (set(ids) if save_runs else set())
        run_dirs = {c.cell_id: str(out / "runs" / c.cell_id) for c in pending if c.cell_id in with_runs}
        columns = _progress_columns()
        with Progress(*columns, console=console, disable=not progress, transient=False) as bar:
            task = bar.add_task("sweep", total=summary.total, completed=summary.skipped, eta=_eta(None),
                                note=f"{summary.skipped} already done" if summary.skipped else "")
            started = time.perf_counter()
            if not progress and pending:
                console.print(f"sweep: {len(pending)} of {summary.total} cells to run on {executor}"
                              + (f" ({n_workers} workers)" if n_workers else ""), highlight=False)
            for cell, result in run_cells(pending, executor, workers=workers, address=address, run_dirs=run_dirs):
                if result is None:
                    summary.lost.append(cell.cell_id)
                    continue
                _commit(store, ids, summary, cell, result)
                n = len(summary.computed)
                left = len(pending) - n - len(summary.lost)
                eta = (time.perf_counter() - started) / n * left
                note = f"{len(summary.failed)} failed" if summary.failed else ""
                bar.update(task, advance=1, eta=_eta(eta), note=note)
                if not progress:
                    console.print(_cell_line(summary, cell, result, eta), highlight=False, markup=False)
    summary.wall_seconds = time.perf_counter() - t0
    return summary


__all__ = ["EXECUTORS", "SweepSummary", "Terminated", "run_sweep"]
