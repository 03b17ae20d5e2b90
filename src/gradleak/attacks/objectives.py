"""Gradient-matching objectives: distances between the dummy and the shared gradients.

All take lists of tensors in the same (parameter) order and return a scalar.
"""

from __future__ import annotations

from typing import Sequence

import torch

Tensors = Sequence[torch.Tensor]


def squared_l2(dummy: Tensors, target: Tensors) -> torch.Tensor:
    """DLG (Zhu et al. 2019, Algorithm 1 / Eq. 4): sum over layers of ||dW' - dW||_2^2."""
    diffs = torch._foreach_sub(list(dummy), list(target))
    return torch.stack(torch._foreach_norm(diffs, 2)).pow(2).sum()


def layer_l2(dummy: Tensors, target: Tensors, weights: Sequence[float] | None = None) -> torch.Tensor:
    """GradInversion Eq. 3 (without alpha_G): sum over layers l of ||dW'_l - dW_l||_2 (not squared)."""
    diffs = torch._foreach_sub(list(dummy), list(target))
    norms = torch.stack(torch._foreach_norm(diffs, 2))
    if weights is not None:
        norms = norms * torch.as_tensor(weights, dtype=norms.dtype, device=norms.device)
    return norms.sum()


def cosine(dummy: Tensors, target: Tensors) -> torch.Tensor:
    """Inverting Gradients (Geiping et al. 2020, Eq. 4): 1 - <dW', dW> / (||dW'|| ||dW||), with the
    inner product and norms taken over all layers together."""
    dot = torch.stack([(a * b).sum() for a, b in zip(dummy, target, strict=True)]).sum()
    n1 = torch.stack(torch._foreach_norm(list(dummy), 2)).pow(2).sum()
    n2 = torch.stack(torch._foreach_norm(list(target), 2)).pow(2).sum()
    return 1 - dot / (n1.sqrt() * n2.sqrt()).clamp_min(1e-30)


OBJECTIVES = {"l2sq": squared_l2, "l2": layer_l2, "cosine": cosine}


# ---------------------------------------------------------------------- G candidates, fused
# The attacks' objectives sit at the top of a double backward: autograd only has to carry them
# back once, to the candidates' gradients. Written as autograd Functions they need one or two
# passes over the (for ResNet-18: 11 M-entry) gradient per candidate, in both directions, instead
# of autograd's chain of cat / mv / norm / div nodes (measured on ResNet-18, batch 1: the cosine's
# forward and backward took ~145 ms of a 435 ms IG step; with the fused one the step took ~340 ms).
# Their backward is not itself differentiable (nothing differentiates these objectives twice).

def _per_candidate(t: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """[G] -> [G, 1, ..., 1] to broadcast against a [G, *shape] gradient."""
    return t.view((-1,) + (1,) * (g.ndim - 1))


class _Cosine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, target_norm: torch.Tensor, target: list[torch.Tensor], *grads: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        g0 = grads[0].shape[0]
        dot = sum(g.reshape(g0, -1) @ t.reshape(-1) for g, t in zip(grads, target, strict=True))
        norm = torch.sqrt(sum(g.reshape(g0, -1).pow(2).sum(dim=1) for g in grads))
        denom = (norm * target_norm).clamp_min(1e-30)
        ctx.save_for_backward(dot, norm, denom, *grads)
        ctx.target = target
        return 1 - dot / denom

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # noqa: ANN001, ANN205
        dot, norm, denom, *grads = ctx.saved_tensors
        # d/dg [1 - <g, t> / (|g| |t|)] = -t / (|g| |t|) + <g, t> g / (|g|^3 |t|)
        c_t = -grad_out / denom
        c_g = grad_out * dot / (denom * norm.pow(2)).clamp_min(1e-30)
        out = [torch.addcmul(t.unsqueeze(0) * _per_candidate(c_t, g), g, _per_candidate(c_g, g))
               for g, t in zip(grads, ctx.target, strict=True)]
        return (None, None, *out)


def cosine_batched(grads: Tensors, target: Tensors, target_norm: torch.Tensor | None = None) -> torch.Tensor:
    """Inverting Gradients Eq. 4 per candidate: grads [G, *shape] per layer -> [G] of
    1 - <dW'_g, dW> / (||dW'_g|| ||dW||), all layers together."""
    target = list(target)
    if target_norm is None:
        target_norm = torch.stack(torch._foreach_norm(target, 2)).pow(2).sum().sqrt()
    return _Cosine.apply(target_norm, target, *grads)


class _LayerL2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weights: torch.Tensor, target: list[torch.Tensor], *grads: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        g0 = grads[0].shape[0]
        diffs = [g - t.unsqueeze(0) for g, t in zip(grads, target, strict=True)]
        norms = torch.stack([d.reshape(g0, -1).pow(2).sum(dim=1) for d in diffs], dim=1).clamp_min(1e-30).sqrt()
        ctx.save_for_backward(weights, norms, *diffs)
        return (norms * weights).sum(dim=1)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # noqa: ANN001, ANN205
        weights, norms, *diffs = ctx.saved_tensors
        scale = grad_out.unsqueeze(1) * weights / norms            # d ||d_l|| / d d_l = d_l / ||d_l||
        return (None, None, *[d * _per_candidate(scale[:, i], d) for i, d in enumerate(diffs)])


def layer_l2_batched(grads: Tensors, target: Tensors, weights: Sequence[float] | torch.Tensor | None = None) -> torch.Tensor:
    """GradInversion Eq. 3 (without alpha_G) per candidate: sum_l w_l ||dW'_{g,l} - dW_l||_2 -> [G]."""
    target = list(target)
    w = torch.ones(len(target)) if weights is None else torch.as_tensor(weights)
    w = w.to(device=target[0].device, dtype=target[0].dtype)
    return _LayerL2.apply(w, target, *grads)
