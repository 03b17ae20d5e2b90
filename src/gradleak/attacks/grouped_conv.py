"""Grouped (depthwise) 2-d convolutions with a double backward that does not loop over groups
(torch's does, one convolution per group: most of a step on depthwise networks)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd import Function
from torch.overrides import TorchFunctionMode


def _pair(v: Any) -> list[int]:
    return [int(v), int(v)] if isinstance(v, int) else [int(u) for u in v]


class _GroupedConvBackward(Function):
    """(gy, x, w) -> (gx, gw) of y = conv2d(x, w, stride, padding, dilation, groups), no bias."""

    generate_vmap_rule = True

    @staticmethod
    def forward(gy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, stride: list[int], padding: list[int],
                dilation: list[int], groups: int) -> tuple[torch.Tensor, torch.Tensor]:
        gx, gw, _ = torch.ops.aten.convolution_backward(gy, x, w, None, stride, padding, dilation, False, [0, 0],
                                                        groups, [True, True, False])
        return gx, gw

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        gy, x, w, stride, padding, dilation, groups = inputs
        ctx.save_for_backward(gy, x, w)
        ctx.conv = (stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx: Any, ggx: torch.Tensor | None, ggw: torch.Tensor | None) -> tuple:
        gy, x, w = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conv
        need_gy, need_x, need_w = ctx.needs_input_grad[:3]
        d_gy = d_x = d_w = None
        if need_gy:
            if ggx is not None:
                d_gy = F.conv2d(ggx, w, None, stride, padding, dilation, groups)
            if ggw is not None:
                term = F.conv2d(x, ggw, None, stride, padding, dilation, groups)
                d_gy = term if d_gy is None else d_gy + term
        if need_x and ggw is not None:
            d_x = torch.ops.aten.convolution_backward(gy, x, ggw, None, stride, padding, dilation, False, [0, 0],
                                                      groups, [True, False, False])[0]
        if need_w and ggx is not None:
            d_w = torch.ops.aten.convolution_backward(gy, ggx, w, None, stride, padding, dilation, False, [0, 0],
                                                      groups, [False, True, False])[1]
        return d_gy, d_x, d_w, None, None, None, None


class _GroupedConv(Function):
    """y = conv2d(x, w, stride, padding, dilation, groups) (no bias: added outside)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, w: torch.Tensor, stride: list[int], padding: list[int], dilation: list[int],
                groups: int) -> torch.Tensor:
        return F.conv2d(x, w, None, stride, padding, dilation, groups)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        x, w, stride, padding, dilation, groups = inputs
        ctx.save_for_backward(x, w)
        ctx.conv = (stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple:
        x, w = ctx.saved_tensors
        gx, gw = _GroupedConvBackward.apply(gy, x, w, *ctx.conv)
        return gx, gw, None, None, None, None


def grouped_conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
                   padding: Any = 0, dilation: Any = 1, groups: int = 1) -> torch.Tensor:
    """F.conv2d with numeric padding, through the Functions above. Under autocast the convolution
    runs in the autocast dtype (as torch's would), both passes alike."""
    args = (_pair(stride), _pair(padding), _pair(dilation), int(groups))
    device = x.device.type
    if torch.is_autocast_enabled(device) and x.dtype != torch.float64:  # autocast leaves float64 alone
        dtype = torch.get_autocast_dtype(device)
        with torch.autocast(device, enabled=False):
            y = _GroupedConv.apply(x.to(dtype), weight.to(dtype), *args)
    else:
        y = _GroupedConv.apply(x, weight, *args)
    if bias is not None:
        y = y + bias.to(y.dtype).view(1, -1, 1, 1)
    return y


_NAMES = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")


class grouped_convolutions(TorchFunctionMode):  # noqa: N801  (used as a context manager, like torch's modes)
    """Within it, ``F.conv2d`` / ``torch.conv2d`` with groups > 1, a 4-d input and numeric padding
    run through ``grouped_conv2d``; every other call is torch's."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.conv2d or func is torch.conv2d:
            bound = dict(zip(_NAMES, args, strict=False))
            bound.update(kwargs)
            groups = int(bound.get("groups", 1))
            x = bound.get("input")
            if groups > 1 and isinstance(x, torch.Tensor) and x.ndim == 4 \
                    and not isinstance(bound.get("padding", 0), str):
                return grouped_conv2d(x, bound["weight"], bound.get("bias"), bound.get("stride", 1),
                                      bound.get("padding", 0), bound.get("dilation", 1), groups)
        return func(*args, **kwargs)
