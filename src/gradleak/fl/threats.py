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
from .client import BNStatisticsRecorder, check_batch_fits, fedsgd, trainable_parameters
from .unroll import local_sgd, mean_over_steps, step_assignment
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

    MAX_LOCAL_STEPS = 10_000  # the bounds of the CLI's own flags
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
        if self.name == "aggregate":
            rec.update(clients=self.clients, inner=self.inner, client_batch_size=batch_size)
        return rec

    @staticmethod
    def from_record(rec: dict[str, Any]) -> "ThreatModel":
        if not isinstance(rec, dict):
            raise ConfigError("threat record is not an object")
        known = {"name", "local_steps", "local_batch_size", "local_lr", "clients", "inner", "client_batch_size"}
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
        try:
            local_lr = rec.get("local_lr", 0.01)
            if isinstance(local_lr, bool) or not isinstance(local_lr, (int, float)):
                raise ConfigError("threat record field 'local_lr' is not a number")
            return ThreatModel(name=str(rec.get("name", "fedsgd")), local_steps=integer("local_steps", 1),
                               local_batch_size=integer("local_batch_size", None), local_lr=float(local_lr),
                               clients=integer("clients", 1), inner=str(rec.get("inner", "fedsgd")))
        except (TypeError, ValueError, OverflowError) as exc:
            raise ConfigError(f"threat record is invalid: {exc}") from None


def fedavg(model: ModelSpec, batch: Batch, threat: ThreatModel, *, private_seed: int,
           share_bn_statistics: bool = False) -> SharedUpdate:
    """FedAvg client: ``threat.local_steps`` SGD steps (lr ``threat.local_lr``) over ``batch`` in
    mini-batches of ``threat.local_batch_size``; shares W_S - W_0 for every trainable parameter.

    The step order comes from ``private_seed`` and is not recorded. With ``share_bn_statistics``
    the client also shares each BN layer's statistics over its whole local data (mean of the
    per-step batch means and variances), the quantity global BN updates average.
    """
    check_batch_fits(model, batch)
    module = model.module
    global_weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
    params = {n: p.detach().clone() for n, p in trainable_parameters(module).items()}
    buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
    steps = threat.local_schedule(batch.size, private_seed)
    first = next(iter(params.values()))  # the batch goes where the model's parameters are
    x_all = model.normalize(batch.images.to(first.device, first.dtype))
    labels_all = batch.labels.to(first.device)
    was_training = module.training
    module.train()
    try:
        with BNStatisticsRecorder(module) as rec:
            def loss(live: dict[str, torch.Tensor], x: torch.Tensor,
                     labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
                logits = functional_call(module, (live, buffers), (x,))  # the BN hooks record this step
                return F.cross_entropy(logits, labels), {n: (m.detach(), v.detach()) for n, (m, v) in rec.stats.items()}
            # McMahan et al. 2017, Algorithm 1 (ClientUpdate): W <- W - eta * grad L(W; b) per step.
            run = local_sgd(params, loss, (x_all, labels_all), steps, threat.local_lr, mode="client", has_aux=True)
    finally:
        module.train(was_training)
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
