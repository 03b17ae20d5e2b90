"""One local-training unroll: the FedAvg client's local steps, and the attacker's simulation of them."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

import torch

from .optim import LocalOptimizer, sgd

Mode = Literal["client", "graph", "func"]
MODES: tuple[str, ...] = ("client", "graph", "func")

# loss(params, *mini_batch) -> scalar loss, or (loss, aux) with has_aux; mini_batch is each of
# ``data`` indexed by the step's sample indices.
StepLoss = Callable[..., Any]
BNStats = list[tuple[torch.Tensor, torch.Tensor]]
# transform(mini_batch) -> mini_batch: what the client does to a step's data before the loss
Transform = Callable[[list[torch.Tensor]], list[torch.Tensor]]


def step_assignment(k: int, local_batch_size: int, steps: int, generator: torch.Generator | None) -> list[torch.Tensor]:
    """Indices of the samples used in each local step: epochs over the K samples in mini-batches
    of B (the last one of an epoch may be smaller), reshuffled each epoch with ``generator``
    (None: the fixed order 0..K-1 every epoch, which is what an attacker who does not know the
    client's shuffling assumes)."""
    out: list[torch.Tensor] = []
    while len(out) < steps:
        order = torch.randperm(k, generator=generator) if generator is not None else torch.arange(k)
        for start in range(0, k, local_batch_size):
            out.append(order[start:start + local_batch_size])
            if len(out) == steps:
                break
    return out


@dataclass
class Unrolled:
    """The result of :func:`local_sgd`: W_0 (``start``), W_S (``params``), each step's loss
    (detached) and each step's auxiliary output of the loss (``has_aux``; else None)."""

    start: dict[str, torch.Tensor]
    params: dict[str, torch.Tensor]
    losses: list[torch.Tensor] = field(default_factory=list)
    aux: list[Any] = field(default_factory=list)

    def update(self, names: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
        """Delta = W_S - W_0 by parameter name (``names``: which ones, in that order; default all)."""
        return {n: self.params[n] - self.start[n] for n in (self.params if names is None else names)}

    @property
    def mean_loss(self) -> float:
        """The mean of the steps' losses (the client's UpdateMeta.loss)."""
        losses = [float(v) for v in self.losses]
        return sum(losses) / len(losses)


def local_sgd(params: dict[str, torch.Tensor], loss: StepLoss, data: Sequence[torch.Tensor],
              steps: Sequence[torch.Tensor], lr: float, *, mode: Mode, has_aux: bool = False) -> Unrolled:
    """Unroll plain local SGD, W_s = W_{s-1} - lr * grad L(W_{s-1}; I_s): :func:`local_train`
    with ``LocalOptimizer("sgd", lr)``."""
    return local_train(params, loss, data, steps, sgd(lr), mode=mode, has_aux=has_aux)


def local_train(params: dict[str, torch.Tensor], loss: StepLoss, data: Sequence[torch.Tensor],
                steps: Sequence[torch.Tensor], optimizer: LocalOptimizer, *, mode: Mode, has_aux: bool = False,
                transform: Transform | None = None) -> Unrolled:
    """Unroll the local steps: step s calls ``loss(W_{s-1}, *batch_s)`` with batch_s the
    ``data`` indexed by ``steps[s]`` = I_s (then ``transform(batch_s)``: the client's private
    augmentation), and moves W by ``optimizer`` (fl.optim: torch.optim's SGD, Adam, AdamW).

    ``params`` (W_0, by name) is not modified: "client" takes each step's gradient w.r.t.
    detached copies, "graph" w.r.t. the given tensors themselves (they, or what they depend on,
    must require grad), "func" w.r.t. the first argument of the loss via torch.func. The
    optimizer's state (momentum buffers, Adam's moments) is carried the same way."""
    if mode not in MODES:
        raise ValueError(f"local_train mode {mode!r}; known: {', '.join(MODES)}")
    p = dict(params)
    out = Unrolled(start=dict(params), params=p)
    state = optimizer.init(p)
    step_grad = torch.func.grad_and_value(loss, has_aux=has_aux) if mode == "func" else None
    with torch.enable_grad() if mode != "func" else nullcontext():
        for t, idx in enumerate(steps, start=1):
            batch = [d[idx] for d in data]
            if transform is not None:
                batch = transform(batch)
            if step_grad is not None:
                grads, value = step_grad(p, *batch)
            else:
                if mode == "client":
                    p = {n: w.detach().requires_grad_(True) for n, w in p.items()}
                value = loss(p, *batch)
                g = torch.autograd.grad(value[0] if has_aux else value, list(p.values()),
                                        create_graph=mode == "graph")
                grads = dict(zip(p, g, strict=True))
            step_loss, aux = value if has_aux else (value, None)
            p, state = optimizer.step(p, grads, state, t)
            if mode == "client":
                p = {n: w.detach() for n, w in p.items()}
                state = {n: {k: v.detach() for k, v in s.items()} for n, s in state.items()}
            out.losses.append(step_loss.detach())
            out.aux.append(aux)
    out.params = p
    return out


def mean_over_steps(per_step: Sequence[BNStats]) -> BNStats:
    """Per BatchNorm layer, the mean over the local steps of that step's batch mean and variance:
    the BN statistics a FedAvg client shares over its whole local data (what global BN updates
    average). ``per_step``: one list of (mean [C], var [C]) per step, layers in the same order."""
    if not per_step or not per_step[0]:
        return []
    return [(torch.stack([s[i][0] for s in per_step]).mean(0), torch.stack([s[i][1] for s in per_step]).mean(0))
            for i in range(len(per_step[0]))]


__all__ = ["MODES", "Unrolled", "local_sgd", "local_train", "mean_over_steps", "step_assignment"]
