"""Executors: run cells somewhere and hand back (cell, result) as each finishes."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import ConfigError, GradleakError
from ..paths import one_line
from .spec import Cell
from .worker import init_worker, run_cell

EXECUTORS = ("local", "ray", "inline")
# Connecting to a user's Ray cluster (--address): no usage stats from this driver, GPU env left alone.
_REMOTE_ENV = ("RAY_USAGE_STATS_ENABLED", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO")
Result = dict[str, Any]
# An executor yields (cell, None) for a cell lost to the infrastructure (a Ray worker or node
# died): it is not recorded, so the next run of the sweep computes it again.


def available_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def run_cells(cells: Iterable[Cell], executor: str, *, workers: int | None = None, address: str | None = None,
              run_dirs: dict[str, str] | None = None) -> Iterator[tuple[Cell, Result | None]]:
    if executor == "local":
        return _local(cells, workers or available_cpus(), run_dirs or {})
    if executor == "ray":
        return _ray(cells, workers, address, run_dirs or {})
    if executor == "inline":
        return _inline(cells, run_dirs or {})
    raise ConfigError(f"executor: unknown {executor!r}; known: {', '.join(EXECUTORS)}")


def _inline(cells: Iterable[Cell], run_dirs: dict[str, str]) -> Iterator[tuple[Cell, Result | None]]:
    for cell in cells:
        yield cell, run_cell(cell.config, run_dirs.get(cell.cell_id))


def _local(cells: Iterable[Cell], workers: int, run_dirs: dict[str, str]) -> Iterator[tuple[Cell, Result | None]]:
    from ..localray import safe_path_children

    # set for the pool's life: it starts its processes as cells are submitted
    with safe_path_children():
        yield from _pool(cells, workers, run_dirs)


def _pool(cells: Iterable[Cell], workers: int, run_dirs: dict[str, str]) -> Iterator[tuple[Cell, Result | None]]:
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), initializer=init_worker)
    todo = iter(cells)
    in_flight: dict[Future[Result], Cell] = {}

    def fill() -> None:
        while len(in_flight) < 2 * workers:
            cell = next(todo, None)
            if cell is None:
                return
            in_flight[pool.submit(run_cell, cell.config, run_dirs.get(cell.cell_id))] = cell

    clean = False
    try:
        fill()
        while in_flight:
            done, _ = wait(list(in_flight), return_when=FIRST_COMPLETED)
            for fut in done:
                cell = in_flight.pop(fut)
                try:
                    result = fut.result()
                except BrokenProcessPool:
                    raise GradleakError(f"a worker process died while running cell {cell.cell_id} (out of memory?); "
                                        "finished cells are saved, rerun the same command to continue") from None
                yield cell, result
            fill()
        clean = True
    finally:
        if clean:
            pool.shutdown(wait=True)
        else:  # interrupted: drop queued cells and stop the running ones now
            processes = list(getattr(pool, "_processes", {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for p in processes:
                if p.is_alive():
                    p.terminate()
            for p in processes:
                p.join(timeout=5)


def _ray(cells: Iterable[Cell], workers: int | None, address: str | None,
         run_dirs: dict[str, str]) -> Iterator[tuple[Cell, Result | None]]:
    from contextlib import ExitStack

    from ..localray import ENVIRONMENT, environment, init_ray, local_ray

    with ExitStack() as stack:
        running = sys.modules.get("ray")   # not imported yet: certainly not initialised
        if running is not None and running.is_initialized():
            pass                           # the caller's Ray, used as is and left running
        elif address:                      # the user's cluster: its network is the user's choice
            stack.enter_context(environment({k: ENVIRONMENT[k] for k in _REMOTE_ENV}))
            try:
                import ray
            except ImportError:
                raise ConfigError("--executor ray needs Ray: pip install 'gradleak[fl]'") from None
            _check_reachable(address)
            try:
                init_ray(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise ConfigError(f"--address {one_line(address, 200)}: cannot connect to a Ray cluster: "
                                  f"{one_line(str(exc))}") from None
            stack.callback(ray.shutdown)
        else:                              # a local Ray on loopback only, probing nothing
            stack.enter_context(local_ray(workers or available_cpus(), keep_signals=True))
        yield from _ray_tasks(cells, workers, run_dirs)


def _ray_tasks(cells: Iterable[Cell], workers: int | None,
               run_dirs: dict[str, str]) -> Iterator[tuple[Cell, Result | None]]:
    import ray

    slots = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
    task = ray.remote(num_cpus=1, max_retries=0)(run_cell)
    todo = iter(cells)
    in_flight: dict[Any, Cell] = {}

    def fill() -> None:
        while len(in_flight) < 2 * slots:
            cell = next(todo, None)
            if cell is None:
                return
            in_flight[task.remote(cell.config, run_dirs.get(cell.cell_id))] = cell

    try:
        fill()
        while in_flight:
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            for ref in ready:
                cell = in_flight.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayError:  # worker died, node lost: not recorded, rerun redoes it
                    result = None
                yield cell, result
            fill()
    finally:
        for ref in in_flight:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """Fail fast on a Ray address nobody listens on (ray.init itself retries for minutes)."""
    import socket

    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--address {one_line(repr(address), 200)}: expected HOST:PORT (or ray://HOST:PORT, or auto)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConfigError(f"--address {one_line(address, 200)}: no Ray cluster answers there "
                          f"({one_line(str(exc.strerror or exc))})") from None
