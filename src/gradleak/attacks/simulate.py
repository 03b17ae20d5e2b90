"""The attacker's simulation of the threat model: dummy inputs -> the update they would produce.

- fedsgd:    the model's gradient (DummyGradient).
- fedavg:    the client's local SGD steps unrolled functionally (torch.func.functional_call), with
             the graph kept through every step, so the weight difference W_S - W_0 can be matched
             and differentiated w.r.t. the dummy images (as in Geiping et al. 2020, Sec. 5).
- aggregate: the mean of N clients' simulated updates, the dummy batch split evenly in order.

The attacker knows the public hyper-parameters (steps, mini-batch size, learning rate, number of
clients) but not the client's shuffling: it assumes the fixed order 0..K-1 each epoch. Dummy slots
are interchangeable, so within one epoch that assumption loses nothing; across epochs it is an
approximation.
"""

from __future__ import annotations

import torch

from ..fl.threats import ThreatModel, step_assignment
from ..fl.update import SharedUpdate
from ..models import ModelSpec
from .victim import DummyGradient


class UpdateSimulator:
    """Callable (x [K, C, H, W] normalised, labels [K] or soft [K, N]) -> list of tensors in the
    order of ``names``, comparable with ``target`` (the shared update)."""

    def __init__(self, model: ModelSpec, update: SharedUpdate, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        self.gradient = DummyGradient(model, update, dtype=dtype, device=device)
        self.threat = ThreatModel.from_record(update.meta.threat)
        self.names, self.target = self.gradient.names, self.gradient.target
        self.batch_size = update.meta.batch_size
        self.clients = self.threat.clients if self.threat.name == "aggregate" else 1
        self.client_batch = self.batch_size // self.clients
        if self.threat.client_threat == "fedavg":
            b = self.threat.local_batch_size or self.client_batch
            self.steps = step_assignment(self.client_batch, b, self.threat.local_steps, None)

    @property
    def is_fedsgd(self) -> bool:
        return self.threat.client_threat == "fedsgd" and self.clients == 1

    def _client(self, x: torch.Tensor, labels: torch.Tensor, create_graph: bool) -> list[torch.Tensor]:
        if self.threat.client_threat == "fedsgd":
            return self.gradient(x, labels, create_graph=create_graph)
        g = self.gradient
        start = g.params
        params = dict(start)
        for idx in self.steps:
            buffers = {n: b.clone() for n, b in g.buffers.items()}
            logits = torch.func.functional_call(g.module, (params, buffers), (x[idx],))
            loss = DummyGradient.loss(logits, labels[idx])
            grads = torch.autograd.grad(loss, list(params.values()), create_graph=True)
            params = {n: p - self.threat.local_lr * d for (n, p), d in zip(params.items(), grads)}
        return [params[n] - start[n] for n in self.names]

    def __call__(self, x: torch.Tensor, labels: torch.Tensor, *, create_graph: bool = True) -> list[torch.Tensor]:
        if self.clients == 1:
            return self._client(x, labels, create_graph)
        k = self.client_batch
        parts = [self._client(x[i * k:(i + 1) * k], labels[i * k:(i + 1) * k], create_graph)
                 for i in range(self.clients)]
        return [sum(p[j] for p in parts) / self.clients for j in range(len(self.names))]


def label_evidence(update: SharedUpdate, classifier_name: str) -> torch.Tensor:
    """The classifier-weight tensor whose signs label restoration reads, [N, M], shaped like a
    gradient: the gradient itself for FedSGD, and -(W_S - W_0) for FedAvg (the local steps move
    the weights against the summed gradients, so the signs match a sum of gradients)."""
    key = f"{classifier_name}.weight" if classifier_name else "weight"
    t = update.gradients[key]
    threat = ThreatModel.from_record(update.meta.threat)
    return -t if threat.client_threat == "fedavg" else t
