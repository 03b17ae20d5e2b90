"""Helpers shared by experiment modules: run one attack config without writing a run folder,
and read the quality numbers and the time-to-threshold from its history."""

from __future__ import annotations

from typing import Any

from ..config import make_config
from ..runner import RunResult, run


def attack_once(**fields: Any) -> RunResult:
    """One attack through the same runner as the CLI (so numbers match `gradleak attack`)."""
    fields.setdefault("progress", False)
    return run(make_config(**fields), write=False)


def first_reaching(result: RunResult, psnr_threshold: float) -> tuple[int | None, float | None]:
    """(iteration, seconds) at which the observed PSNR first reached the threshold, else (None,
    None). Seconds are interpolated from the run's wall time (iterations cost about the same)."""
    total = max(1, result.reconstruction.iterations)
    for h in result.history:
        p = h.get("psnr")
        if p is not None and p >= psnr_threshold:
            it = int(h["iteration"])
            t = h.get("time")
            return it, float(t) if t is not None else result.reconstruction.wall_seconds * it / total
    return None, None


def psnr_curve(result: RunResult) -> tuple[list[float], list[float]]:
    """(seconds, psnr) points of the observed PSNR."""
    total = max(1, result.reconstruction.iterations)
    xs, ys = [], []
    for h in result.history:
        if h.get("psnr") is not None:
            t = h.get("time")
            xs.append(float(t) if t is not None else result.reconstruction.wall_seconds * int(h["iteration"]) / total)
            ys.append(float(h["psnr"]))
    return xs, ys
