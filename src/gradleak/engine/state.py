"""What a snapshot of an attack holds, and how it is packed for the disk."""

from __future__ import annotations

import math
import types
import typing
from dataclasses import dataclass, fields
from typing import Any, Callable

import torch

from ..errors import GradleakError


class StateFileError(GradleakError):
    """A saved attack state that is missing, corrupted, truncated or does not fit this run."""


@dataclass
class StateHooks:
    """What an attack plugs into the loop's snapshots: ``get_state()`` -> {name: tensor or JSON
    value (nested lists/dicts allowed)}; ``set_state(that dict)`` restores it. Called under
    no_grad; ``set_state`` gets fresh tensors it may keep."""

    get_state: Callable[[], dict[str, Any]]
    set_state: Callable[[dict[str, Any]], None]


class AttackState:
    """An attack's own resumable state, declared as a typed dataclass (subclass this, decorate
    with ``@dataclass``) and handed to the loop (``Engine.optimise(..., LoopHooks(state=...))``), which
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


__all__ = ["AttackState", "Snapshot", "StateFileError", "StateHooks", "pack", "unpack"]
