"""Files gradleak reads and writes: checked before any work, written atomically.

Inputs:  :func:`check_input_file` says what is wrong with a path given as a file to read (absent,
         a folder, a device or pipe, too large) before anything opens it.
Outputs: :func:`check_output_file` and :func:`check_output_dir` refuse, before a run starts,
         every output path that could only fail (or replace something) after the work is done:
         a folder where a file goes, a symbolic link, ``.``, a path below a regular file, a
         folder that cannot be written. :class:`StagedDir` creates a run folder's hidden
         staging folder up front (an unpredictable name made by ``mkdtemp``), and renames it into
         place when complete; :func:`atomic_write_bytes` does the same for one file. Staging
         folders left by a process that was killed (SIGKILL) are removed by the next
         :class:`StagedDir` in the same parent folder.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import stat
import tempfile
from pathlib import Path
from typing import Any

from .errors import ConfigError, DataError, GradleakError, InputFileError

# What a config, sweep spec or metrics file may reasonably weigh: they are read whole.
MAX_TEXT_FILE = 8 * 1024 * 1024


def check_input_file(path: str | os.PathLike[str], what: str, *, max_bytes: int | None = None) -> Path:
    """``path`` as a Path when it is a readable regular file (of at most ``max_bytes``), else
    InputFileError with one line saying what it is instead."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputFileError(f"{what} {p} does not exist") from None
    except OSError as exc:
        raise InputFileError(f"{what} {p} cannot be read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputFileError(f"{what} {p} is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(f"{what} {p} is not a regular file (a device, pipe or socket)")
    if max_bytes is not None and st.st_size > max_bytes:
        raise InputFileError(f"{what} {p} is {st.st_size} bytes; at most {max_bytes} are read")
    if not os.access(p, os.R_OK):
        raise InputFileError(f"{what} {p} is not readable")
    return p


def read_text_file(path: str | os.PathLike[str], what: str, *, max_bytes: int = MAX_TEXT_FILE) -> str:
    """The UTF-8 text of a small input file (config, spec, csv), or one clear InputFileError."""
    p = check_input_file(path, what, max_bytes=max_bytes)
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputFileError(f"{what} {p} is not UTF-8 text") from None
    except OSError as exc:
        raise InputFileError(f"{what} {p} cannot be read: {exc.strerror or exc}") from None


def _output_path(path: str | os.PathLike[str], what: str, kind: str) -> Path:
    """The checks every output path shares: UTF-8, a real name (not ``.``/``..``), not a link."""
    text = os.fspath(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{what} {text.encode('utf-8', 'surrogateescape')!r} is not valid UTF-8; "
                          "use a UTF-8 path") from None
    p = Path(text)
    if p.name in ("", ".", ".."):
        raise ConfigError(f"{what} {text!r} names an existing folder; give a new {kind} name")
    if p.is_symlink():
        raise ConfigError(f"{what} {p} is a symbolic link; give the real {kind} path")
    return p


def _writable_ancestor(path: Path, what: str) -> None:
    """The nearest existing ancestor of ``path`` must be a folder this process can write in
    (and every existing ancestor a folder): otherwise creating ``path`` could only fail."""
    parent = path.parent
    while True:
        if os.path.lexists(parent):
            if not parent.is_dir():
                raise ConfigError(f"{what} {path}: {parent} is a file, not a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise ConfigError(f"{what} {path}: folder {parent} is not writable")
            return
        if parent == parent.parent:
            raise ConfigError(f"{what} {path}: no existing folder above it")
        parent = parent.parent


def check_output_file(path: str | os.PathLike[str], what: str = "output") -> Path:
    """A file path gradleak may create or replace: absent or a regular file (not a folder, a
    link or a device), UTF-8, in a folder that can be written. Raises ConfigError."""
    p = _output_path(path, what, "file")
    if p.exists() and not p.is_file():
        kind = "a folder" if p.is_dir() else "not a regular file"
        raise ConfigError(f"{what} {p} is {kind}; give a file path")
    _writable_ancestor(p, what)
    return p


def check_output_dir(path: str | os.PathLike[str], what: str = "--out") -> Path:
    """A run folder gradleak may create: absent, or an empty real folder (not a link), with a
    name (not ``.`` or ``..``), UTF-8, below folders that exist or can be created and written."""
    p = _output_path(path, what, "folder")
    if p.exists():
        if not p.is_dir():
            raise ConfigError(f"{what} {p} exists and is not a folder; choose another {what}")
        if any(p.iterdir()):
            raise ConfigError(f"output {p} already exists and is not empty; choose another {what}")
    _writable_ancestor(p, what)
    return p


def check_distinct(*named: tuple[str, str | os.PathLike[str] | None]) -> None:
    """Refuse two outputs (or an output and an input) that are the same file."""
    seen: dict[str, str] = {}
    for what, path in named:
        if path is None:
            continue
        key = os.path.realpath(os.fspath(path))
        if key in seen:
            raise ConfigError(f"{what} and {seen[key]} are the same file ({path}); give two different paths")
        seen[key] = what


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, durable: bool = False) -> None:
    """Write a file so that a crash never leaves it half-written: a temporary file with an
    unpredictable name (``mkstemp``, O_EXCL) in the same folder, then ``os.replace``. The new
    file gets the mode a plain ``open()`` would give it. ``durable``: the data and the rename
    are flushed to disk (fsync of the file and of its folder) before returning."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        _umask_mode(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        with _quiet():
            os.unlink(tmp)
        raise
    if durable:
        with _quiet():  # make the rename itself durable (POSIX)
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)


def _umask_mode(path: Path, *, folder: bool = False) -> None:
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, (0o777 if folder else 0o666) & ~mask)


# ---------------------------------------------------------------- bounded parsing of files
MAX_JSON_DEPTH = 64


def one_line(text: str, limit: int = 300) -> str:
    """``text`` fit for a one-line error message: control characters escaped, at most ``limit``
    characters (hostile files put newlines and megabytes where a name is expected)."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
    return out if len(out) <= limit else out[: limit - 3] + "..."


def check_tree(value: Any, what: str, *, max_depth: int = MAX_JSON_DEPTH, max_items: int | None = None,
               error: type[GradleakError] = DataError) -> None:
    """Refuse a parsed JSON/YAML value nested deeper than ``max_depth`` or (with ``max_items``)
    holding more than ``max_items`` values once YAML aliases are expanded. Iterative: no
    recursion, stops as soon as a bound is passed (self-referencing values included)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    items = 0
    while stack:
        v, depth = stack.pop()
        items += 1
        if max_items is not None and items > max_items:
            raise error(f"{what} holds more than {max_items} values (YAML aliases included); refusing to expand it")
        if isinstance(v, (dict, list, tuple, set, frozenset)):
            if depth >= max_depth:
                raise error(f"{what} is nested more than {max_depth} levels deep")
            children = v.values() if isinstance(v, dict) else v
            stack.extend((c, depth + 1) for c in children)


def loads_json(text: str, what: str, *, error: type[GradleakError] = DataError) -> Any:
    """``json.loads`` of text read from a file or a store column, with every failure (syntax,
    nesting deep enough to exhaust the recursion limit, an integer of too many digits) one
    ``error`` naming ``what``; the value is also bounded by :func:`check_tree`."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise error(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep") from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError, int digit limit
        raise error(f"{what} is not valid JSON: {one_line(str(exc))}") from None
    check_tree(value, what, error=error)
    return value


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:  # noqa: ANN001
        return exc_type is not None and issubclass(exc_type, OSError)


_HOST = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:40] or "host"
_PARTIAL = re.compile(r"^\..+\.partial-(?P<host>[A-Za-z0-9_-]+)-(?P<pid>\d+)-[A-Za-z0-9_]+$")


def _alive(pid: int) -> bool:
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
        if m is None or m["host"] != _HOST or _alive(int(m["pid"])):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


class StagedDir:
    """A run folder written in a hidden staging folder and renamed into place when complete.

    ``StagedDir(out)`` checks ``out`` (:func:`check_output_dir`), creates the missing parent
    folders and the staging folder at once, so that a path that cannot be written fails before
    any work; ``path`` is where to write; ``commit()`` renames it to ``out``; ``discard()`` (or
    leaving a ``with`` block by an exception) removes it and the parents it created.
    """

    def __init__(self, out: str | os.PathLike[str], what: str = "--out"):
        self.out = check_output_dir(out, what)
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
            self.path = Path(tempfile.mkdtemp(dir=self.out.parent,
                                              prefix=f".{self.out.name}.partial-{_HOST}-{os.getpid()}-"))
            _umask_mode(self.path, folder=True)
        except OSError as exc:
            self._remove_created()
            raise ConfigError(f"{what} {self.out}: cannot create it: {exc.strerror or exc}") from None
        self.committed = False

    def commit(self) -> Path:
        """Rename the staging folder to ``out`` (which must still be absent or an empty folder)."""
        if os.path.lexists(self.out):
            if self.out.is_symlink() or not self.out.is_dir() or any(self.out.iterdir()):
                raise ConfigError(f"output {self.out} appeared while the run was going; the result is in {self.path}")
            self.out.rmdir()
        os.replace(self.path, self.out)
        self.committed = True
        return self.out

    def discard(self) -> None:
        if not self.committed:
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


__all__ = ["InputFileError", "check_input_file", "read_text_file", "check_output_file", "check_output_dir",
           "check_distinct", "atomic_write_bytes", "StagedDir", "remove_stale_partials",
           "MAX_TEXT_FILE", "MAX_JSON_DEPTH", "one_line", "check_tree", "loads_json"]
