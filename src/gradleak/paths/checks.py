"""Every input and output path checked before any work: inputs readable regular files, outputs
creatable (names short enough, not links, writable folders), and outputs apart from the inputs."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Iterable

from ..errors import ConfigError, InputFileError
from .bounded import one_line

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
    from ..catalog import SOURCES

    def user(path: str | None) -> str | None:
        return os.path.expanduser(path) if path else None

    data = None if str(cfg.data).strip().lower() in SOURCES else user(cfg.data)
    return [("--data", data), ("--data-root", user(cfg.data_root)), ("--update", cfg.update),
            ("--truth", cfg.truth), ("--checkpoint", cfg.checkpoint),
            ("--config", os.fspath(config) if config else None)]


__all__ = ["DEFAULT_NAME_MAX", "MAX_INPUT_ENTRIES", "MAX_TEXT_FILE", "Identity", "check_apart", "check_distinct",
           "check_input_file", "check_name_lengths", "check_output_dir", "check_output_file", "name_max",
           "read_text_file", "run_inputs", "short_name"]
