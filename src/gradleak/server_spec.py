"""The ``--server`` spec, parsed without torch (the config checks it when it is given):

    honest                                the global model as it is
    imprint[:bins=N,mean=M,std=S,gain=G]  Robbing the Fed's imprint block in front of it

models/server.py builds the model a spec names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .catalog import SERVERS, unknown
from .errors import ConfigError
from .paths import one_line

DEFAULT_BINS = 64


@dataclass(frozen=True)
class ServerSpec:
    name: str = "honest"
    bins: int | None = None
    mean: float | None = None
    std: float | None = None
    gain: float | None = None


def parse_server(text: str | None) -> ServerSpec:
    """``honest`` | ``imprint[:bins=N][,mean=M][,std=S][,gain=G]`` (``imprint:N`` = bins N);
    ConfigError naming the problem otherwise."""
    raw = (text or "honest").strip()
    name, _, params = raw.partition(":")
    name = name.strip().lower()
    if name not in SERVERS:
        raise unknown("server", name, SERVERS, " (e.g. imprint:bins=64)")
    if name == "honest":
        if params.strip():
            raise ConfigError("server honest takes no parameters")
        return ServerSpec()
    values: dict[str, float] = {}
    for i, part in enumerate(p.strip() for p in params.split(",") if params.strip()):
        key, eq, value = part.partition("=")
        if not eq:
            if i:
                raise ConfigError(f"server imprint: {one_line(repr(part), 80)} is not key=value")
            key, value = "bins", part
        key = key.strip()
        if key not in ("bins", "mean", "std", "gain") or key in values:
            raise ConfigError(f"server imprint: unknown or repeated parameter {one_line(repr(key), 80)} (bins, mean, std, gain)")
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"server imprint: {key} must be a number, got {one_line(repr(value.strip()), 80)}") from None
        if not math.isfinite(number):
            raise ConfigError(f"server imprint: {key} must be finite, got {one_line(repr(value.strip()), 80)}")
        values[key] = number
    bins = values.get("bins")
    if bins is not None and bins != int(bins):
        raise ConfigError(f"server imprint: bins must be an integer, got {bins:g}")
    return ServerSpec("imprint", None if bins is None else int(bins), values.get("mean"), values.get("std"),
                      values.get("gain"))


__all__ = ["DEFAULT_BINS", "SERVERS", "ServerSpec", "parse_server"]
