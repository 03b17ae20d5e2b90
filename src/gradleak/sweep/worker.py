"""What runs one cell, in whichever process the executor chose (a pool worker, a Ray task, or
the sweep's own process). Module-level functions only, so they pickle by reference."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import time
import traceback
from pathlib import Path
from typing import Any


def init_worker() -> None:
    """Process-pool initializer: Ctrl-C is the parent's business (it stops the pool), and one
    torch thread per worker (the pool already runs one worker per core)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set (or parallel work already ran): harmless
        pass


def _clear(run_dir: Path) -> None:
    """Remove what an interrupted sweep left at DIR/runs/<cell>: a link or a file is removed
    itself (never followed), a folder with what it holds."""
    if run_dir.is_symlink() or (run_dir.exists() and not run_dir.is_dir()):
        run_dir.unlink()
    elif run_dir.exists():
        shutil.rmtree(run_dir)


def run_cell(config: dict[str, Any], run_dir: str | None = None) -> dict[str, Any]:
    """Run one attack as configured; never raises for a failed attack.

    Returns {"status": "ok", "metrics": {...}, "wall_seconds", "worker"} or
    {"status": "failed", "error": "Type: message", ...}. With ``run_dir`` the run folder is
    written there too (replacing a left-over one from an interrupted sweep).
    """
    import torch

    from ..config import config_from_record
    from ..pipeline import jsonable, run

    worker = f"{socket.gethostname()}:{os.getpid()}"
    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    try:
        cfg = config_from_record({**config, "progress": False})
        torch.set_num_threads(cfg.threads or 1)
        if run_dir is not None:
            _clear(Path(run_dir))
            cfg = cfg.model_copy(update={"out": run_dir})
        result = run(cfg, write=run_dir is not None)  # image or text: the one pipeline
        return {"status": "ok", "metrics": jsonable(result.metrics), "error": None,
                "wall_seconds": round(time.perf_counter() - t0, 3), "worker": worker}
    except Exception as exc:  # noqa: BLE001 - a failed cell is recorded, the sweep goes on
        from ..errors import GradleakError

        if isinstance(exc, GradleakError):
            error = f"{type(exc).__name__}: {exc}"
        else:  # a bug: say where
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            error = (f"{traceback.format_exception_only(type(exc), exc)[-1].strip()} "
                     f"(at {Path(frame.filename).name}:{frame.lineno} in {frame.name})")
        return {"status": "failed", "metrics": None, "error": error,
                "wall_seconds": round(time.perf_counter() - t0, 3), "worker": worker}
    finally:
        torch.set_num_threads(threads)
