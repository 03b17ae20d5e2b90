"""The attacker's copy of the victim: the shared model's gradient on dummy inputs.

Gradients are taken functionally (torch.func.functional_call + autograd.grad), so no parameter
``.grad`` is ever filled and the caller's model is never modified.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch.func import functional_call

from ..fl.update import SharedUpdate
from ..models import ModelSpec


class DummyGradient:
    """d loss(model(x'), y') / d W for dummy inputs, under the client's training conditions.

    x' is in the model's normalised input space, [K, C, H, W]. Labels are either hard class
    indices [K] or label logits [K, N] (DLG's soft labels, passed through softmax).
    """

    def __init__(self, model: ModelSpec, update: SharedUpdate, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        self.model = model
        self.dtype, self.device = dtype, torch.device(device)
        self.module = copy.deepcopy(model.module).to(self.device)
        self.module.train()  # the client trains: BatchNorm normalises with batch statistics
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.names = list(update.gradients)
        weights = update.global_weights
        self.params = {n: weights[n].detach().to(self.device, dtype).requires_grad_(True) for n in self.names}
        self.buffers = {n: b.detach().to(self.device) for n, b in self.module.named_buffers()}
        for n, b in self.buffers.items():
            if b.is_floating_point():
                self.buffers[n] = b.to(dtype)
        self.target = [update.gradients[n].detach().to(self.device, dtype) for n in self.names]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        # Fresh buffer copies each call so BN running statistics never drift during an attack.
        buffers = {n: b.clone() for n, b in self.buffers.items()}
        return functional_call(self.module, (self.params, buffers), (x,))

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy; soft labels (float [K, N] logits) as in DLG's code."""
        if labels.is_floating_point():
            return torch.mean(torch.sum(-F.softmax(labels, dim=-1) * F.log_softmax(logits, dim=-1), dim=-1))
        return F.cross_entropy(logits, labels)

    def __call__(self, x: torch.Tensor, labels: torch.Tensor, *, create_graph: bool = True) -> list[torch.Tensor]:
        loss = self.loss(self.logits(x), labels)
        return list(torch.autograd.grad(loss, list(self.params.values()), create_graph=create_graph))
