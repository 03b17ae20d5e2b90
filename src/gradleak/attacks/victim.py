"""The attacker's copy of the victim: the shared model's gradient on dummy inputs."""

from __future__ import annotations

import contextlib
import copy
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from ..fl.update import SharedUpdate
from ..models import ModelSpec
from .grouped_conv import grouped_convolutions
from .objectives import cosine_batched, layer_l2_batched

BNStats = list[tuple[torch.Tensor, torch.Tensor]]


def _bn_layers(module: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in module.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


class BatchStatNorm(nn.Module):
    """Training-mode BatchNorm from elementary operations: y = (x - mu) / sqrt(sigma^2 + eps) *
    gamma + beta with mu, sigma^2 the biased batch statistics per channel (GradInversion Eq. 10's
    mu_l, sigma^2_l, handed to ``record``).

    Why not ``F.batch_norm``: under ``torch.func.vmap`` over ``torch.func.grad`` (the G-candidate
    path), the double backward of the fused native BatchNorm gives a wrong derivative of the BN
    weight gradient w.r.t. the input on torch 2.14 (measured on the convnet, float64, against
    central differences: single BN-weight terms off by up to 40 %, the whole derivative of the
    gradient distance by 1e-5 to 1e-4 relative, and 2e-3 to 7e-3 with GradInversion's BN prior
    added, for G = 1 and G = 2 alike). Written out like this the derivative matches the
    finite difference and plain autograd to rounding (tests/attacks/test_gradinversion.py). The
    parameters keep their names (``weight``, ``bias``), so ``functional_call`` is unchanged.
    """

    def __init__(self, bn: nn.modules.batchnorm._BatchNorm, record: Callable[[torch.Tensor, torch.Tensor], None]):
        super().__init__()
        self.eps = float(bn.eps)
        self.weight, self.bias = bn.weight, bn.bias
        self._record = record

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dims = [0, *range(2, x.ndim)]
        mean, var = x.mean(dims), x.var(dims, unbiased=False)
        self._record(mean, var)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.weight is not None:
            y = y * self.weight.view(shape)
        if self.bias is not None:
            y = y + self.bias.view(shape)
        return y


class DummyGradient:
    """d loss(model(x'), y') / d W for dummy inputs, under the client's training conditions.

    x' is in the model's normalised input space, [K, C, H, W]. Labels are either hard class
    indices [K] or label logits [K, N] (DLG's soft labels, passed through softmax).

    The copy's BatchNorm layers are replaced by :class:`BatchStatNorm`: training-mode BN (batch
    statistics) written with elementary operations, no running statistics (nothing is updated in
    place, which vmap forbids). Same outputs and gradients as ``F.batch_norm`` in training mode,
    and a correct double backward under vmap (see BatchStatNorm).
    """

    def __init__(self, model: ModelSpec, update: SharedUpdate, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        self.model = model
        self.dtype, self.device = dtype, torch.device(device)
        self.module = copy.deepcopy(model.module).to(self.device)
        self.module.train()  # the client trains: BatchNorm normalises with batch statistics
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.bn_names = [n for n, _ in _bn_layers(self.module)]
        for name, m in _bn_layers(self.module):
            if not name:  # the model is a bare BatchNorm layer
                self.module = BatchStatNorm(m, self._record)
                continue
            parent, _, leaf = name.rpartition(".")
            setattr(self.module.get_submodule(parent), leaf, BatchStatNorm(m, self._record))
        self._capture: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        # grouped (depthwise) convolutions take grouped_conv's double backward (torch's loops over
        # the groups: ~95 % of a GradInversion step on EfficientNet-Lite0 on a GPU)
        self.grouped = any(isinstance(m, nn.Conv2d) and m.groups > 1 for m in self.module.modules())
        self.names = list(update.gradients)
        weights = update.global_weights
        self.params = {n: weights[n].detach().to(self.device, dtype).requires_grad_(True) for n in self.names}
        self.buffers = {n: b.detach().to(self.device) for n, b in self.module.named_buffers()}
        for n, b in self.buffers.items():
            if b.is_floating_point():
                self.buffers[n] = b.to(dtype)
        self.target = [update.gradients[n].detach().to(self.device, dtype) for n in self.names]
        self.target_norm = torch.stack(torch._foreach_norm(self.target, 2)).pow(2).sum().sqrt()

    # ------------------------------------------------------------------ forward
    def _record(self, mean: torch.Tensor, var: torch.Tensor) -> None:
        if self._capture is not None:
            self._capture.append((mean, var))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        # Fresh buffer copies each call so no buffer can drift during an attack.
        buffers = {n: b.clone() for n, b in self.buffers.items()}
        return self.forward(self.params, buffers, x)

    def forward(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], x: torch.Tensor
                ) -> torch.Tensor:
        """The model's output with these parameters and buffers (functional_call)."""
        with grouped_convolutions() if self.grouped else contextlib.nullcontext():
            return functional_call(self.module, (params, buffers), (x,))

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy; soft labels (float [K, N] logits) as in DLG's code."""
        if labels.is_floating_point():
            return torch.mean(torch.sum(-F.softmax(labels, dim=-1) * F.log_softmax(logits, dim=-1), dim=-1))
        return F.cross_entropy(logits, labels)

    def __call__(self, x: torch.Tensor, labels: torch.Tensor, *, create_graph: bool = True) -> list[torch.Tensor]:
        loss = self.loss(self.logits(x), labels)
        return list(torch.autograd.grad(loss, list(self.params.values()), create_graph=create_graph))

    # ------------------------------------------------------------------ G candidates at once
    def _loss_and_stats(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                        labels: torch.Tensor) -> tuple[torch.Tensor, BNStats]:
        self._capture = []
        try:
            out = self.forward(params, self.buffers, x)
            stats = list(self._capture)
        finally:
            self._capture = None
        return self.loss(out, labels), stats

    def batched(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[list[torch.Tensor], BNStats]:
        """x [G, K, C, H, W], labels [K] (shared) -> (grads, bn).

        grads: one tensor [G, *param.shape] per parameter (order ``self.names``): candidate g's
        own batch gradient. bn: one (mean [G, C_l], var [G, C_l]) per BN layer (order
        ``self.bn_names``): the biased batch statistics of that layer's input for candidate g.
        Differentiable w.r.t. x (no parameter ``.grad`` is touched).
        """
        if x.shape[0] == 1:
            # One candidate: plain autograd, no vmap (the same numbers; on ResNet-18 the vmap'd
            # torch.func.grad path cost ~15 % more per double-backward step on this CPU).
            outer = torch.is_grad_enabled()
            with torch.enable_grad():
                loss, stats = self._loss_and_stats(self.params, x[0], labels)
                grads = torch.autograd.grad(loss, list(self.params.values()), create_graph=outer)
            if not outer:
                grads = tuple(g.detach() for g in grads)
                stats = [(m.detach(), v.detach()) for m, v in stats]
            return [g.unsqueeze(0) for g in grads], [(m.unsqueeze(0), v.unsqueeze(0)) for m, v in stats]
        params = {n: p.detach() for n, p in self.params.items()}
        g = grad(self._loss_and_stats, has_aux=True)
        grads, stats = vmap(g, in_dims=(None, 0, None))(params, x, labels)
        return [grads[n] for n in self.names], stats

    def layer_l2(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """GradInversion Eq. 3 without alpha_G, per candidate: sum_l ||dW'_l - dW_l||_2 -> [G]."""
        return layer_l2_batched(grads, self.target)

    def cosine(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """Inverting Gradients Eq. 4 per candidate: 1 - <dW', dW> / (||dW'|| ||dW||), all layers
        together -> [G]."""
        return cosine_batched(grads, self.target, self.target_norm)
