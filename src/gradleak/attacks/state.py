"""Resumable attack state: snapshots, the on-disk state folder, signals, and the run's session.

The one optimisation loop (loop.py) takes every snapshot. A snapshot has four sections:

* ``loop``: the candidates (every optimised variable), the optimizer's state (Adam moments and
  step, L-BFGS history, SGD momentum), the loop's generator, torch's global CPU RNG, the loss
  history so far, the step, the learning-rate scale and the divergence retries used;
* ``attack``: the attack's own state, a typed dataclass (:class:`AttackState`) the loop snapshots
  field by field: GradInversion's per-seed generators and registration transforms, Inverting
  Gradients' best iterate per restart, DLG's earlier trials and best trial;
* ``providers``: the run's own parts (:class:`StateHooks`: the pipeline's observer points);
* ``session``: divergence recoveries and resume points of the whole run.

On disk (``Session.directory``, for a run folder ``<parent>/<name>`` that is
``<parent>/.<name>.state/``, created at the first checkpoint) a state is::

    config.json                     the run's config (what ``--resume`` runs again)
    state-<phase>-<step>.safetensors   every tensor of the snapshot (safetensors: no code runs)
    state.json                      the manifest: format, version, phase, step, the JSON sections
                                    with placeholders for the tensors, and the sha256 + size of
                                    the safetensors file

The tensor file is written first under a new name, then state.json replaces the old manifest
(each through a temporary file and ``os.replace``), then the old tensor file is removed: a crash
at any moment leaves a manifest that points to a complete tensor file. Nothing is ever unpickled.

A session belongs to the run's engine (engine.py), which passes it to ``optimise()``; an attack
never finds it through a global. Without one, ``optimise()`` uses a private in-memory session:
divergence recovery still works, nothing is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import signal
import threading
import types
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from ..errors import GradleakError, InputFileError
from ..paths import atomic_write_bytes, read_text_file

STATE_FORMAT = "gradleak-attack-state"
STATE_VERSION = 2  # 2: the attacks' own sections are typed dataclasses (AttackState)
MANIFEST = "state.json"
CONFIG = "config.json"
MAX_MANIFEST_BYTES = 256 * 2**20
DEFAULT_CHECKPOINT_EVERY = 100
DEFAULT_RETRIES = 3
BACKOFF = 0.5          # learning-rate factor per divergence recovery
SNAPSHOT_EVERY = 10    # in-memory "last good state" every N steps (and at every checkpoint)



class StateFileError(GradleakError):
    """A saved attack state that is missing, corrupted, truncated or does not fit this run."""


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
class StateHooks:
    """What an attack plugs into the loop's snapshots: ``get_state()`` -> {name: tensor or JSON
    value (nested lists/dicts allowed)}; ``set_state(that dict)`` restores it. Called under
    no_grad; ``set_state`` gets fresh tensors it may keep."""

    get_state: Callable[[], dict[str, Any]]
    set_state: Callable[[dict[str, Any]], None]


class AttackState:
    """An attack's own resumable state, declared as a typed dataclass (subclass this, decorate
    with ``@dataclass``) and handed to the loop (``Engine.optimise(..., state=...)``), which
    snapshots every field and puts it back on resume or after a divergence.

    Restoring checks each saved value against the field: a tensor must have the current value's
    shape (it takes its dtype and device); a generator takes the saved state; a nested
    AttackState restores itself; other fields must have the field's declared type (``X | None``
    allows None). ``validate()`` adds checks across fields. A field declared with
    ``field(metadata={"state": False})`` describes the run (e.g. an expected shape) and is not saved. The attack keeps using the same
    object, so what it reads after a restore is the restored state."""

    def _state_fields(self) -> list[Any]:
        return [f for f in fields(self) if f.metadata.get("state", True)]  # type: ignore[arg-type]

    def get_state(self) -> dict[str, Any]:
        return {f.name: _export(getattr(self, f.name)) for f in self._state_fields()}

    def set_state(self, saved: dict[str, Any]) -> None:
        hints = typing.get_type_hints(type(self))
        name = type(self).__name__
        for f in self._state_fields():
            if f.name not in saved:
                raise ValueError(f"{name}: the saved state lacks {f.name!r}")
            setattr(self, f.name, _restore(f"{name}.{f.name}", getattr(self, f.name), saved[f.name], hints[f.name]))
        self.validate()

    def validate(self) -> None:
        """Raise ValueError when the restored fields do not fit together (override as needed)."""


def _has_state(value: Any) -> bool:
    """A part that saves and restores itself (an AttackState, or e.g. GroupConsistency)."""
    return not isinstance(value, torch.Generator) and callable(getattr(value, "get_state", None)) \
        and callable(getattr(value, "set_state", None))


def _export(value: Any) -> Any:
    if isinstance(value, torch.Generator) or _has_state(value):
        return value.get_state()
    if isinstance(value, (list, tuple)):
        return [_export(v) for v in value]
    return value


_SIMPLE = {float: (float, int), int: (int,), str: (str,), bool: (bool,), list: (list,), dict: (dict,)}


def _restore(where: str, current: Any, saved: Any, hint: Any) -> Any:
    if isinstance(current, torch.Generator):
        if not (isinstance(saved, torch.Tensor) and saved.dtype == torch.uint8):
            raise ValueError(f"{where}: not a generator state")
        current.set_state(saved)
        return current
    if _has_state(current):
        if not isinstance(saved, dict):
            raise ValueError(f"{where}: malformed")
        current.set_state(saved)
        return current
    if isinstance(current, list) and current and all(isinstance(c, torch.Generator) for c in current):
        if not (isinstance(saved, list) and len(saved) == len(current)):
            raise ValueError(f"{where}: {len(saved) if isinstance(saved, list) else 'no'} generators saved, "
                             f"this run has {len(current)}")
        return [_restore(f"{where}[{i}]", c, v, torch.Generator) for i, (c, v) in enumerate(zip(current, saved, strict=True))]
    if isinstance(current, torch.Tensor):
        if not (isinstance(saved, torch.Tensor) and saved.shape == current.shape):
            got = list(saved.shape) if isinstance(saved, torch.Tensor) else type(saved).__name__
            raise ValueError(f"{where}: expected a tensor of shape {list(current.shape)}, got {got}")
        return saved.to(device=current.device, dtype=current.dtype)
    allowed = list(typing.get_args(hint) or (hint,)) if typing.get_origin(hint) in (typing.Union, types.UnionType) \
        else [hint]
    if saved is None:
        if type(None) in allowed:
            return None
        raise ValueError(f"{where}: missing value")
    for a in allowed:
        base = typing.get_origin(a) or a
        if base is torch.Tensor and isinstance(saved, torch.Tensor):
            return saved
        if base in _SIMPLE and isinstance(saved, _SIMPLE[base]) and not (base is not bool and isinstance(saved, bool)):
            return float(saved) if base is float else saved
    raise ValueError(f"{where}: expected {hint}, got {type(saved).__name__}")


@dataclass
class Snapshot:
    """One state: ``tree`` holds JSON values with {"$tensor": key} placeholders for ``tensors``."""

    phase: str
    step: int
    tree: dict[str, Any]
    tensors: dict[str, torch.Tensor]


# ------------------------------------------------------------------------------ packing
def pack(value: Any, tensors: dict[str, torch.Tensor], path: str) -> Any:
    """``value`` as JSON with its tensors moved (cloned) into ``tensors`` under path-like keys."""
    if isinstance(value, torch.Tensor):
        key, n = path, 1
        while key in tensors:
            n += 1
            key = f"{path}~{n}"
        tensors[key] = value.detach().clone().contiguous()
        return {"$tensor": key}
    if isinstance(value, torch.Generator):
        raise TypeError("pack a generator's get_state(), not the generator")
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, tuple):
        return {"$tuple": [pack(v, tensors, f"{path}/{i}") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [pack(v, tensors, f"{path}/{i}") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: pack(v, tensors, f"{path}/{k}") for k, v in value.items()}
        if not all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in value):
            raise TypeError(f"state dict keys must be str or int at {path}")
        return {"$dict": [[k, pack(v, tensors, f"{path}/{k}")] for k, v in value.items()]}
    raise TypeError(f"cannot save a {type(value).__name__} in an attack state ({path})")


def unpack(tree: Any, tensors: dict[str, torch.Tensor], *, clone: bool) -> Any:
    """Inverse of :func:`pack`; raises StateFileError on anything it did not write."""
    if isinstance(tree, list):
        return [unpack(v, tensors, clone=clone) for v in tree]
    if isinstance(tree, dict):
        if len(tree) == 1:
            (tag, body), = tree.items()
            if tag == "$tensor":
                if not isinstance(body, str) or body not in tensors:
                    raise StateFileError(f"state refers to a tensor {str(body)[:80]!r} the tensor file lacks")
                t = tensors[body]
                return t.clone() if clone else t
            if tag == "$float":
                if body not in ("nan", "inf", "-inf"):
                    raise StateFileError(f"state holds an invalid float {str(body)[:20]!r}")
                return float(body)
            if tag == "$tuple":
                if not isinstance(body, list):
                    raise StateFileError("state holds a malformed tuple")
                return tuple(unpack(v, tensors, clone=clone) for v in body)
            if tag == "$dict":
                if not isinstance(body, list) or not all(isinstance(p, list) and len(p) == 2
                                                         and isinstance(p[0], (str, int)) for p in body):
                    raise StateFileError("state holds a malformed mapping")
                return {k: unpack(v, tensors, clone=clone) for k, v in body}
        if any(isinstance(k, str) and k.startswith("$") for k in tree):
            raise StateFileError(f"state holds an unknown entry {next(iter(tree))[:40]!r}")
        return {k: unpack(v, tensors, clone=clone) for k, v in tree.items()}
    if tree is None or isinstance(tree, (bool, int, float, str)):
        return tree
    raise StateFileError(f"state holds an unexpected {type(tree).__name__}")


# ------------------------------------------------------------------------------ files
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


# ------------------------------------------------------------------------------ the session
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
    def signals(self) -> Iterator["Session"]:
        """SIGINT/SIGTERM set ``interrupted``; the loop then saves a checkpoint after the step it is
        in and raises :class:`Interrupted`. A second signal acts as it would without gradleak
        (SIGINT: KeyboardInterrupt; SIGTERM: the process ends). No-op outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        wanted = (signal.SIGINT, signal.SIGTERM)
        previous = {s: signal.getsignal(s) for s in wanted}

        def handler(signum: int, frame: Any) -> None:  # noqa: ARG001
            self.interrupted = signum
            for s, h in previous.items():
                signal.signal(s, h if h is not None else signal.SIG_DFL)

        for s in wanted:
            signal.signal(s, handler)
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h if h is not None else signal.SIG_DFL)


__all__ = ["AttackState", "BACKOFF", "DEFAULT_CHECKPOINT_EVERY", "DEFAULT_RETRIES", "Interrupted", "SNAPSHOT_EVERY", "Session",
           "Snapshot", "StateFileError", "StateHooks", "find_state", "load_state", "pack",
           "read_saved_config", "save_state", "state_dir_for", "unpack"]
