"""The run's session: checkpoint and divergence settings, the resume point, and SIGINT/SIGTERM.
It belongs to the run's engine and is passed to ``optimise()``, never found through a global."""

from __future__ import annotations

import contextlib
import signal
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

from ..errors import Terminated
from .checkpoints import save_state
from .state import Snapshot, StateFileError, StateHooks

DEFAULT_CHECKPOINT_EVERY = 100
DEFAULT_RETRIES = 3
BACKOFF = 0.5          # learning-rate factor per divergence recovery


class Interrupted(KeyboardInterrupt):
    """SIGINT/SIGTERM stopped the attack after a completed step; its state was saved (if the run
    has a state folder). A KeyboardInterrupt, not a GradleakError: nothing catches it as a failed
    input, and the CLI exits with 128 + the signal number (130 SIGINT, 143 SIGTERM)."""

    def __init__(self, signum: int, phase: str, step: int, directory: Path | None, resume: str | None):
        self.signum, self.phase, self.step, self.directory, self.resume = signum, phase, step, directory, resume
        name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else str(signum)
        msg = f"interrupted ({name}) after iteration {step}"
        if phase != "main":
            msg += f" of {phase}"
        if directory is not None:
            msg += f"; state saved in {directory}"
            if resume:
                msg += f"; continue with: gradleak attack --resume {resume}"
        super().__init__(msg)

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum)


@dataclass
class Session:
    """Checkpointing, resuming and divergence settings and records of one attack run.

    directory: where checkpoints go (None: memory only). every: checkpoint every N steps of each
    optimisation phase (0: only on SIGINT/SIGTERM). retries: divergence recoveries allowed per
    phase, each multiplying the learning rate by ``backoff``. pending: the loaded state to resume
    from (consumed by the phase it belongs to). config: written next to the state (config.json).
    resume_hint: what to print after ``--resume``. scope: the attack running when one run holds
    several (``auto``'s portfolio: "dlg/", "gradinversion/", ...), prefixed to the phases it
    saves; a saved state of another scope is left for its own attack (the attacks before it rerun
    from their start: deterministic on the same CPU and threads, so they end as they did).
    """

    directory: Path | None = None
    every: int = DEFAULT_CHECKPOINT_EVERY
    retries: int = DEFAULT_RETRIES
    backoff: float = BACKOFF
    pending: Snapshot | None = None
    config: dict[str, Any] | None = None
    resume_hint: str | None = None
    providers: dict[str, StateHooks] = field(default_factory=dict)
    interrupted: int | None = None
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    diverged: dict[str, Any] | None = None
    resumed_at: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: int = 0
    scope: str = ""
    stepping: bool = False

    def provide(self, name: str, hooks: StateHooks) -> None:
        self.providers[name] = hooks

    # -- resuming
    def _pending_here(self) -> bool:
        return self.pending is not None and self.pending.phase.startswith(self.scope)

    def pending_phase(self) -> str | None:
        return self.pending.phase[len(self.scope):] if self.pending is not None and self._pending_here() else None

    def take_pending(self, phase: str) -> Snapshot | None:
        if self.pending is None or not self._pending_here():
            return None
        if self.pending.phase != self.scope + phase:
            raise StateFileError(f"the saved state belongs to phase {self.pending.phase!r} but the attack "
                                 f"started {self.scope + phase!r} (saved by another gradleak version or config?)")
        snap, self.pending = self.pending, None
        return snap

    def record(self) -> dict[str, Any]:
        return {"recoveries": [dict(r) for r in self.recoveries], "resumed_at": [dict(r) for r in self.resumed_at]}

    def restore_record(self, state: Any) -> None:
        if not isinstance(state, dict) or not isinstance(state.get("recoveries"), list) \
                or not isinstance(state.get("resumed_at"), list):
            raise StateFileError("the saved state's session section is malformed")
        self.recoveries, self.resumed_at = list(state["recoveries"]), list(state["resumed_at"])

    def save(self, snap: Snapshot) -> None:
        if self.directory is not None:
            save_state(self.directory, replace(snap, phase=self.scope + snap.phase) if self.scope else snap, self.config)
            self.checkpoints += 1

    @contextlib.contextmanager
    def stepping_block(self) -> Iterator[None]:
        """The loop's steps: a signal meanwhile only sets ``interrupted``; the loop stops after
        the step it is in (saving its state) and checks once more when its last step is done."""
        self.stepping = True
        try:
            yield
        finally:
            self.stepping = False

    @contextlib.contextmanager
    def signals(self) -> Iterator["Session"]:
        """SIGINT/SIGTERM during the loop's steps set ``interrupted``; the loop then saves a
        checkpoint after the step it is in and raises :class:`Interrupted`. Anywhere else in the
        block (an attack's closed form, between phases, the metrics) there is no step to finish:
        :class:`~gradleak.errors.Terminated` is raised at once, so that no signal waits for the
        end of the run and is lost there. A second signal acts as it would without gradleak
        (SIGINT: KeyboardInterrupt; SIGTERM: the process ends). No-op outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        wanted = (signal.SIGINT, signal.SIGTERM)
        previous = {s: signal.getsignal(s) for s in wanted}

        def handler(signum: int, frame: Any) -> None:  # noqa: ARG001
            for s, h in previous.items():
                signal.signal(s, h if h is not None else signal.SIG_DFL)
            self.interrupted = signum
            if not self.stepping:
                raise Terminated(signum)

        for s in wanted:
            signal.signal(s, handler)
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h if h is not None else signal.SIG_DFL)

__all__ = ["BACKOFF", "DEFAULT_CHECKPOINT_EVERY", "DEFAULT_RETRIES", "Interrupted", "Session"]
