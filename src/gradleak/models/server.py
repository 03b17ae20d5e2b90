"""What the server sends the client (``--server``): the honest global model, or a malicious
server's modification of it, built by the builder its SERVER_SPEC names (imprint.py, trap.py)."""

from __future__ import annotations

import importlib

from ..server_spec import SERVERS, ServerSpec, parse_server
from ..specs import declarations
from .imprint import DEFAULT_BINS
from .spec import ModelSpec

# The honest server, declared like the malicious ones (imprint.py, trap.py) for the catalog; it
# declares no builder: the client receives the global model as it is.
SERVER_SPEC = {"name": "honest", "summary": "the global model as it is (the default)", "example": "honest"}


def server_model(spec: ModelSpec, server: str | None) -> ModelSpec:
    """The model the client receives from ``server`` (``spec`` itself for a server that declares
    no builder: the honest one). The builder's kwargs record the canonical server text, every
    value resolved."""
    s = parse_server(server)
    declared = declarations("server")[s.name]
    if declared.get("build") is None:
        return spec
    build = getattr(importlib.import_module(declared.module), declared.get("build"))
    return build(spec, **s.params)


__all__ = ["DEFAULT_BINS", "SERVERS", "ServerSpec", "parse_server", "server_model"]
