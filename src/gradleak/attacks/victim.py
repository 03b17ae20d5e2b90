"""The attacker's copy of the victim: the shared model's gradient on dummy inputs.

Gradients are taken functionally (torch.func.functional_call + autograd.grad / torch.func.grad),
so no parameter ``.grad`` is ever filled and the caller's model is never modified.

Two ways in:

* ``victim(x, labels)``: one dummy batch x [K, C, H, W] -> the parameter gradients (DLG, iDLG).
* ``victim.batched(x, labels)``: G dummy batches x [G, K, C, H, W] at once -> every candidate's
  OWN batch gradient [G, ...] per parameter plus the per-layer BatchNorm batch statistics of its
  input, all from one forward/backward. The G axis is mapped with ``torch.func.vmap`` over
  ``torch.func.grad(functional_call(...))``, so each candidate is normalised with its own BN
  batch statistics and gets its own weight gradient, exactly as G separate runs would (GradInversion's
  seeds, Inverting Gradients' restarts). The result stays differentiable w.r.t. x by ordinary
  autograd (the attack's double backward).

The BN statistics mu_l, sigma^2_l of each BatchNorm layer's input (GradInversion Eq. 10) are
captured by forward hooks on the BN modules during the SAME forward pass that the gradient is
taken from; there is no second forward.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from ..fl.update import SharedUpdate
from ..models import ModelSpec

BNStats = list[tuple[torch.Tensor, torch.Tensor]]


def _bn_layers(module: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in module.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


class DummyGradient:
    """d loss(model(x'), y') / d W for dummy inputs, under the client's training conditions.

    x' is in the model's normalised input space, [K, C, H, W]. Labels are either hard class
    indices [K] or label logits [K, N] (DLG's soft labels, passed through softmax).

    The copy's BatchNorm layers stop tracking running statistics (``running_mean`` etc. become
    None): in training mode BN normalises with the batch statistics either way, so the outputs
    and gradients are unchanged, and nothing is updated in place (which vmap forbids).
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
        for _, m in _bn_layers(self.module):
            m.track_running_stats = False
            m.running_mean = None
            m.running_var = None
            m.num_batches_tracked = None
            m.register_forward_hook(self._bn_hook)
        self._capture: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.names = list(update.gradients)
        weights = update.global_weights
        self.params = {n: weights[n].detach().to(self.device, dtype).requires_grad_(True) for n in self.names}
        self.buffers = {n: b.detach().to(self.device) for n, b in self.module.named_buffers()}
        for n, b in self.buffers.items():
            if b.is_floating_point():
                self.buffers[n] = b.to(dtype)
        self.target = [update.gradients[n].detach().to(self.device, dtype) for n in self.names]
        # Flattened target and a layer index per entry: distances of G candidates in one pass.
        self.target_flat = torch.cat([t.reshape(-1) for t in self.target])
        self.layer_index = torch.cat([torch.full((t.numel(),), i, dtype=torch.long, device=self.device)
                                      for i, t in enumerate(self.target)])
        self.target_norm = self.target_flat.norm()

    # ------------------------------------------------------------------ forward
    def _bn_hook(self, module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        if self._capture is not None:
            x = inputs[0]
            dims = [0] + list(range(2, x.ndim))
            self._capture.append((x.mean(dims), x.var(dims, unbiased=False)))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        # Fresh buffer copies each call so no buffer can drift during an attack.
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

    # ------------------------------------------------------------------ G candidates at once
    def _loss_and_stats(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                        labels: torch.Tensor) -> tuple[torch.Tensor, BNStats]:
        self._capture = []
        try:
            out = functional_call(self.module, (params, self.buffers), (x,))
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
        params = {n: p.detach() for n, p in self.params.items()}
        g = grad(self._loss_and_stats, has_aux=True)
        grads, stats = vmap(g, in_dims=(None, 0, None))(params, x, labels)
        return [grads[n] for n in self.names], stats

    def flatten(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """[G, P]: every candidate's gradient as one row (the order of ``target_flat``)."""
        return torch.cat([g.reshape(g.shape[0], -1) for g in grads], dim=1)

    def layer_l2(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """GradInversion Eq. 3 without alpha_G, per candidate: sum_l ||dW'_l - dW_l||_2 -> [G]."""
        d = self.flatten(grads) - self.target_flat
        per_layer = torch.zeros(d.shape[0], len(self.target), dtype=d.dtype, device=d.device)
        per_layer = per_layer.index_add(1, self.layer_index, d * d)
        return per_layer.clamp_min(1e-30).sqrt().sum(dim=1)

    def cosine(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """Inverting Gradients Eq. 4 per candidate: 1 - <dW', dW> / (||dW'|| ||dW||), all layers
        together -> [G]."""
        flat = self.flatten(grads)
        dot = flat @ self.target_flat
        return 1 - dot / (flat.norm(dim=1) * self.target_norm).clamp_min(1e-30)
