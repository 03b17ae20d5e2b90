"""torch optimizers that never import torch._dynamo (seconds of set-up on a small CPU): the same
code and numbers as torch's, without the decorators that only matter under torch.compile."""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch


def _raw(method: Callable[..., Any]) -> Callable[..., Any]:
    """torch's method without its decorators (functools.wraps keeps the original as __wrapped__);
    the method itself where a torch version does not decorate it."""
    return inspect.unwrap(method)


class EagerOptimizer(torch.optim.Optimizer):
    """Mixin: torch.optim.Optimizer's bookkeeping methods without the torch._dynamo import."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _raw(torch.optim.Optimizer.add_param_group)(self, param_group)

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return _raw(torch.optim.Optimizer.state_dict)(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        _raw(torch.optim.Optimizer.load_state_dict)(self, state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _raw(torch.optim.Optimizer.zero_grad)(self, set_to_none)


def _raw_step(cls: type[torch.optim.Optimizer]) -> Callable[..., Any]:
    def step(self: torch.optim.Optimizer, closure: Callable[[], Any] | None = None) -> Any:
        if self.defaults.get("differentiable", False):
            raise ValueError(f"{type(self).__name__} does not support differentiable=True")
        with torch.no_grad():  # what torch's wrapper sets for a non-differentiable optimizer
            return _raw(cls.step)(self, closure)
    step.__doc__ = f"torch.optim.{cls.__name__}.step without its torch._dynamo wrapper."
    return step


class Adam(EagerOptimizer, torch.optim.Adam):
    """torch.optim.Adam (same arguments and steps) without the torch._dynamo import."""

    step = _raw_step(torch.optim.Adam)  # type: ignore[assignment]


class SGD(EagerOptimizer, torch.optim.SGD):
    """torch.optim.SGD (same arguments and steps) without the torch._dynamo import."""

    step = _raw_step(torch.optim.SGD)  # type: ignore[assignment]


__all__ = ["Adam", "EagerOptimizer", "SGD"]
