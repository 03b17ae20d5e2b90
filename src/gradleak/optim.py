"""torch optimizers that never import torch._dynamo.

torch's ``Optimizer`` wraps ``add_param_group``, ``state_dict``, ``load_state_dict`` and
``zero_grad`` in ``torch._disable_dynamo``, and Adam's / SGD's ``step`` in a wrapper that calls
``torch._dynamo.graph_break``: the first call of any of them imports torch._dynamo, 2-3.5 s on a
small CPU (measured here), which is most of a short attack's set-up and of a DLG run's time to
its first good image. gradleak never traces its optimizers with torch.compile, so these
subclasses call torch's own undecorated methods (the same code, the same numbers; tests compare
the trajectories with torch's classes and check in a fresh process that nothing imports dynamo).

Not everything can avoid it: under ``torch.func.vmap`` (GradInversion's G > 1 seeds, IG's
restarts), torch.func.grad looks torch._dynamo up itself, so those runs still import it once.

What is skipped with the decorators: dynamo's graph breaks (only meaningful under
torch.compile) and, for ``step``, the optimizer's step pre/post hooks
(``register_step_pre_hook``), which gradleak does not use.
"""

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
