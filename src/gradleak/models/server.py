"""What the server sends the client (``--server``): the honest global model, or a malicious
server's modification of it.

    honest                                the global model as it is
    imprint[:bins=N,mean=M,std=S,gain=G]  Robbing the Fed's imprint block in front of it
                                          (models/imprint.py; default 64 bins, the public
                                          brightness prior, gain 100)

The modified model is recorded in the update's ``model_kwargs["server"]`` as its canonical text,
every value resolved, so the attacker (and a file's reader) rebuilds the same architecture.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError
from .imprint import IMPRINT_GAIN, default_brightness_prior, imprint_model
from .registry import ModelSpec

SERVERS = ("honest", "imprint")
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
        raise ConfigError(f"unknown server {name!r}; known: {', '.join(SERVERS)} (e.g. imprint:bins=64)")
    if name == "honest":
        if params.strip():
            raise ConfigError("server honest takes no parameters")
        return ServerSpec()
    values: dict[str, float] = {}
    for i, part in enumerate(p.strip() for p in params.split(",") if params.strip()):
        key, eq, value = part.partition("=")
        if not eq:
            if i:
                raise ConfigError(f"server imprint: {part!r} is not key=value")
            key, value = "bins", part
        key = key.strip()
        if key not in ("bins", "mean", "std", "gain") or key in values:
            raise ConfigError(f"server imprint: unknown or repeated parameter {key!r} (bins, mean, std, gain)")
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"server imprint: {key} must be a number, got {value.strip()!r}") from None
        if not math.isfinite(number):
            raise ConfigError(f"server imprint: {key} must be finite, got {value.strip()!r}")
        values[key] = number
    bins = values.get("bins")
    if bins is not None and bins != int(bins):
        raise ConfigError(f"server imprint: bins must be an integer, got {bins:g}")
    return ServerSpec("imprint", None if bins is None else int(bins), values.get("mean"), values.get("std"),
                      values.get("gain"))


def server_model(spec: ModelSpec, server: str | None) -> ModelSpec:
    """The model the client receives from ``server`` (``spec`` itself for an honest server).
    Its kwargs record the canonical server text, every value resolved."""
    s = parse_server(server)
    if s.name == "honest":
        return spec
    mean, std = default_brightness_prior(spec)
    bins = DEFAULT_BINS if s.bins is None else s.bins
    mean = mean if s.mean is None else s.mean
    std = std if s.std is None else s.std
    gain = IMPRINT_GAIN if s.gain is None else s.gain
    return imprint_model(spec, bins=bins, mean=mean, std=std, gain=gain)  # kwargs: the canonical text


__all__ = ["DEFAULT_BINS", "SERVERS", "ServerSpec", "parse_server", "server_model"]
