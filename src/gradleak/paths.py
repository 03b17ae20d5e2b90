"""Files gradleak reads and writes: every input and output path checked before any work, outputs
written atomically (staged and renamed), so a failure never leaves half a file."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import socket
import stat
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from .errors import ConfigError, DataError, GradleakError, InputFileError

# What a config, sweep spec or metrics file may reasonably weigh: they are read whole.
MAX_TEXT_FILE = 8 * 1024 * 1024


def check_input_file(path: str | os.PathLike[str], what: str, *, max_bytes: int | None = None) -> Path:
    """``path`` as a Path when it is a readable regular file (of at most ``max_bytes``), else
    InputFileError with one line saying what it is instead."""
    p = Path(path)
    shown = one_line(os.fspath(p))
    if "\0" in os.fspath(p):
        raise InputFileError(f"{what} {shown} holds a NUL byte; no file has such a name")
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputFileError(f"{what} {shown} does not exist") from None
    except OSError as exc:
        raise InputFileError(f"{what} {shown} cannot be read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputFileError(f"{what} {shown} is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(f"{what} {shown} is not a regular file (a device, pipe or socket)")
    if max_bytes is not None and st.st_size > max_bytes:
        raise InputFileError(f"{what} {shown} is {st.st_size} bytes; at most {max_bytes} are read")
    if not os.access(p, os.R_OK):
        raise InputFileError(f"{what} {shown} is not readable")
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
    """The checks every output path shares: UTF-8, no NUL byte, a real name (not ``.``/``..``),
    every name short enough for its file system, not a link."""
    text = os.fspath(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{what} {text.encode('utf-8', 'surrogateescape')!r} is not valid UTF-8; "
                          "use a UTF-8 path") from None
    if "\0" in text:
        raise ConfigError(f"{what} {one_line(text)} holds a NUL byte; no file can have that name")
    p = Path(text)
    if p.name in ("", ".", ".."):
        raise ConfigError(f"{what} {one_line(text)!r} names an existing folder; give a new {kind} name")
    check_name_lengths(p, what)
    if p.is_symlink():
        raise ConfigError(f"{what} {one_line(str(p))} is a symbolic link; give the real {kind} path")
    return p


# ---------------------------------------------------------------- names and their length
DEFAULT_NAME_MAX = 255


def _existing_folder(path: Path) -> Path:
    """The nearest folder at or above ``path`` that exists (the current folder for a relative
    path whose folders do not exist)."""
    q = path
    while True:
        try:
            if q.is_dir():
                return q
        except (OSError, ValueError):
            pass
        if q.parent == q:
            return q
        q = q.parent


def name_max(folder: str | os.PathLike[str]) -> int:
    """The longest name (in bytes) a file or folder in ``folder`` may have on its file system:
    ``pathconf(PC_NAME_MAX)`` of the nearest existing folder, else 255."""
    try:
        n = os.pathconf(_existing_folder(Path(folder)), "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return DEFAULT_NAME_MAX
    return n if isinstance(n, int) and n > 0 else DEFAULT_NAME_MAX


def check_name_lengths(path: Path, what: str) -> None:
    """ConfigError (one line) when a name in ``path`` is longer than its file system allows:
    creating it could only fail, after the work is done."""
    limit = name_max(path.parent)
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > limit:
            raise ConfigError(f"{what} {one_line(str(path), 120)}: the name {one_line(part, 40)!r} is {size} bytes, "
                              f"too long for its file system (at most {limit}); give a shorter name")


def short_name(name: str, room: int) -> str:
    """``name`` cut to at most ``room`` bytes (whole UTF-8 characters), for a hidden helper
    name made from it (a staging folder, a temporary file) that must fit the file system."""
    data = name.encode("utf-8", "surrogateescape")
    if len(data) <= room:
        return name
    return data[:max(room, 1)].decode("utf-8", "ignore") or "x"


def _writable_ancestor(path: Path, what: str) -> None:
    """The nearest existing ancestor of ``path`` must be a folder this process can write in
    (and every existing ancestor a folder): otherwise creating ``path`` could only fail."""
    parent = path.parent
    shown = one_line(str(path))
    while True:
        if os.path.lexists(parent):
            if not parent.is_dir():
                raise ConfigError(f"{what} {shown}: {one_line(str(parent))} is a file, not a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise ConfigError(f"{what} {shown}: folder {one_line(str(parent))} is not writable")
            return
        if parent == parent.parent:
            raise ConfigError(f"{what} {shown}: no existing folder above it")
        parent = parent.parent


def check_output_file(path: str | os.PathLike[str], what: str = "output", *, force: bool | None = None) -> Path:
    """A file path gradleak may create or replace: absent or a regular file (not a folder, a
    link or a device), UTF-8, in a folder that can be written. Raises ConfigError.

    ``force``: False refuses an existing file ("... exists; pass --force to replace it"), True
    replaces it; None (the default) replaces it too: for the files a command rebuilds in place
    (a run folder's report.html, a sweep's dashboard.html)."""
    p = _output_path(path, what, "file")
    if p.exists() and not p.is_file():
        kind = "a folder" if p.is_dir() else "not a regular file"
        raise ConfigError(f"{what} {one_line(str(p))} is {kind}; give a file path")
    if force is False and p.exists():
        raise ConfigError(f"{what} {one_line(str(p))} exists; pass --force to replace it")
    _writable_ancestor(p, what)
    return p


def check_output_dir(path: str | os.PathLike[str], what: str = "--out") -> Path:
    """A run folder gradleak may create: absent, or an empty real folder (not a link), with a
    name (not ``.`` or ``..``, short enough for its file system), UTF-8, below folders that
    exist or can be created and written."""
    p = _output_path(path, what, "folder")
    if p.exists():
        if not p.is_dir():
            raise ConfigError(f"{what} {one_line(str(p))} exists and is not a folder; choose another {what}")
        if any(p.iterdir()):
            raise ConfigError(f"output {one_line(str(p))} already exists and is not empty; choose another {what}")
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


# Bound of the walk of an input folder (the image loader refuses a larger folder anyway).
MAX_INPUT_ENTRIES = 2_000_000

Identity = tuple[int, int]   # (st_dev, st_ino): the same file or folder whatever path reaches it


def _identity(path: str | os.PathLike[str]) -> Identity | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _ancestors(path: str | os.PathLike[str]) -> list[Identity]:
    """The identities of the existing folders above ``path`` (its real location, links resolved)."""
    found = []
    for folder in Path(os.path.realpath(path)).parents:
        ident = _identity(folder)
        if ident is not None:
            found.append(ident)
    return found


def _input_identities(path: Path, *, with_files: bool) -> tuple[set[Identity], set[Identity]]:
    """(folders, files) an input reaches: a file itself; a folder and every folder and file
    below it, linked ones followed (each real folder entered once), bounded by
    MAX_INPUT_ENTRIES. Files are stat'ed only when ``with_files`` (an output that exists)."""
    ident = _identity(path)
    if ident is None:
        return set(), set()
    if not path.is_dir():
        return set(), {ident}
    folders: set[Identity] = set()
    files: set[Identity] = set()
    entries = 0
    for dirpath, dirnames, filenames in os.walk(path, followlinks=True):
        key = _identity(dirpath)
        if key is None or key in folders:
            dirnames[:] = []
            continue
        folders.add(key)
        entries += len(dirnames) + len(filenames)
        if entries > MAX_INPUT_ENTRIES:
            break
        if with_files:
            files.update(k for k in (_identity(os.path.join(dirpath, f)) for f in filenames) if k is not None)
    return folders, files


def check_apart(outputs: Iterable[tuple[str, str | os.PathLike[str] | None]],
                inputs: Iterable[tuple[str, str | os.PathLike[str] | None]]) -> None:
    """Refuse an output that is, or lands inside, something the run reads (ConfigError naming
    both), before any work: the same file (compared by identity, so that a hard link or a
    symbolic link on the way does not hide it), a path inside an input folder (or inside a folder
    linked from it), or an output folder that holds an input. ``--force`` may replace an earlier
    output, never an input. ``None`` paths and inputs that do not exist are skipped."""
    outs = [(what, Path(p)) for what, p in outputs if p is not None]
    ins = [(what, Path(p)) for what, p in inputs if p is not None and os.path.exists(p)]
    if not outs or not ins:
        return
    out_ids = {what: _identity(p) for what, p in outs}
    with_files = any(ident is not None for ident in out_ids.values())
    for in_what, in_path in ins:
        folders, files = _input_identities(in_path, with_files=with_files)
        in_above = set(_ancestors(in_path))
        for out_what, out_path in outs:
            shown = f"{out_what} {one_line(str(out_path))}"
            where = f"{in_what} {one_line(str(in_path))}"
            ident = out_ids[out_what]
            if ident is not None and (ident in files or ident in folders):
                what = "itself" if ident == _identity(in_path) else "a file of" if ident in files else "a folder of"
                what = f"{where} itself" if what == "itself" else f"{what} {where}"
                raise ConfigError(f"{shown} is {what}, which the run reads; write the output elsewhere (--force "
                                  "replaces an earlier output, never an input)")
            if folders & set(_ancestors(out_path)):
                raise ConfigError(f"{shown} is inside {where}, which the run reads; write the output elsewhere")
            if ident is not None and ident in in_above:
                raise ConfigError(f"{shown} holds {where}, which the run reads; write the output elsewhere")


def run_inputs(cfg: Any, config: str | os.PathLike[str] | None = None) -> list[tuple[str, str | None]]:
    """What a run of ``cfg`` (a config.AttackConfig) reads, by flag, for :func:`check_apart`:
    its data folder or file (a named source is not a path), --data-root, the update, truth and
    checkpoint files, and the --config file it came from."""
    from .catalog import SOURCES

    def user(path: str | None) -> str | None:
        return os.path.expanduser(path) if path else None

    data = None if str(cfg.data).strip().lower() in SOURCES else user(cfg.data)
    return [("--data", data), ("--data-root", user(cfg.data_root)), ("--update", cfg.update),
            ("--truth", cfg.truth), ("--checkpoint", cfg.checkpoint),
            ("--config", os.fspath(config) if config else None)]


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
    _umask_mode(Path(tmp))
    return tmp


def _fsync_folder(folder: Path) -> None:
    with _quiet():  # make a rename durable (POSIX)
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


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
            tail = f".partial-{_HOST}-{os.getpid()}-"
            room = name_max(self.out.parent) - len(tail) - 1 - 8  # the leading ".", mkdtemp's 8 characters
            self.path = Path(tempfile.mkdtemp(dir=self.out.parent, prefix=f".{short_name(self.out.name, room)}{tail}"))
            _umask_mode(self.path, folder=True)
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


__all__ = ["InputFileError", "check_input_file", "read_text_file", "check_output_file", "check_output_dir",
           "check_distinct", "check_apart", "run_inputs", "atomic_write_bytes", "atomic_write_files", "deferred_signals", "StagedDir",
           "OutputAppearedError", "remove_stale_partials", "check_name_lengths", "name_max", "short_name",
           "MAX_TEXT_FILE", "MAX_JSON_DEPTH", "one_line", "check_tree", "loads_json"]


def printable(text: object) -> str:
    """``text`` safe to echo to a terminal whatever a file put in it (a tensor's or a metadata
    name): every non-printable character (escape, carriage return, newline, bidi control) and the
    backslash written as Python escapes, so that a name can neither move the cursor nor pass for
    another; nothing is cut, so two names stay distinct."""
    return "".join(c if c.isprintable() and c != "\\" else repr(c)[1:-1] for c in str(text))


__all__ += ["printable"]
