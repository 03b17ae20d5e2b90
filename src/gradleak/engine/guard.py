"""The divergence guard: a non-finite loss or candidate sends the loop back to its last good
snapshot with a smaller learning rate, a few times per phase, then stops the run as diverged."""

from __future__ import annotations

import logging
import math
from typing import Sequence

import torch

from .loop_state import LoopState
from .state import Snapshot

_log = logging.getLogger("gradleak")

SNAPSHOT_EVERY = 10    # in-memory "last good state" every N steps (and at every checkpoint)


def all_finite(variables: Sequence[torch.Tensor]) -> bool:
    with torch.no_grad():
        return bool(torch.stack([torch.isfinite(v).all() for v in variables]).all())


def recover(run: LoopState, good: Snapshot, t: int, value: float) -> Snapshot | None:
    """Step ``t`` left a non-finite loss (``value``) or variable: go back to ``good``. While
    retries remain, with the learning rate scaled by the session's backoff, and return the
    snapshot to go on from; else set ``diverged`` and return None."""
    session, phase, result = run.session, run.phase, run.result
    event = {"phase": phase, "iteration": t + 1, "loss": value if math.isfinite(value) else None,
             "restored_to": good.step}
    used, scale = run.retries_used, run.lr_scale
    run.restore(good, from_disk=False)
    if used < session.retries:
        run.retries_used, run.lr_scale = used + 1, scale * session.backoff
        event["lr_scale"] = run.lr_scale
        result.recoveries.append(event)
        session.recoveries.append(dict(event))
        _log.warning("gradleak: non-finite %s at iteration %d%s; restarting from iteration %d with "
                     "lr x%g (retry %d of %d)", "loss" if event["loss"] is None else "candidates",
                     t + 1, "" if phase == "main" else f" of {phase}", good.step, run.lr_scale,
                     run.retries_used, session.retries)
        return run.snapshot()  # same state, new lr scale and retry count
    run.retries_used, run.lr_scale = used, scale
    event.update(retries=used, message=(
        f"non-finite {'loss' if event['loss'] is None else 'candidates'} at iteration {t + 1}"
        f"{'' if phase == 'main' else ' of ' + phase} after {used} restart(s) with the learning rate "
        f"x{session.backoff:g} each; kept the last good state (iteration {good.step})"))
    result.diverged = event
    session.diverged = dict(event)
    return None


__all__ = ["SNAPSHOT_EVERY", "all_finite", "recover"]
