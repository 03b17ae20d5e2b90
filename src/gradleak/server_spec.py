"""The ``--server`` spec (``honest``, or ``NAME[:KEY=VALUE,...]`` of a malicious server), parsed
without torch from the servers' ``SERVER_SPEC`` declarations (specs.py), so that the config can
check it; models/server.py builds the model a spec names with the builder its server declares."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .catalog import SERVERS, unknown
from .errors import ConfigError
from .paths import one_line
from .specs import declarations

# Each malicious server's parameters, as its SERVER_SPEC declares them (the first one may be given
# without its key: imprint:64), and those that are integers.
PARAMETERS: dict[str, tuple[str, ...]] = {name: tuple(d.get("parameters")) for name, d in
                                          sorted(declarations("server").items()) if d.get("parameters")}
INTEGER_PARAMETERS = frozenset(p for d in declarations("server").values() for p in d.get("integers", ()))
_ANY_PARAMETER = frozenset(p for keys in PARAMETERS.values() for p in keys)


@dataclass(frozen=True)
class ServerSpec:
    """A parsed ``--server``: the server's name and the parameters given (``params``, by key).
    A parameter any server declares reads as an attribute (``spec.bins``), None when not given."""

    name: str = "honest"
    params: dict[str, Any] = field(default_factory=dict, hash=False)

    def __getattr__(self, key: str) -> Any:
        if key in _ANY_PARAMETER:
            return self.__dict__.get("params", {}).get(key)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {key!r}")


def server_usage() -> str:
    """``honest | imprint[:bins=N,mean=X,...] | ...``: each declared server with its parameters
    (N an integer, X a number; an exclusive pair as ``a=X|b=X``), for the --server help."""
    parts = []
    for name, declared in sorted(declarations("server").items(), key=lambda item: bool(item[1].get("parameters"))):
        keys = list(declared.get("parameters", ()))
        for a, b, _ in declared.get("exclusive", ()):
            keys[keys.index(a)] = f"{a}|{b}"
            keys.remove(b)
        shown = ",".join("|".join(f"{k}={'N' if k in declared.get('integers', ()) else 'X'}" for k in key.split("|"))
                         for key in keys)
        parts.append(f"{name}[:{shown}]" if shown else name)
    return " | ".join(parts)


def parse_server(text: str | None) -> ServerSpec:
    """``NAME[:KEY=VALUE,...]`` of a declared server (``NAME:V``: its first parameter V; honest takes
    none): each value a finite number, an integer where declared; ConfigError naming the problem."""
    raw = (text or "honest").strip()
    name, _, params = raw.partition(":")
    name = name.strip().lower()
    if name not in SERVERS:
        examples = ", ".join(d.get("example") for d in declarations("server").values()
                             if d.get("parameters") and d.get("example"))
        raise unknown("server", name, SERVERS, f" (e.g. {examples})")
    if name not in PARAMETERS:
        if params.strip():
            raise ConfigError(f"server {name} takes no parameters")
        return ServerSpec(name)
    values = _values(name, params)
    for a, b, why in declarations("server")[name].get("exclusive", ()):
        if a in values and b in values:
            raise ConfigError(f"server {name}: give {a} or {b}, not both ({why})")
    return ServerSpec(name, values)


def _values(name: str, params: str) -> dict[str, Any]:
    """The ``KEY=VALUE,...`` of server ``name``, each a number (an integer where declared)."""
    keys, integers = PARAMETERS[name], declarations("server")[name].get("integers", ())
    values: dict[str, Any] = {}
    for i, part in enumerate(p.strip() for p in params.split(",") if params.strip()):
        key, eq, value = part.partition("=")
        if not eq:
            if i:
                raise ConfigError(f"server {name}: {one_line(repr(part), 80)} is not key=value")
            key, value = keys[0], part
        key = key.strip()
        if key not in keys or key in values:
            raise ConfigError(f"server {name}: unknown or repeated parameter {one_line(repr(key), 80)} "
                              f"({', '.join(keys)})")
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"server {name}: {key} must be a number, got {one_line(repr(value.strip()), 80)}") from None
        if not math.isfinite(number):
            raise ConfigError(f"server {name}: {key} must be finite, got {one_line(repr(value.strip()), 80)}")
        if key in integers and number != int(number):
            raise ConfigError(f"server {name}: {key} must be an integer, got {number:g}")
        values[key] = int(number) if key in integers else number
    return values


__all__ = ["INTEGER_PARAMETERS", "PARAMETERS", "SERVERS", "ServerSpec", "parse_server", "server_usage"]
