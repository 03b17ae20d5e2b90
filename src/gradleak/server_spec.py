"""The ``--server`` spec (``honest``, ``imprint[:...]``, ``trap[:...]``), parsed without torch so that
the config can check it; models/server.py builds the model a spec names."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .catalog import SERVERS, unknown
from .errors import ConfigError
from .paths import one_line
from .specs import declarations

DEFAULT_BINS = 64

# Each malicious server's parameters, as its SERVER_SPEC declares them (the first one may be given
# without its key: imprint:64), and those that are integers.
PARAMETERS: dict[str, tuple[str, ...]] = {name: tuple(d.get("parameters")) for name, d in
                                          sorted(declarations("server").items()) if d.get("parameters")}
INTEGER_PARAMETERS = frozenset(p for d in declarations("server").values() for p in d.get("integers", ()))


@dataclass(frozen=True)
class ServerSpec:
    name: str = "honest"
    bins: int | None = None
    mean: float | None = None
    std: float | None = None
    gain: float | None = None
    rows: int | None = None
    shrink: float | None = None
    rate: float | None = None
    seed: int | None = None


def parse_server(text: str | None) -> ServerSpec:
    """``honest`` | ``imprint[:bins=N][,mean=M][,std=S][,gain=G]`` (``imprint:N`` = bins N) |
    ``trap[:rows=N][,shrink=A][,rate=R][,seed=S][,gain=G]`` (``trap:N`` = rows N); ConfigError
    naming the problem otherwise."""
    raw = (text or "honest").strip()
    name, _, params = raw.partition(":")
    name = name.strip().lower()
    if name not in SERVERS:
        raise unknown("server", name, SERVERS, " (e.g. imprint:bins=64, trap:rows=1000)")
    if name == "honest":
        if params.strip():
            raise ConfigError("server honest takes no parameters")
        return ServerSpec()
    keys = PARAMETERS[name]
    values: dict[str, float] = {}
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
        if key in INTEGER_PARAMETERS and number != int(number):
            raise ConfigError(f"server {name}: {key} must be an integer, got {number:g}")
        values[key] = int(number) if key in INTEGER_PARAMETERS else number
    if "shrink" in values and "rate" in values:
        raise ConfigError(f"server {name}: give shrink or rate, not both (the shrink is calibrated for the rate)")
    return ServerSpec(name, **values)


__all__ = ["DEFAULT_BINS", "PARAMETERS", "SERVERS", "ServerSpec", "parse_server"]
