"""The example federation's settings (``gradleak audit-flower``), importable without torch or
Flower, so that a bad flag is answered before either is loaded."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import ConfigError, GradleakError


@dataclass
class FederationSettings:
    """The example federation. Everything here is plain data (it travels to the client actors)."""

    rounds: int = 3
    clients: int = 3
    examples: int = 1            # images per client per round (the batch the attack faces)
    local_steps: int = 1
    batch_size: int | None = None   # local mini-batch size (default: all ``examples``)
    lr: float = 0.01
    model: str = "lenet-dlg"
    width: int | None = None
    # What the server sends the clients (gradleak.server_spec): the example's global model as it
    # is, or a malicious server's block in front of it (models.server.server_model); the server,
    # the clients and the auditor build the same architecture from it.
    server: str = "honest"
    image_size: int = 28
    data: str = "fashion-mnist"
    data_root: str | None = None
    seed: int = 0
    defense: list[str] = field(default_factory=list)
    client_cpus: float = 1.0
    ray_cpus: int | None = None     # CPUs of the local Ray instance (default: min(clients, available))
    verbose: bool = False

    # Bounds of the flags (those shared with `gradleak attack` are AttackConfig's): beyond them a
    # run cannot work (an image of 0 pixels, a seed torch cannot take) or is not an example any more.
    MAX_ROUNDS = 10_000
    MAX_CLIENTS = 1024
    MAX_EXAMPLES = 4096
    MAX_LOCAL_STEPS = 10_000
    MAX_SEED = 2**32 - 1

    def check(self, *, with_defenses: bool = True) -> None:
        """Refuse settings the federation cannot run with: one ConfigError naming the flag,
        raised before anything starts (no data read, no Ray, no output). ``with_defenses``:
        False leaves the defense specs (whose parser imports torch) to a later call."""
        self._int("rounds", 1, self.MAX_ROUNDS)
        if isinstance(self.clients, int) and not isinstance(self.clients, bool) and self.clients < 2:
            raise ConfigError(f"audit-flower: --clients must be >= 2 (FedAvg averages at least two clients; "
                              f"got {self.clients})")
        self._int("clients", 2, self.MAX_CLIENTS)
        self._int("examples", 1, self.MAX_EXAMPLES)
        self._int("local_steps", 1, self.MAX_LOCAL_STEPS)
        if self.batch_size is not None:
            self._int("batch_size", 1, self.examples, "--examples, the images a client trains on")
        self._positive("lr")
        self._int("image_size", 4, 1024)
        if self.width is not None:
            self._int("width", 1, 4096)
        self._int("seed", 0, self.MAX_SEED)
        self._server()
        self._positive("client_cpus", flag="client_cpus")
        if self.ray_cpus is not None:
            self._int("ray_cpus", 1, 4096, flag="ray_cpus")
        if self.defense and with_defenses:
            from ..defenses import parse_defenses

            if any(d.client_side for d in parse_defenses(self.defense)):
                raise ConfigError("audit-flower: client-side defenses (dpsgd) act on FedSGD gradients; the example "
                                  "clients run FedAvg, so use update-level defenses (gaussian, prune, quantize)")

    def _server(self) -> None:
        """The --server spec, parsed without torch (its values' ranges are the model builder's,
        checked when the federation builds its model, before Ray starts)."""
        from ..server_spec import parse_server

        if not isinstance(self.server, str):
            raise ConfigError(f"audit-flower: --server must be a server spec (got {self.server!r})")
        try:
            parse_server(self.server)
        except GradleakError as exc:   # ConfigError, or an unknown name (with the names known)
            raise ConfigError(f"audit-flower: --server: {exc}") from None

    def _int(self, name: str, lo: int, hi: int, hi_is: str | None = None, *, flag: str | None = None) -> None:
        value = getattr(self, name)
        flag = flag or "--" + name.replace("_", "-")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"audit-flower: {flag} must be an integer (got {value!r})")
        if not lo <= value <= hi:
            upper = f"{hi} ({hi_is})" if hi_is else str(hi)
            raise ConfigError(f"audit-flower: {flag} must be in {lo}..{upper} (got {value})")

    def _positive(self, name: str, *, flag: str | None = None) -> None:
        value = getattr(self, name)
        flag = flag or "--" + name.replace("_", "-")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            raise ConfigError(f"audit-flower: {flag} must be a positive finite number (got {value!r})")


def check_attack_server(attack: str, server: str) -> None:
    """Refuse an attack that reads a malicious server's block (an attack named after a server:
    ``imprint``, ``trap``) on a federation whose server sends none, or another: it would fail on
    every update. Torch-free; ``server`` already parsed by :meth:`FederationSettings.check`."""
    from ..catalog import SERVERS
    from ..server_spec import parse_server

    name = str(attack).strip().lower()
    if name in SERVERS and name != "honest":
        sent = parse_server(server).name
        if sent != name:
            raise ConfigError(f"audit-flower: --attack {name} reads the {name} block a malicious server puts in front "
                              f"of the model, and --server {sent} sends none: add --server {name}")


__all__ = ["FederationSettings", "check_attack_server"]
