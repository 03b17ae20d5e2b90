"""One exception family. The CLI turns every :class:`GradleakError` into one line and exit 2."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator


class GradleakError(Exception):
    """Base class of every error gradleak raises on purpose (bad input, impossible request)."""


class UnknownNameError(GradleakError, KeyError):
    """An unknown model, data source, attack, defense, preset or experiment name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DataError(GradleakError):
    """A data source that is missing, empty, unreadable, or too small for the batch asked."""


class UpdateFileError(GradleakError):
    """A shared-update or truth file that is not valid safetensors, truncated, or inconsistent."""


class ModelMismatchError(GradleakError):
    """Tensors that do not fit the model (names, shapes, dtypes) or a model that cannot be built."""


class NonFiniteError(GradleakError):
    """NaN or Inf where finite numbers are required (an update, a checkpoint, an image)."""


class ConfigError(GradleakError):
    """A configuration value that is invalid or out of range; the message names the field."""


class InputFileError(GradleakError):
    """A path given as a file to read that is absent, a folder, a device, too large or unreadable."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (or SIGHUP) during a command, raised where the program was (a KeyboardInterrupt, so
    that it unwinds the way Ctrl-C does: staging folders and temporary files are removed on the
    way out); the CLI prints ``interrupted (SIGTERM)`` and exits with 128 + the signal number."""

    def __init__(self, signum: int = 15) -> None:
        super().__init__()
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:   # what gradleak.cli.main prints after "gradleak: "
        import signal

        try:
            name = signal.Signals(self.signum).name
        except ValueError:
            name = f"signal {self.signum}"
        return f"interrupted ({name})"


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the sweep like Ctrl-C does (finished cells kept, running ones stopped),
    raising :class:`Terminated`, for the commands that run long (a sweep, the Flower audit, the
    dashboard). (Ray's ray.init installs its own SIGTERM handlers: the Ray
    executor puts this one back, see gradleak.localray.init_ray.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    received: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        received.append(signum)
        raise Terminated(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except KeyboardInterrupt as exc:
        # Ray's blocking calls (ray.wait, ray.get) check for signals themselves and turn the
        # handler's exception into a plain KeyboardInterrupt: say it was SIGTERM all the same.
        if received and not isinstance(exc, Terminated):
            raise Terminated(received[-1]) from None
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
