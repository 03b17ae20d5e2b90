"""The example federation's settings (``gradleak audit-flower``), importable without torch or
Flower, so that a bad flag is answered before either is loaded."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import ConfigError, GradleakError

# fl.optim.OPTIMIZERS and fl.augment.AUGMENTS (which import torch; tests/audit pins them equal)
OPTIMIZERS = ("sgd", "adam", "adamw")
AUGMENTS = ("none", "flip", "crop-flip")


@dataclass
class FederationSettings:
    """The example federation. Everything here is plain data (it travels to the client actors)."""

    rounds: int = 3
    clients: int = 3
    examples: int = 1            # images per client per round (the batch the attack faces)
    # The clients' local training (torch.optim, announced in the train config; fl.optim's meanings):
    # ``local_epochs`` epochs over the ``examples`` in mini-batches of ``batch_size``, or, when
    # given, ``local_steps`` steps instead; SGD with momentum 0.9 and weight decay 5e-4 by default.
    local_steps: int | None = None
    local_epochs: int = 2
    batch_size: int | None = None   # local mini-batch size (default: all ``examples``)
    lr: float = 0.01
    optimizer: str = "sgd"
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 5e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    augment: str = "none"
    crop_padding: int = 4
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
    MAX_LOCAL_EPOCHS = 1000
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
        if self.local_steps is not None:
            self._int("local_steps", 1, self.MAX_LOCAL_STEPS)
        else:
            self._int("local_epochs", 1, self.MAX_LOCAL_EPOCHS)
        if self.batch_size is not None:
            self._int("batch_size", 1, self.examples, "--examples, the images a client trains on")
        self._positive("lr")
        self._local_optimizer(full=with_defenses)
        if self.steps > self.MAX_LOCAL_STEPS:
            raise ConfigError(f"audit-flower: --local-epochs {self.local_epochs} over {self.examples} examples in "
                              f"mini-batches of {self.batch_size or self.examples} are {self.steps} local steps, more "
                              f"than {self.MAX_LOCAL_STEPS}")
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

    @property
    def steps(self) -> int:
        """The local steps a client takes: ``local_steps``, else E x ceil(examples / batch_size)."""
        if self.local_steps is not None:
            return self.local_steps
        return self.local_epochs * math.ceil(self.examples / (self.batch_size or self.examples))

    def train_config(self) -> dict[str, object]:
        """What the server announces to the clients in the train ConfigRecord (the keys of
        audit.FedAvgKeys): the local training they run, which the auditor reads back."""
        cfg: dict[str, object] = {"lr": float(self.lr), "local-steps": int(self.steps),
                                  "batch-size": int(self.batch_size or self.examples), "optimizer": self.optimizer,
                                  "weight-decay": float(self.weight_decay), "augment": self.augment}
        if self.local_steps is None:
            cfg["local-epochs"] = int(self.local_epochs)
        if self.optimizer == "sgd":
            cfg.update({"momentum": float(self.momentum), "nesterov": bool(self.nesterov)})
        else:
            cfg.update({"betas": [float(b) for b in self.betas], "eps": float(self.eps)})
        if self.augment == "crop-flip":
            cfg["crop-padding"] = int(self.crop_padding)
        return cfg

    def _local_optimizer(self, *, full: bool) -> None:
        """The optimizer's and augmentation's flags: names, types and the flags that do not apply
        without torch; ``full``: their ranges too, as `gradleak share` checks them
        (fl.optim.LocalOptimizer, which imports torch)."""
        names = {"optimizer": "--local-optimizer", "momentum": "--local-momentum", "nesterov": "--local-nesterov",
                 "weight_decay": "--local-weight-decay", "betas": "--local-betas", "eps": "--local-eps",
                 "augment": "--local-augment", "crop_padding": "--local-crop-padding"}
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"audit-flower: --local-optimizer must be one of {', '.join(OPTIMIZERS)} "
                              f"(got {self.optimizer!r})")
        if self.augment not in AUGMENTS:
            raise ConfigError(f"audit-flower: --local-augment must be one of {', '.join(AUGMENTS)} "
                              f"(got {self.augment!r})")
        self._int("crop_padding", 0, 64, flag="--local-crop-padding")
        for name in ("momentum", "weight_decay", "eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"audit-flower: {names[name]} must be a finite number (got {value!r})")
        if self.optimizer != "sgd" and (self.momentum or self.nesterov):
            raise ConfigError(f"audit-flower: --local-momentum and --local-nesterov apply to --local-optimizer sgd, "
                              f"not {self.optimizer} (give --local-momentum 0)")
        if self.optimizer == "sgd" and tuple(self.betas) != (0.9, 0.999):
            raise ConfigError("audit-flower: --local-betas applies to --local-optimizer adam or adamw, not sgd")
        if not full:
            return
        from ..fl.optim import LocalOptimizer

        try:
            LocalOptimizer(self.optimizer, lr=float(self.lr), momentum=float(self.momentum),
                           nesterov=bool(self.nesterov), weight_decay=float(self.weight_decay),
                           betas=tuple(float(b) for b in self.betas), eps=float(self.eps))  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"audit-flower: --local-betas must be two numbers (got {self.betas!r}): {exc}") from None
        except ConfigError as exc:   # LocalOptimizer's sentence, with the flag's name
            text = str(exc)
            for name, flag in names.items():
                text = text.replace(f"local_{name}", flag)
            raise ConfigError(f"audit-flower: {text}") from None

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
