"""Run folders written in a hidden staging folder and renamed into place when complete; the
staging folders a killed run left behind are removed once their process is gone."""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

from ..errors import ConfigError
from .atomic import umask_mode
from .bounded import one_line
from .checks import check_output_dir, name_max, short_name

HOST = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:40] or "host"
_PARTIAL = re.compile(r"^\..+\.partial-(?P<host>[A-Za-z0-9_-]+)-(?P<pid>\d+)-[A-Za-z0-9_]+$")


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host still runs (one owned by another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_partials(parent: Path) -> list[Path]:
    """Remove staging folders in ``parent`` left by processes of this host that no longer run
    (a run killed with SIGKILL never reaches its own clean-up). Returns what was removed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        m = _PARTIAL.match(entry.name)
        if m is None or m["host"] != HOST or process_alive(int(m["pid"])):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


class OutputAppearedError(ConfigError):
    """The output a run was about to create appeared meanwhile (another run, another program):
    nothing is replaced, and the run's complete result is kept in ``kept`` (which the message
    names); clean-up code never removes it."""

    def __init__(self, message: str, kept: Path):
        super().__init__(message)
        self.kept = kept


class StagedDir:
    """A run folder written in a hidden staging folder and renamed into place when complete.

    ``StagedDir(out)`` checks ``out`` (:func:`check_output_dir`), creates the missing parent
    folders and the staging folder at once, so that a path that cannot be written fails before
    any work; ``path`` is where to write; ``commit()`` renames it to ``out``; ``discard()`` (or
    leaving a ``with`` block by an exception) removes it and the parents it created.

    The staging folder is ``.<out name>.partial-<host>-<pid>-<random>``, the out name cut
    when the whole would be longer than the file system allows. When ``out`` appeared while
    the run was going, ``commit()`` moves the result to a kept folder ``<out name>.result-
    <random>`` beside it and raises :class:`OutputAppearedError` naming it; ``discard()``
    then leaves it alone.
    """

    def __init__(self, out: str | os.PathLike[str], what: str = "--out"):
        self.out = check_output_dir(out, what)
        self.kept: Path | None = None
        self._created: list[Path] = []
        parent = self.out.parent
        missing: list[Path] = []
        while not parent.exists():
            missing.append(parent)
            parent = parent.parent
        try:
            for folder in reversed(missing):
                folder.mkdir()
                self._created.append(folder)
            remove_stale_partials(self.out.parent)
            tail = f".partial-{HOST}-{os.getpid()}-"
            room = name_max(self.out.parent) - len(tail) - 1 - 8  # the leading ".", mkdtemp's 8 characters
            self.path = Path(tempfile.mkdtemp(dir=self.out.parent, prefix=f".{short_name(self.out.name, room)}{tail}"))
            umask_mode(self.path, folder=True)
        except OSError as exc:
            self._remove_created()
            raise ConfigError(f"{what} {one_line(str(self.out))}: cannot create it: {exc.strerror or exc}") from None
        self.committed = False

    def commit(self) -> Path:
        """Rename the staging folder to ``out`` (which must still be absent or an empty folder);
        OutputAppearedError (the result kept elsewhere) when something else is there now."""
        if os.path.lexists(self.out):
            if self.out.is_symlink() or not self.out.is_dir() or any(self.out.iterdir()):
                raise self._appeared()
            try:
                self.out.rmdir()
            except OSError:
                raise self._appeared() from None
        try:
            os.replace(self.path, self.out)
        except OSError as exc:
            # out appeared between the check and the rename: a folder with something in it, or a file
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise self._appeared() from None
            raise
        self.committed = True
        return self.out

    def _appeared(self) -> OutputAppearedError:
        """Keep the finished result under a name no clean-up removes; the error that says where."""
        kept = self.path
        room = name_max(self.out.parent) - len(".result-") - 8
        try:
            target = Path(tempfile.mkdtemp(dir=self.out.parent, prefix=f"{short_name(self.out.name, room)}.result-"))
            try:
                os.replace(self.path, target)  # onto the empty folder just made: atomic
                kept = target
            except OSError:
                target.rmdir()
        except OSError:
            pass  # keep the staging folder itself (this process still runs: nothing removes it now)
        self.kept = kept
        self.path = kept
        return OutputAppearedError(f"output {one_line(str(self.out))} appeared while the run was going (another "
                                   f"run?); it was left as it is, and this run's result is kept in "
                                   f"{one_line(str(kept))}", kept)

    def discard(self) -> None:
        if not self.committed and self.kept is None:
            shutil.rmtree(self.path, ignore_errors=True)
            self._remove_created()

    def _remove_created(self) -> None:
        for folder in reversed(self._created):
            try:
                folder.rmdir()
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                    raise
                break
        self._created = []

    def __enter__(self) -> "StagedDir":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:  # noqa: ANN001
        if exc_type is not None:
            self.discard()


__all__ = ["HOST", "OutputAppearedError", "StagedDir", "process_alive", "remove_stale_partials"]
