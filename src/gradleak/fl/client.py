"""Client side: compute what really leaves the device for one private batch."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from ..data.batch import Batch
from ..errors import ModelMismatchError
from ..models import ModelSpec
from .update import SharedUpdate, UpdateMeta


def trainable_parameters(module: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p for n, p in module.named_parameters() if p.requires_grad}


class BNStatisticsRecorder:
    """Forward hooks that record each BatchNorm layer's batch mean and (biased) variance of its
    input [B, C, ...] -> ([C], [C]); the statistics BN normalises with in training mode."""

    def __init__(self, module: nn.Module):
        self.stats: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._handles = []
        for name, m in module.named_modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                self._handles.append(m.register_forward_hook(self._hook(name)))

    def _hook(self, name: str):  # noqa: ANN202
        def hook(mod: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            x = inputs[0]
            dims = [0] + list(range(2, x.ndim))
            self.stats[name] = (x.mean(dims), x.var(dims, unbiased=False))
        return hook

    def close(self) -> None:
        for h in self._handles:
            h.remove()

    def __enter__(self) -> "BNStatisticsRecorder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def check_batch_fits(model: ModelSpec, batch: Batch) -> None:
    if tuple(batch.images.shape[1:]) != tuple(model.input_shape):
        raise ModelMismatchError(f"batch images are {list(batch.images.shape[1:])}, model {model.name} "
                                 f"expects {list(model.input_shape)}")
    if int(batch.labels.max()) >= model.num_classes or int(batch.labels.min()) < 0:
        raise ModelMismatchError(f"labels outside 0..{model.num_classes - 1} for model {model.name}")


def fedsgd(model: ModelSpec, batch: Batch, *, share_bn_statistics: bool = False) -> SharedUpdate:
    """FedSGD: the gradient of the mean cross-entropy of ``batch`` w.r.t. all trainable parameters.

    The model runs in training mode (BatchNorm normalises with the batch's own statistics, as a
    training client does); the global model itself is not modified (no running-stat update, no
    ``.grad`` filled). With ``share_bn_statistics`` the batch's per-layer BN mean/variance are
    shared too, as for global BN updates (GradInversion's "BN exact" setting).
    """
    check_batch_fits(model, batch)
    module = model.module
    global_weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
    params = {n: p.detach().clone().requires_grad_(True) for n, p in trainable_parameters(module).items()}
    buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
    first = next(iter(params.values()))  # the batch goes where the model's parameters are
    x = model.normalize(batch.images.to(first.device, first.dtype))
    was_training = module.training
    module.train()
    try:
        with BNStatisticsRecorder(module) as rec:
            logits = functional_call(module, (params, buffers), (x,))
        loss = F.cross_entropy(logits, batch.labels.to(first.device))
        grads = torch.autograd.grad(loss, list(params.values()))
    finally:
        module.train(was_training)
    meta = UpdateMeta(model=model.name, num_classes=model.num_classes, input_shape=model.input_shape,
                      mean=model.mean, std=model.std, batch_size=batch.size, loss=float(loss.detach()),
                      model_kwargs=dict(model.kwargs), threat={"name": "fedsgd"},
                      bn_statistics_shared=share_bn_statistics and bool(rec.stats))
    bn: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    if share_bn_statistics:
        bn = {k: (m.detach().clone(), v.detach().clone()) for k, (m, v) in rec.stats.items()}
    return SharedUpdate(gradients={n: g.detach() for n, g in zip(params, grads, strict=True)},
                        global_weights=global_weights, meta=meta, bn_statistics=bn)
