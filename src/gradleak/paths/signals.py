"""SIGINT, SIGTERM and SIGHUP held while a few renames run, then delivered: a step that must
not be cut in the middle (a pair of files put in place together)."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

_DEFERRED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP while the block runs, then deliver them (to the handlers
    that were in place): a step of a few renames is never cut in the middle. Only the main
    thread can set handlers; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous: dict[int, Any] = {}

    def hold(signum: int, frame: Any) -> None:  # noqa: ARG001
        caught.append(signum)

    try:
        for sig in _DEFERRED_SIGNALS:
            old = signal.getsignal(sig)
            if old is None:  # a handler set outside Python: it cannot be put back
                continue
            previous[sig] = old
            signal.signal(sig, hold)
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        for sig in dict.fromkeys(caught):
            signal.raise_signal(sig)


__all__ = ["deferred_signals"]
