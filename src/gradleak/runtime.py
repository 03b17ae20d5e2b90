"""Process and device settings of an attack: the device, glibc's allocator on CPU, and the
threads on a busy machine, the one thread policy of the CLI and the Python API (float32
precision on CUDA is the engine's: engine/precision.py)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import platform
import time
from collections.abc import Iterator

import torch

from .errors import ConfigError

M_TRIM_THRESHOLD = -1     # glibc malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit glibc
TRIM_THRESHOLD = 1 << 30
ENV = "GRADLEAK_ALLOCATOR"

_state: dict[str, str] = {}


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else platform.processor()): the float rounding
    of torch's CPU kernels depends on it, so a run records it beside the versions."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def allocator() -> str:
    """What the process runs with: "glibc tuned", "system" (left alone), or "untouched" (no attack yet)."""
    return _state.get("allocator", "untouched")


def tune_allocator() -> str:
    """Set glibc's mmap and trim thresholds once per process (see the module's notes in docs/).

    Returns the resulting state ("glibc tuned" or "system"). Never raises: a platform without
    glibc, an allocator preloaded in place of glibc's (jemalloc, tcmalloc, mimalloc in
    LD_PRELOAD), or ``GRADLEAK_ALLOCATOR=system`` keeps the allocator as it is."""
    if "allocator" in _state:
        return _state["allocator"]
    result = "system"
    preloaded = any(name in os.environ.get("LD_PRELOAD", "") for name in ("jemalloc", "tcmalloc", "mimalloc"))
    if os.environ.get(ENV, "").strip().lower() != "system" and platform.libc_ver()[0] == "glibc" and not preloaded:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1:
                result = "glibc tuned"
        except (OSError, AttributeError):
            pass
    _state["allocator"] = result
    return result


def resolve_device(name: str | torch.device) -> torch.device:
    """"cpu" | "cuda" | "cuda:N" | "auto" (CUDA when there is one) -> torch.device; ConfigError
    for an unknown name, CUDA without a GPU, or a GPU index that is not there."""
    if isinstance(name, torch.device):
        name = str(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device: unknown {name!r} (cpu, cuda, cuda:N or auto)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device: CUDA was asked for but no GPU is available (use --device cpu)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"device: {name} does not exist; this machine has {torch.cuda.device_count()} GPU(s) "
                              f"(cuda:0 .. cuda:{torch.cuda.device_count() - 1})")
    elif dev.type != "cpu":
        raise ConfigError(f"device: {name!r} is not supported (cpu, cuda, cuda:N or auto)")
    return dev


# ---------------------------------------------------------------- threads on a busy machine
# Why: torch starts one intra-op thread per core, and its OpenMP threads wait for each other at
# every parallel region. When other processes already keep cores busy, the thread that shares a
# core stalls the others at each barrier: `gradleak attack --iterations 20` (DLG) took 236 s once
# on this 2-core machine under load, 1.2-1.6 s normally; controlled, with two busy processes on
# the 2 cores: 9.2 s with torch's 2 threads, 2.5 s with one (and, measured again with two
# single-thread experiments running: attack loop 3.98 s with 2 threads, 1.93 s with 1, same
# numbers). Every entry point (the CLI's attack, --resume and train; the Python API's
# pipeline.run and attack_update) therefore asks how busy the cores are before a run that was
# given no threads (``threads_for_run``), and starts only as many threads as there are idle
# cores (at least one).
BUSY_SAMPLE_SECONDS = 0.25
BUSY_REUSE_SECONDS = 2.0  # a measurement this recent is reused (the CLI measures, then calls the API)


def _cpu_jiffies() -> tuple[int, int] | None:
    """(idle, total) jiffies of all CPUs from /proc/stat, or None where there is none."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return idle, sum(values[:8])  # user..steal (guest time is already inside user)


def busy_cores(seconds: float = BUSY_SAMPLE_SECONDS) -> float | None:
    """How many cores other processes keep busy, measured over ``seconds`` while this process
    sleeps (so it does not count itself); None where /proc/stat cannot be read."""
    before = _cpu_jiffies()
    if before is None:
        return None
    time.sleep(seconds)
    after = _cpu_jiffies()
    if after is None or after[1] <= before[1]:
        return None
    busy = 1.0 - (after[0] - before[0]) / (after[1] - before[1])
    return max(0.0, busy) * (os.cpu_count() or 1)


def threads_for(busy: float | None, cpus: int, default: int) -> int:
    """torch threads for a run given ``busy`` cores of ``cpus``: the idle ones, rounded, at least
    one and at most torch's ``default``; ``default`` itself when the load is unknown."""
    if busy is None:
        return default
    return max(1, min(default, round(cpus - busy)))


def threads_on_busy_machine() -> tuple[int, str] | None:
    """(threads, reason) when other processes keep cores busy and fewer threads than torch's
    default would run faster; None on an idle machine (torch's choice stands)."""
    default = torch.get_num_threads()
    if default <= 1:
        return None  # nothing to take away: no need to measure
    cpus = os.cpu_count() or 1
    busy = recent_busy_cores()
    threads = threads_for(busy, cpus, default)
    if threads >= default or busy is None:
        return None
    return threads, (f"{busy:.1f} of {cpus} cores busy with other work: {threads} torch thread"
                     f"{'s' if threads != 1 else ''} instead of {default} (--threads N to choose)")


def recent_busy_cores() -> float | None:
    """``busy_cores()``, or the measurement of the last ``BUSY_REUSE_SECONDS`` in this process
    (the CLI decides before it calls the pipeline, which decides again for API callers)."""
    last = _busy.get("last")
    now = time.monotonic()
    if last is not None and now - last[0] < BUSY_REUSE_SECONDS:
        return last[1]
    busy = busy_cores()
    _busy["last"] = (time.monotonic(), busy)
    return busy


_busy: dict[str, tuple[float, float | None]] = {}


def threads_for_run(threads: int | None, device: str, nproc: int = 1) -> tuple[int | None, str | None]:
    """The thread policy of every run, CLI or API: (threads, note). ``threads`` as given; else, on
    the CPU in one process, fewer torch threads than cores when other work keeps cores busy
    (``threads_on_busy_machine``), with a note saying so. (None, None): torch's own choice.
    Several processes (``nproc`` > 1) share the cores out themselves (pipeline/distributed.py)."""
    if threads is not None or nproc > 1 or device not in ("cpu", "auto"):
        return threads, None
    if resolve_device(device).type != "cpu":
        return None, None
    busy = threads_on_busy_machine()
    return (None, None) if busy is None else busy


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch on ``threads`` intra-op threads inside the block, the caller's count restored after
    (an API call must not leave the process on the fewer threads a busy moment chose); None:
    nothing changed."""
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


__all__ = ["BUSY_REUSE_SECONDS", "BUSY_SAMPLE_SECONDS", "ENV", "allocator", "busy_cores", "recent_busy_cores",
           "resolve_device", "threads_for", "threads_for_run", "threads_on_busy_machine", "torch_threads",
           "tune_allocator"]
