"""What the server sends the client (``--server``): the honest global model, or a malicious
server's modification of it."""

from __future__ import annotations

from ..server_spec import DEFAULT_BINS, SERVERS, ServerSpec, parse_server
from .imprint import IMPRINT_GAIN, default_brightness_prior, imprint_model
from .spec import ModelSpec
from .trap import DEFAULT_RATE, DEFAULT_SEED, TRAP_GAIN, calibrate_shrink, default_rows, trap_model

# The honest server, declared like the malicious ones (imprint.py, trap.py) for the catalog.
SERVER_SPEC = {"name": "honest", "summary": "the global model as it is (the default)", "example": "honest"}


def server_model(spec: ModelSpec, server: str | None) -> ModelSpec:
    """The model the client receives from ``server`` (``spec`` itself for an honest server).
    Its kwargs record the canonical server text, every value resolved."""
    s = parse_server(server)
    if s.name == "honest":
        return spec
    if s.name == "trap":
        shrink = s.shrink if s.shrink is not None else calibrate_shrink(
            spec.input_shape, DEFAULT_RATE if s.rate is None else s.rate)
        return trap_model(spec, rows=default_rows(spec.input_shape) if s.rows is None else s.rows, shrink=shrink,
                          seed=DEFAULT_SEED if s.seed is None else s.seed,
                          gain=TRAP_GAIN if s.gain is None else s.gain)
    mean, std = default_brightness_prior(spec)
    bins = DEFAULT_BINS if s.bins is None else s.bins
    mean = mean if s.mean is None else s.mean
    std = std if s.std is None else s.std
    gain = IMPRINT_GAIN if s.gain is None else s.gain
    return imprint_model(spec, bins=bins, mean=mean, std=std, gain=gain)  # kwargs: the canonical text


__all__ = ["DEFAULT_BINS", "SERVERS", "ServerSpec", "parse_server", "server_model"]
