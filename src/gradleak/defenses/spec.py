"""Defense specs: parse ``name[:value][,key=value...]`` strings into Defense objects."""

from __future__ import annotations

import dataclasses
import importlib
import math
import typing

import torch

from ..catalog import DEFENSE_EXAMPLES, defense_values, unknown
from ..specs import declarations
from ..errors import ConfigError
from ..paths import one_line
from ..fl.update import SharedUpdate
from .base import Defense

# Each defense's class, from its module's declaration (its SPEC: specs.declarations).
DEFENSES: dict[str, type[Defense]] = {
    name: getattr(importlib.import_module(d.module), d.get("class")) for name, d in declarations("defense").items()
}


def defense_names() -> list[str]:
    return sorted(DEFENSES)


def _convert(defense: str, field: dataclasses.Field, text: str) -> object:
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
    if kind == "str":
        return text
    try:
        if kind == "int":
            value = float(text)
            if not math.isfinite(value) or value != int(value):
                raise ValueError
            return int(value)
        value = float(text)
    except ValueError:
        want = "an integer" if kind == "int" else "a number"
        raise ConfigError(f"defense {defense}: {field.name} must be {want}, got {one_line(repr(text), 80)}") from None
    if not math.isfinite(value):
        raise ConfigError(f"defense {defense}: {field.name} must be a finite number, got {one_line(repr(text), 80)}")
    return value


def parse_defense(spec: str) -> Defense:
    """One spec string -> a validated Defense. ConfigError for malformed specs or values,
    UnknownNameError for an unknown defense name."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"defense spec must be a non-empty string like 'gaussian:0.01', got {one_line(repr(spec), 80)}")
    head, sep, rest = spec.strip().partition(":")
    name = head.strip().lower()
    if name not in DEFENSES:
        raise unknown("defense", head.strip(), defense_names(), f" (in {one_line(repr(spec), 80)})")
    cls = DEFENSES[name]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = defense_values(name, spec, rest) if sep else {}
    missing = [f for f, fld in fields.items() if f not in values
               and fld.default is dataclasses.MISSING and fld.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"defense {name}: missing value for {', '.join(missing)} (e.g. "
                          f"{_example(name)})")
    kwargs = {k: _convert(name, fields[k], v) for k, v in values.items()}
    return cls(**kwargs)


def _example(name: str) -> str:
    return DEFENSE_EXAMPLES.get(name, name)


def parse_defenses(specs: typing.Iterable[str] | str | None) -> list[Defense]:
    """Spec strings -> Defenses, in order. A client-side defense (dpsgd) may appear at most
    once and only first: it produces the gradient the later ones transform."""
    if specs is None:
        return []
    if isinstance(specs, str):
        specs = [specs]
    defenses = [parse_defense(s) for s in specs]
    for i, d in enumerate(defenses):
        if d.client_side and i > 0:
            raise ConfigError(f"defense {d.spec} runs while the client computes its gradient, so it must come "
                              f"first (and only once); got it at position {i + 1} of {[x.spec for x in defenses]}")
    return defenses


def apply_defenses(update: SharedUpdate, defenses: typing.Sequence[Defense | str],
                   generator: torch.Generator) -> SharedUpdate:
    """Apply update-level defenses in order (strings are parsed first); each records its spec in
    meta.defenses. The input update is not modified. A client-side defense raises ConfigError
    (use :func:`client_update`)."""
    for d in defenses:
        d = parse_defense(d) if isinstance(d, str) else d
        update = d.apply(update, generator)
    return update


def split_defenses(defenses: typing.Sequence[Defense]) -> tuple[Defense | None, list[Defense]]:
    """(the client-side defense or None, the update-level ones in order)."""
    if defenses and defenses[0].client_side:
        rest = list(defenses[1:])
        first: Defense | None = defenses[0]
    else:
        first, rest = None, list(defenses)
    for d in rest:
        if d.client_side:
            raise ConfigError(f"defense {d.spec} must come first: it runs while the client computes its gradient")
    return first, rest


def client_update(model, batch, defenses: typing.Sequence[Defense | str],  # noqa: ANN001
                  generator: torch.Generator, *, share_bn_statistics: bool = False) -> SharedUpdate:
    """The whole defended FedSGD client: the client-side defense (if first in ``defenses``)
    computes the gradient, else plain :func:`gradleak.fl.fedsgd`; then the update-level
    defenses in order. ``model``: ModelSpec, ``batch``: Batch."""
    from ..fl.client import fedsgd

    parsed = [parse_defense(d) if isinstance(d, str) else d for d in defenses]
    first, rest = split_defenses(parsed)
    if first is not None:
        if share_bn_statistics:
            raise ConfigError(f"defense {first.spec}: sharing BN statistics is not possible with a client-side "
                              "defense (its models have no BatchNorm)")
        update = first.client_update(model, batch, generator)  # type: ignore[attr-defined]
    else:
        update = fedsgd(model, batch, share_bn_statistics=share_bn_statistics)
    return apply_defenses(update, rest, generator)
