"""attacks/grouped_conv: the double backward of grouped (depthwise) convolutions written out with
torch's native grouped kernels equals torch's own path (which loops over the groups)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.profiler import ProfilerActivity, profile

from gradleak.attacks.grouped_conv import grouped_conv2d, grouped_convolutions


def _net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Tanh(),
                        nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8), nn.Tanh(),       # depthwise, strided
                        nn.Conv2d(8, 16, 1), nn.Tanh(),
                        nn.Conv2d(16, 16, 5, padding=4, dilation=2, groups=4, bias=False),  # grouped, dilated
                        nn.Tanh(), nn.Flatten(), nn.Linear(16 * 6 * 6, 5)).double()
    return net


def _objective(net: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, target: list[torch.Tensor],
               routed: bool) -> torch.Tensor:
    """sum_l ||dW_l(x) - T_l|| (GradInversion Eq. 3's form), through grouped_conv or torch."""
    with grouped_convolutions() if routed else torch.enable_grad():
        loss = F.cross_entropy(functional_call(net, params, (x,)), torch.tensor([1, 3]))
    grads = torch.autograd.grad(loss, list(params.values()), create_graph=True)
    return sum((g - t).norm() for g, t in zip(grads, target, strict=True))


def test_double_backward_equals_torch_and_does_not_loop_over_groups() -> None:
    net = _net()
    params = {n: p.detach().requires_grad_(True) for n, p in net.named_parameters()}
    target = [torch.randn_like(p) for p in params.values()]
    x = torch.randn(2, 3, 12, 12, dtype=torch.float64, requires_grad=True)
    ref = torch.autograd.grad(_objective(net, params, x, target, routed=False), [x])[0]
    obj = _objective(net, params, x, target, routed=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        got = torch.autograd.grad(obj, [x])[0]
    assert float((got - ref).norm() / ref.norm()) < 1e-12
    calls = sum(e.count for e in prof.key_averages() if e.key == "aten::convolution")
    assert calls <= 12, calls  # torch's own path: one call per group of each grouped layer (8 + 4) on top
    # and the weight gradients themselves (first order) are torch's
    with grouped_convolutions():
        loss = F.cross_entropy(functional_call(net, params, (x,)), torch.tensor([1, 3]))
    mine = torch.autograd.grad(loss, list(params.values()))
    theirs = torch.autograd.grad(F.cross_entropy(functional_call(net, params, (x,)), torch.tensor([1, 3])),
                                 list(params.values()))
    assert all(torch.allclose(a, b, rtol=1e-12, atol=1e-14) for a, b in zip(mine, theirs, strict=True))


def test_vmap_over_grad_equals_torch() -> None:
    """GradInversion's G seeds: vmap over torch.func.grad, then ordinary autograd w.r.t. x."""
    net = _net()
    params = {n: p.detach() for n, p in net.named_parameters()}
    target = [torch.randn_like(p) for p in params.values()]
    x = torch.randn(3, 2, 3, 12, 12, dtype=torch.float64, requires_grad=True)

    def objective(routed: bool) -> torch.Tensor:
        def loss(p: dict[str, torch.Tensor], xi: torch.Tensor) -> torch.Tensor:
            with grouped_convolutions() if routed else torch.enable_grad():
                return F.cross_entropy(functional_call(net, p, (xi,)), torch.tensor([1, 3]))
        gs = vmap(grad(loss), in_dims=(None, 0))(params, x)
        return sum((gs[n] - t).flatten(1).norm(dim=1).sum() for n, t in zip(params, target, strict=True))

    ref = torch.autograd.grad(objective(False), [x])[0]
    got = torch.autograd.grad(objective(True), [x])[0]
    assert float((got - ref).norm() / ref.norm()) < 1e-12


def test_second_order_weight_term_and_gradcheck() -> None:
    """All three inputs of the first-order backward (gy, x, w) get torch's second-order terms."""
    torch.manual_seed(1)
    x = torch.randn(2, 6, 7, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x, w, b: grouped_conv2d(x, w, b, 2, 1, 1, 3), (x, w, b))


@pytest.mark.parametrize("padding", ["same", "valid"])
def test_string_padding_keeps_torchs_path(padding: str) -> None:
    x = torch.randn(1, 4, 6, 6)
    w = torch.randn(4, 1, 3, 3)
    with grouped_convolutions():
        y = F.conv2d(x, w, None, 1, padding, 1, 4)
    assert torch.equal(y, F.conv2d(x, w, None, 1, padding, 1, 4))


def test_autocast_runs_in_the_autocast_dtype() -> None:
    """bfloat16 autocast (benchmarks/gpu.py's precision comparison): the double backward runs and
    stays close to torch's own under the same autocast."""
    net = _net().float()
    params = {n: p.detach().requires_grad_(True) for n, p in net.named_parameters()}
    target = [torch.randn_like(p) for p in params.values()]
    x = torch.randn(2, 3, 12, 12, requires_grad=True)
    grads = []
    for routed in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            grads.append(torch.autograd.grad(_objective(net, params, x, target, routed), [x])[0].float())
    assert torch.isfinite(grads[1]).all()
    assert float((grads[1] - grads[0]).norm() / grads[0].norm()) < 0.05


def test_mode_reads_keywords_and_torch_conv2d_and_keeps_dtypes() -> None:
    """The mode parses F.conv2d's keywords and torch.conv2d alike; the output dtype is torch's
    (float64 untouched by bfloat16 autocast, the bias in the conv's dtype)."""
    x = torch.randn(2, 4, 9, 7, dtype=torch.float64)
    w = torch.randn(4, 2, 3, 3, dtype=torch.float64)
    b = torch.randn(4, dtype=torch.float64)
    ref = F.conv2d(x, w, b, stride=(2, 1), padding=1, groups=2)
    with grouped_convolutions():
        got = [F.conv2d(input=x, weight=w, bias=b, stride=(2, 1), padding=1, groups=2),
               torch.conv2d(x, w, b, (2, 1), 1, 1, 2)]
    assert all(torch.allclose(g, ref, rtol=1e-12, atol=1e-12) for g in got)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert grouped_conv2d(x, w, b, 1, 1, 1, 2).dtype == torch.float64
        assert grouped_conv2d(x.float(), w.float(), b.float(), 1, 1, 1, 2).dtype == torch.bfloat16
