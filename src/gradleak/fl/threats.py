"""Threat models: what a client (or the server's view of several clients) really shares."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.func import functional_call

from ..data.batch import Batch
from ..errors import ConfigError
from ..models import ModelSpec
from .augment import AUGMENTS, augment, check_augment
from .client import BNStatisticsRecorder, check_batch_fits, fedsgd, trainable_parameters
from .optim import OPTIMIZERS, LocalOptimizer
from .unroll import Unrolled, local_train, mean_over_steps, step_assignment
from .update import SharedUpdate, UpdateMeta

THREATS = ("fedsgd", "fedavg", "aggregate")


@dataclass(frozen=True)
class ThreatModel:
    """Public hyper-parameters of what is shared (known to the server, hence to the attacker)."""

    name: str = "fedsgd"
    local_steps: int = 1
    local_batch_size: int | None = None   # None: the whole client batch per step
    local_lr: float = 0.01
    clients: int = 1                      # aggregate: how many clients are averaged
    inner: str = "fedsgd"                 # aggregate: what each client runs
    # fedavg: the client's local training as torch.optim runs it (fl.optim); absent from a record
    # (update files of before): plain SGD, no epochs declared, no augmentation
    local_epochs: int | None = None       # epochs over the K samples; local_steps is then E * ceil(K / B)
    local_optimizer: str = "sgd"
    local_momentum: float = 0.0
    local_nesterov: bool = False
    local_weight_decay: float = 0.0
    local_betas: tuple[float, float] = (0.9, 0.999)
    local_eps: float = 1e-8
    local_augment: str = "none"           # none | flip | crop-flip (fl.augment)
    local_crop_padding: int = 4

    def __post_init__(self) -> None:
        if self.name not in THREATS:
            raise ConfigError(f"threat: unknown {self.name!r}; known: {', '.join(THREATS)}")
        if self.inner not in ("fedsgd", "fedavg"):
            raise ConfigError("threat inner: each aggregated client runs fedsgd or fedavg")
        if self.local_steps < 1 or (self.local_batch_size is not None and self.local_batch_size < 1):
            raise ConfigError("local_steps and local_batch_size must be >= 1")
        if not (self.local_lr > 0 and math.isfinite(self.local_lr)):
            raise ConfigError("local_lr must be a positive number")
        if self.clients < 1:
            raise ConfigError("clients must be >= 1")
        if self.local_epochs is not None and not 1 <= self.local_epochs <= self.MAX_LOCAL_EPOCHS:
            raise ConfigError(f"local_epochs {self.local_epochs} is not in 1..{self.MAX_LOCAL_EPOCHS}")
        self.optimizer  # noqa: B018 - validates the optimizer's constants
        check_augment(self.local_augment, self.local_crop_padding)

    MAX_LOCAL_STEPS = 10_000  # the bounds of the CLI's own flags
    MAX_LOCAL_EPOCHS = 1000
    MAX_CLIENTS = 1024

    def check_batch(self, batch_size: int, client_batch_size: int | None = None) -> None:
        """Refuse a threat that cannot have produced an update over ``batch_size`` samples (all
        clients together): absurd step or client counts, clients without a sample, local
        mini-batches larger than a client's data. Raises ConfigError."""
        if self.local_steps > self.MAX_LOCAL_STEPS:
            raise ConfigError(f"local_steps {self.local_steps} is more than {self.MAX_LOCAL_STEPS}")
        if self.clients > self.MAX_CLIENTS:
            raise ConfigError(f"clients {self.clients} is more than {self.MAX_CLIENTS}")
        if self.clients > batch_size or batch_size % self.clients:
            raise ConfigError(f"a batch of {batch_size} cannot be split evenly over {self.clients} clients")
        per_client = batch_size // self.clients
        if client_batch_size is not None and client_batch_size != per_client:
            raise ConfigError(f"client_batch_size {client_batch_size} is not {batch_size} / {self.clients} clients")
        if self.local_batch_size is not None and self.local_batch_size > per_client:
            raise ConfigError(f"local_batch_size {self.local_batch_size} is larger than a client's {per_client} samples")
        if self.local_epochs is not None:
            steps = self.epoch_steps(per_client, self.local_batch_size, self.local_epochs)
            if steps != self.local_steps:
                raise ConfigError(f"local_epochs {self.local_epochs} over {per_client} samples in mini-batches of "
                                  f"{self.local_batch_size or per_client} are {steps} steps, not local_steps "
                                  f"{self.local_steps}")

    def check_one_gradient(self, attack: str) -> None:
        """The closed forms read a one-step FedAvg update as -lr * g. That holds for plain SGD
        (with or without momentum: torch's first step's buffer is g itself), not for weight decay
        (g + wd * w0), Nesterov ((1 + momentum) * g) or Adam/AdamW (about -lr * sign(g), the
        gradient's magnitudes lost). ConfigError naming the attack otherwise."""
        if self.client_threat != "fedavg":
            return
        o = self.optimizer
        why = (f"--local-optimizer {o.name} steps by about lr * sign(g), not lr * g" if o.name != "sgd" else
               f"--local-weight-decay {o.weight_decay:g} adds wd * w0 to the gradient" if o.weight_decay else
               "--local-nesterov steps by (1 + momentum) * g" if o.nesterov else "")
        if why:
            raise ConfigError(f"{attack}: the closed form reads a one-step FedAvg update as -lr * g, and the client's "
                              f"{why}; use an optimisation attack (dlg, idlg, ig, gradinversion), which models the "
                              "client's optimizer")

    @staticmethod
    def epoch_steps(k: int, local_batch_size: int | None, epochs: int) -> int:
        """The local steps of ``epochs`` epochs over k samples in mini-batches of B (default k)."""
        return epochs * math.ceil(k / (local_batch_size or k))

    @property
    def optimizer(self) -> LocalOptimizer:
        """The client's local optimizer (validated)."""
        return LocalOptimizer(self.local_optimizer, lr=self.local_lr, momentum=self.local_momentum,
                              nesterov=self.local_nesterov, weight_decay=self.local_weight_decay,
                              betas=tuple(self.local_betas), eps=self.local_eps)

    def client_model(self, k: int) -> str:
        """How completely an attacker who knows this record models a client over ``k`` samples:
        "exact", or what it cannot know, each making its answer a lower bound. The private
        order matters only across epochs of several mini-batches (within one epoch any fixed
        order is the true one up to which dummy plays which sample); the augmentation draws
        always do."""
        if self.client_threat != "fedavg":
            return "exact"
        missing = []
        b = self.local_batch_size or k
        if b < k and self.local_steps > math.ceil(k / b):
            missing.append("order unknown")
        if self.local_augment != "none":
            missing.append("augmentation unknown")
        return "exact" if not missing else ", ".join(missing) + ": lower bound"

    def local_schedule(self, k: int, private_seed: int | None) -> list[torch.Tensor]:
        """The sample indices of each of a FedAvg client's ``local_steps`` steps over its ``k``
        samples, in mini-batches of ``local_batch_size`` (default all k): shuffled each epoch from
        the client's ``private_seed``, or (None) the fixed order 0..k-1 the attacker assumes."""
        # torch takes seeds below 2**64; the derived private seeds (seed * 100_003 + 17, + 7919 per
        # client) of a large --seed are reduced to that range (smaller ones are unchanged)
        generator = torch.Generator().manual_seed(private_seed % 2**64) if private_seed is not None else None
        return step_assignment(k, self.local_batch_size or k, self.local_steps, generator)

    @property
    def client_threat(self) -> str:
        return self.inner if self.name == "aggregate" else self.name

    def record(self, batch_size: int) -> dict[str, Any]:
        """The public record stored in UpdateMeta.threat."""
        rec: dict[str, Any] = {"name": self.name}
        if self.client_threat == "fedavg":
            rec.update(local_steps=self.local_steps, local_batch_size=self.local_batch_size or batch_size,
                       local_lr=self.local_lr)
            if self.local_epochs is not None:
                rec["local_epochs"] = self.local_epochs
            optimizer = self.optimizer
            if not optimizer.is_plain_sgd or optimizer.nesterov:
                rec.update(optimizer.record())
            if self.local_augment != "none":
                rec["local_augment"] = self.local_augment
                if self.local_augment == "crop-flip":
                    rec["local_crop_padding"] = self.local_crop_padding
        if self.name == "aggregate":
            rec.update(clients=self.clients, inner=self.inner, client_batch_size=batch_size)
        return rec

    @staticmethod
    def from_record(rec: dict[str, Any]) -> "ThreatModel":
        if not isinstance(rec, dict):
            raise ConfigError("threat record is not an object")
        known = {"name", "local_steps", "local_batch_size", "local_lr", "clients", "inner", "client_batch_size",
                 "local_epochs", "local_optimizer", "local_momentum", "local_nesterov", "local_weight_decay",
                 "local_betas", "local_eps", "local_augment", "local_crop_padding"}
        unknown = sorted(set(rec) - known)
        if unknown:
            raise ConfigError(f"threat record has unknown field {unknown[0]!r}")

        def integer(key: str, default: int | None) -> int | None:
            v = rec.get(key, default)
            if v is None and default is None:
                return None
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"threat record field {key!r} is not an integer")
            return v
        def number(key: str, default: float) -> float:
            v = rec.get(key, default)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ConfigError(f"threat record field {key!r} is not a number")
            return float(v)

        def text(key: str, default: str, choices: tuple[str, ...]) -> str:
            v = rec.get(key, default)
            if not isinstance(v, str) or v not in choices:
                raise ConfigError(f"threat record field {key!r} is not one of {', '.join(choices)}")
            return v

        if not isinstance(rec.get("local_nesterov", False), bool):
            raise ConfigError("threat record field 'local_nesterov' is not true or false")
        betas = rec.get("local_betas", [0.9, 0.999])
        if not isinstance(betas, (list, tuple)) or len(betas) != 2 or \
                not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in betas):
            raise ConfigError("threat record field 'local_betas' is not two numbers")
        try:
            return ThreatModel(name=str(rec.get("name", "fedsgd")), local_steps=integer("local_steps", 1),
                               local_batch_size=integer("local_batch_size", None), local_lr=number("local_lr", 0.01),
                               clients=integer("clients", 1), inner=str(rec.get("inner", "fedsgd")),
                               local_epochs=integer("local_epochs", None),
                               local_optimizer=text("local_optimizer", "sgd", OPTIMIZERS),
                               local_momentum=number("local_momentum", 0.0),
                               local_nesterov=bool(rec.get("local_nesterov", False)),
                               local_weight_decay=number("local_weight_decay", 0.0),
                               local_betas=(float(betas[0]), float(betas[1])), local_eps=number("local_eps", 1e-8),
                               local_augment=text("local_augment", "none", AUGMENTS),
                               local_crop_padding=integer("local_crop_padding", 4))
        except (TypeError, ValueError, OverflowError) as exc:
            raise ConfigError(f"threat record is invalid: {exc}") from None


def client_model_of(record: dict[str, Any], batch_size: int) -> str:
    """ThreatModel.client_model for an update's record over ``batch_size`` samples (all clients):
    metrics.json's ``client_model``."""
    threat = ThreatModel.from_record(record)
    return threat.client_model(batch_size // threat.clients)


def augment_generator(private_seed: int) -> torch.Generator:
    """The client's private stream of augmentation draws (apart from its shuffling stream, so
    that turning augmentation on leaves the order unchanged)."""
    return torch.Generator().manual_seed((private_seed * 2 + 1) % 2**64)


def local_training(model: ModelSpec, batch: Batch, threat: ThreatModel, *,
                   private_seed: int) -> tuple[Unrolled, dict[str, torch.Tensor], list[torch.Tensor]]:
    """A FedAvg client's local training on ``batch``: ``threat.local_steps`` steps of
    ``threat.optimizer`` (torch.optim's SGD, Adam or AdamW, fl.optim) over mini-batches of
    ``threat.local_batch_size`` (epochs reshuffled from ``private_seed``), each mini-batch
    augmented privately (``threat.local_augment``), the model in training mode.

    Returns (the unroll: W_0, W_S, per-step losses and BN statistics; the buffers after training,
    BatchNorm running statistics updated in place as torch does; the private step order)."""
    check_batch_fits(model, batch)
    module = model.module
    params = {n: p.detach().clone() for n, p in trainable_parameters(module).items()}
    buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
    steps = threat.local_schedule(batch.size, private_seed)
    first = next(iter(params.values()))  # the batch goes where the model's parameters are
    images = batch.images.to(first.device, first.dtype)
    labels_all = batch.labels.to(first.device)
    transform = None
    if threat.local_augment != "none":
        generator = augment_generator(private_seed)

        def transform(mini: list[torch.Tensor]) -> list[torch.Tensor]:
            return [augment(mini[0], threat.local_augment, threat.local_crop_padding, generator), mini[1]]
    was_training = module.training
    module.train()
    try:
        with BNStatisticsRecorder(module) as rec:
            def loss(live: dict[str, torch.Tensor], x: torch.Tensor,
                     labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
                # functional_call updates ``buffers`` in place (BN running statistics, as module(x) does)
                logits = functional_call(module, (live, buffers), (model.normalize(x),))  # the BN hooks record this step
                return F.cross_entropy(logits, labels), {n: (m.detach(), v.detach()) for n, (m, v) in rec.stats.items()}
            # McMahan et al. 2017, Algorithm 1 (ClientUpdate), each step the optimizer's (fl.optim)
            run = local_train(params, loss, (images, labels_all), steps, threat.optimizer, mode="client",
                              has_aux=True, transform=transform)
    finally:
        module.train(was_training)
    return run, buffers, steps


def fedavg(model: ModelSpec, batch: Batch, threat: ThreatModel, *, private_seed: int,
           share_bn_statistics: bool = False) -> SharedUpdate:
    """FedAvg client: :func:`local_training`, then shares W_S - W_0 for every trainable parameter.

    The step order and the augmentation draws come from ``private_seed`` and are not recorded;
    the record says the optimizer, epochs, mini-batch size and augmentation policy (a server
    announces them). BatchNorm running statistics are not shared (UpdateMeta.bn_buffers_shared). With
    ``share_bn_statistics`` the client also shares each BN layer's statistics over its whole
    local data (mean of the per-step batch means and variances), the quantity global BN updates
    average.
    """
    global_weights = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    run, _, _ = local_training(model, batch, threat, private_seed=private_seed)
    bn_layers = list(run.aux[0]) if run.aux else []
    meta = UpdateMeta(model=model.name, num_classes=model.num_classes, input_shape=model.input_shape,
                      mean=model.mean, std=model.std, batch_size=batch.size, loss=run.mean_loss,
                      model_kwargs=dict(model.kwargs), threat=threat.record(batch.size),
                      bn_statistics_shared=share_bn_statistics and bool(bn_layers))
    bn: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    if share_bn_statistics:
        bn = dict(zip(bn_layers, mean_over_steps([[step[n] for n in bn_layers] for step in run.aux]), strict=True))
    return SharedUpdate(gradients=run.update(), global_weights=global_weights, meta=meta, bn_statistics=bn)


def client_share(model: ModelSpec, batch: Batch, threat: ThreatModel, *, private_seed: int = 0,
                 share_bn_statistics: bool = False) -> SharedUpdate:
    """One client's update under ``threat.client_threat``."""
    if threat.client_threat == "fedavg":
        return fedavg(model, batch, threat, private_seed=private_seed, share_bn_statistics=share_bn_statistics)
    up = fedsgd(model, batch, share_bn_statistics=share_bn_statistics)
    up.meta.threat = threat.record(batch.size) if threat.name != "aggregate" else up.meta.threat
    return up


def split_batch(batch: Batch, clients: int) -> list[Batch]:
    """Split one drawn batch of N*K samples into N client batches of K (in order)."""
    if batch.size % clients:
        raise ConfigError(f"a batch of {batch.size} cannot be split evenly over {clients} clients")
    k = batch.size // clients
    return [Batch(images=batch.images[i * k:(i + 1) * k], labels=batch.labels[i * k:(i + 1) * k],
                  names=batch.names[i * k:(i + 1) * k], source=batch.source, class_names=batch.class_names)
            for i in range(clients)]


def aggregate(updates: list[SharedUpdate], threat: ThreatModel) -> SharedUpdate:
    """The average of N clients' updates, as the server sees it under secure aggregation.
    Equal client batch sizes, so the plain mean is FedAvg's weighted mean. BN statistics, when
    shared, are averaged too (a global BN update sees only their mean)."""
    first = updates[0]
    n = len(updates)
    grads = {k: sum(u.gradients[k] for u in updates) / n for k in first.gradients}
    bn = {}
    if all(u.bn_statistics for u in updates):
        bn = {k: (sum(u.bn_statistics[k][0] for u in updates) / n, sum(u.bn_statistics[k][1] for u in updates) / n)
              for k in first.bn_statistics}
    meta = UpdateMeta(**{**first.meta.__dict__})
    meta.threat = threat.record(first.meta.batch_size)
    meta.batch_size = first.meta.batch_size * n
    meta.loss = sum(u.meta.loss for u in updates) / n
    meta.bn_statistics_shared = bool(bn)
    return SharedUpdate(gradients=grads, global_weights=first.global_weights, meta=meta, bn_statistics=bn)


ClientFn = Callable[[Batch, int], SharedUpdate]


def share(model: ModelSpec, batch: Batch, threat: ThreatModel, *, private_seed: int = 0,
          share_bn_statistics: bool = False, client_fn: ClientFn | None = None) -> SharedUpdate:
    """What the server receives for ``batch`` under ``threat`` (for ``aggregate``, ``batch`` holds
    all N clients' samples, split evenly in order: ``sample_batch(..., clients=N)`` draws them
    client by client, labels distinct within a client and free to repeat across clients).

    ``client_fn(batch, private_seed)`` computes one client's (possibly defended) update; by
    default :func:`client_share`. Defenses therefore act on each client before aggregation.
    """
    if client_fn is None:
        def client_fn(b: Batch, seed: int) -> SharedUpdate:
            return client_share(model, b, threat, private_seed=seed, share_bn_statistics=share_bn_statistics)
    if threat.name != "aggregate":
        return client_fn(batch, private_seed)
    parts = split_batch(batch, threat.clients)
    return aggregate([client_fn(part, private_seed + 7919 * i) for i, part in enumerate(parts)], threat)
