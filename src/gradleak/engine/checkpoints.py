"""Checkpoints on disk: the state folder of a run, written atomically and read with every check."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import torch

from ..errors import InputFileError
from ..paths import atomic_write_bytes, read_text_file
from .state import Snapshot, StateFileError

STATE_FORMAT = "gradleak-attack-state"
STATE_VERSION = 2  # 2: the attacks' own sections are typed dataclasses (AttackState)
MANIFEST = "state.json"
CONFIG = "config.json"
MAX_MANIFEST_BYTES = 256 * 2**20


def state_dir_for(out: Path | str) -> Path:
    """The in-progress state folder of run folder ``out``: ``<parent>/.<name>.state``."""
    out = Path(out)
    return out.parent / f".{out.name}.state"


def find_state(run: Path | str) -> Path:
    """The state folder ``--resume RUN`` means: RUN itself if it holds state.json, else RUN's
    sibling ``.RUN.state``."""
    run = Path(run)
    if (run / MANIFEST).is_file():
        return run
    candidate = state_dir_for(run)
    if (candidate / MANIFEST).is_file():
        return candidate
    if (run / "metrics.json").is_file():
        raise StateFileError(f"{run} is a finished run folder; there is nothing to resume")
    raise StateFileError(f"no saved attack state for {run} (looked for {candidate / MANIFEST})")


def _atomic_write(path: Path, data: bytes) -> None:
    atomic_write_bytes(path, data, durable=True)  # mkstemp name (no planted link followed), fsync


_TENSOR_FILE = re.compile(r"^state-[A-Za-z0-9_.-]{1,80}-\d{1,12}\.safetensors$")


def save_state(directory: Path, snap: Snapshot, config: dict[str, Any] | None = None) -> Path:
    """Write ``snap`` (and, the first time, ``config``) into ``directory`` atomically."""
    from safetensors.torch import save as st_save

    from .. import __version__

    directory.mkdir(parents=True, exist_ok=True)
    if config is not None and not (directory / CONFIG).is_file():
        _atomic_write(directory / CONFIG, (json.dumps(config, indent=2) + "\n").encode())
    data = st_save({k: v.detach().to("cpu").contiguous() for k, v in snap.tensors.items()})
    phase = re.sub(r"[^A-Za-z0-9_.-]", "_", snap.phase)[:80] or "main"
    name = f"state-{phase}-{snap.step:08d}.safetensors"
    _atomic_write(directory / name, data)
    manifest = {"format": STATE_FORMAT, "version": STATE_VERSION, "gradleak": __version__,
                "torch": torch.__version__, "phase": snap.phase, "step": snap.step, "tensors": name,
                "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "state": snap.tree}
    _atomic_write(directory / MANIFEST, json.dumps(manifest, allow_nan=False).encode())
    for old in directory.glob("state-*.safetensors"):
        if old.name != name:
            with contextlib.suppress(OSError):
                old.unlink()
    return directory / MANIFEST


def load_state(directory: Path | str) -> Snapshot:
    """Read and check a saved state (manifest, then the tensor file against its size and hash)."""
    from safetensors.torch import load as st_load

    directory = Path(directory)
    mpath = directory / MANIFEST
    if not mpath.is_file():
        raise StateFileError(f"no saved attack state in {directory} ({MANIFEST} missing)")
    if mpath.stat().st_size > MAX_MANIFEST_BYTES:
        raise StateFileError(f"{mpath} is larger than {MAX_MANIFEST_BYTES} bytes; not a gradleak state")
    try:
        manifest = json.loads(mpath.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise StateFileError(f"{mpath} is not valid JSON (truncated or corrupted?): {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != STATE_FORMAT:
        raise StateFileError(f"{mpath} is not a gradleak attack state")
    if manifest.get("version") != STATE_VERSION:
        raise StateFileError(f"{mpath} has state version {manifest.get('version')!r}; this gradleak reads "
                             f"version {STATE_VERSION}")
    phase, step, name = manifest.get("phase"), manifest.get("step"), manifest.get("tensors")
    size, digest, tree = manifest.get("bytes"), manifest.get("sha256"), manifest.get("state")
    if not (isinstance(phase, str) and isinstance(step, int) and not isinstance(step, bool) and step >= 0
            and isinstance(name, str) and _TENSOR_FILE.match(name) and isinstance(size, int)
            and isinstance(digest, str) and isinstance(tree, dict)):
        raise StateFileError(f"{mpath} lacks or has invalid fields (phase, step, tensors, bytes, sha256, state)")
    tpath = directory / name
    if not tpath.is_file():
        raise StateFileError(f"{tpath} (named by {MANIFEST}) is missing")
    if tpath.stat().st_size != size:
        raise StateFileError(f"{tpath} has {tpath.stat().st_size} bytes, {MANIFEST} says {size} (truncated?)")
    data = tpath.read_bytes()
    if hashlib.sha256(data).hexdigest() != digest:
        raise StateFileError(f"{tpath} does not match the checksum in {MANIFEST} (corrupted)")
    try:
        tensors = st_load(data)
    except Exception as exc:  # safetensors raises its own error type; no code runs either way
        raise StateFileError(f"{tpath} is not a valid safetensors file: {exc}") from None
    return Snapshot(phase=phase, step=step, tree=tree, tensors=tensors)


def read_saved_config(directory: Path) -> dict[str, Any]:
    path = directory / CONFIG
    if not path.is_file():
        raise StateFileError(f"{path} is missing; the state folder is incomplete")
    try:
        raw = json.loads(read_text_file(path, "saved config", max_bytes=1 << 20))
    except InputFileError as exc:
        raise StateFileError(str(exc)) from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise StateFileError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise StateFileError(f"{path} must hold a JSON object")
    return raw


__all__ = ["CONFIG", "MANIFEST", "find_state", "load_state", "read_saved_config", "save_state", "state_dir_for"]
