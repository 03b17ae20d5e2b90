"""Files written atomically: a temporary file beside each, then renamed (or linked) into place,
so that a failure or a signal never leaves half a file nor half of a pair."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Mapping

from ..errors import ConfigError
from .bounded import one_line
from .checks import name_max, short_name
from .signals import deferred_signals

def _temp_prefix(path: Path) -> str:
    """``.NAME.`` for the temporary file of ``path`` (``mkstemp`` adds 8 characters and
    ``.tmp``), NAME cut so that the whole fits the file system's name limit."""
    return f".{short_name(path.name, name_max(path.parent) - 14)}."


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, durable: bool = False) -> None:
    """Write a file so that a crash never leaves it half-written: a temporary file with an
    unpredictable name (``mkstemp``, O_EXCL) in the same folder, then ``os.replace``. The new
    file gets the mode a plain ``open()`` would give it. ``durable``: the data and the rename
    are flushed to disk (fsync of the file and of its folder) before returning."""
    path = Path(path)
    temps: list[str] = []
    try:
        os.replace(_temp_copy(path, data, durable, temps), path)
    except BaseException:
        for tmp in temps:
            with _quiet():
                os.unlink(tmp)
        raise
    if durable:
        _fsync_folder(path.parent)


def _temp_copy(path: Path, data: bytes, durable: bool, temps: list[str]) -> str:
    """``data`` written to a new temporary file beside ``path`` (``mkstemp``: O_EXCL, an
    unpredictable name), with the mode a plain ``open()`` would give it; its name is appended to
    ``temps`` as soon as it exists (the caller removes it on failure). Returns that name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_temp_prefix(path), suffix=".tmp")
    temps.append(tmp)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    umask_mode(Path(tmp))
    return tmp


def _fsync_folder(folder: Path) -> None:
    with _quiet():  # make a rename durable (POSIX)
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def atomic_write_files(files: Mapping[str | os.PathLike[str], bytes], *, force: bool = True,
                       what: Mapping[str | os.PathLike[str], str] | None = None, durable: bool = False) -> None:
    """Write several files all or none: each into a temporary file beside it, then all renamed
    into place, with SIGINT/SIGTERM/SIGHUP held meanwhile (:func:`deferred_signals`),
    so that no file is ever half-written and a pair written together (an update and its truth)
    is never half replaced.

    ``force`` False: a file that exists (or appears meanwhile) is never replaced: the new files
    are linked into place without replacing anything (``link`` fails on an existing name), and
    those already linked are removed again; ConfigError "``what`` PATH exists; pass --force to
    replace it". ``what``: each path's name in messages (default "output")."""
    paths = [Path(p) for p in files]
    names = {Path(k): v for k, v in (what or {}).items()}
    for p in paths:
        if os.path.isdir(p) and not os.path.islink(p):
            raise ConfigError(f"{names.get(p, 'output')} {one_line(str(p))} is a folder; give a file path")
        if not force and os.path.lexists(p):
            raise ConfigError(f"{names.get(p, 'output')} {one_line(str(p))} exists; pass --force to replace it")
    temps: list[str] = []
    placed: list[Path] = []
    # Signals are held from the first temporary file on: a SIGTERM (whose default action ends
    # the process at once) then neither cuts the pair in half nor leaves temporary files.
    with deferred_signals():
        try:
            for p, data in zip(paths, files.values(), strict=True):
                _temp_copy(p, data, durable, temps)
            for p, tmp in zip(paths, temps, strict=True):
                if force:
                    os.replace(tmp, p)
                    continue
                try:
                    _link_new(tmp, p)
                except FileExistsError:
                    raise ConfigError(f"{names.get(p, 'output')} {one_line(str(p))} exists; "
                                      "pass --force to replace it") from None
                placed.append(p)
            placed = []
        finally:
            for p in placed:  # force False and a later file failed: nothing of this call stays
                with _quiet():
                    os.unlink(p)
            for tmp in temps:
                with _quiet():
                    os.unlink(tmp)
    if durable:
        for folder in dict.fromkeys(p.parent for p in paths):
            _fsync_folder(folder)


def _link_new(tmp: str, path: Path) -> None:
    """Put ``tmp`` at ``path`` unless ``path`` exists (FileExistsError): a hard link, which
    never replaces a name; where the file system has no hard links, a rename after a check."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.EXDEV):
            raise
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "File exists", str(path)) from None
        os.replace(tmp, path)


def umask_mode(path: Path, *, folder: bool = False) -> None:
    """Give ``path`` the mode a plain ``open()`` (``mkdir()`` for a folder) would have given it under the umask."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, (0o777 if folder else 0o666) & ~mask)


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:  # noqa: ANN001
        return exc_type is not None and issubclass(exc_type, OSError)


__all__ = ["atomic_write_bytes", "atomic_write_files", "umask_mode"]
