"""The Defense base class: a frozen dataclass whose fields are its parameters."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..errors import ConfigError
from ..fl.update import SharedUpdate, UpdateMeta


def format_value(value: Any) -> str:
    """Shortest text that parses back to the same value: 1.0 -> "1", 0.0001 -> "0.0001"."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e16:
            return str(int(value))
        return repr(value)
    return str(value)


def record_defense(meta: UpdateMeta, spec: str) -> UpdateMeta:
    """A copy of ``meta`` with ``spec`` appended to ``defenses`` (the input is left alone)."""
    return dataclasses.replace(meta, defenses=[*meta.defenses, spec])


def as_float(value: Any) -> float | None:
    """``value`` as a float (a number or the text of one), or None where it is not one: a bool,
    None, a list, text that does not parse. Infinity and NaN pass (check ``math.isfinite``)."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def check_finite(defense: str, field: str, value: Any, *, minimum: float | None = None,
                 minimum_inclusive: bool = True, maximum: float | None = None,
                 maximum_inclusive: bool = True) -> float:
    """``value`` as a finite float within the bounds, else ConfigError naming defense and field."""
    lo = "" if minimum is None else f"{'>=' if minimum_inclusive else '>'} {format_value(float(minimum))}"
    hi = "" if maximum is None else f"{'<=' if maximum_inclusive else '<'} {format_value(float(maximum))}"
    want = " and ".join(s for s in (lo, hi) if s)
    what = f"defense {defense}: {field} must be a finite number" + (f" {want}" if want else "")
    x = as_float(value)
    if x is None or not math.isfinite(x):
        raise ConfigError(f"{what}, got {value!r}")
    if minimum is not None and (x < minimum or (x == minimum and not minimum_inclusive)):
        raise ConfigError(f"{what}, got {format_value(x)}")
    if maximum is not None and (x > maximum or (x == maximum and not maximum_inclusive)):
        raise ConfigError(f"{what}, got {format_value(x)}")
    return x


@dataclass(frozen=True)
class Residual:
    """Mean and variance of the squared distance ||shared - clean||^2 a defense adds."""

    mean: float
    var: float


def entry_noise(entries: int, variance: float, fourth_moment: float) -> Residual:
    """i.i.d. zero-mean noise on ``entries`` entries: E||n||^2 = N v, Var||n||^2 = N (m4 - v^2)."""
    return Residual(mean=entries * variance, var=entries * max(fourth_moment - variance ** 2, 0.0))


def uniform_rounding(half_steps: torch.Tensor) -> Residual:
    """Rounding to a grid, the error of entry i uniform on [-a_i, a_i] (a_i = half its step):
    E e^2 = a^2 / 3, E e^4 = a^4 / 5, so Var e^2 = 4 a^4 / 45, summed over the entries."""
    a2 = half_steps.detach().double().pow(2)
    return Residual(mean=float(a2.sum() / 3), var=float(a2.pow(2).sum() * 4 / 45))


@dataclass(frozen=True)
class Defense:
    """Base class. Subclasses are frozen dataclasses; their fields are the defense's parameters.

    Class attributes:
      name:        the spec name ("gaussian", "prune", ...).
      positional:  the field a bare value fills (``gaussian:0.01`` -> sigma), or None.
      client_side: True where the defense must run while the client computes the gradient
                   (DP-SGD needs per-sample gradients); its ``apply`` raises ConfigError.
    """

    name: ClassVar[str] = ""
    positional: ClassVar[str | None] = None
    client_side: ClassVar[bool] = False

    # ------------------------------------------------------------------ description
    @property
    def params(self) -> dict[str, Any]:
        """All parameters, defaults included: field name -> value."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def spec(self) -> str:
        """Canonical spec string; parses back to an equal defense.

        Required parameters are always written, optional ones only where they differ from
        their default; the positional parameter (if any) comes first without its key.
        """
        parts: list[str] = []
        # stable sort: the positional field first, the others in declaration order
        for f in sorted(dataclasses.fields(self), key=lambda f: f.name != self.positional):
            value = getattr(self, f.name)
            if f.default is not dataclasses.MISSING and value == f.default:
                continue
            text = format_value(value)
            parts.append(text if f.name == self.positional else f"{f.name}={text}")
        return self.name + (":" + ",".join(parts) if parts else "")

    def describe(self) -> dict[str, Any]:
        """{"name", "spec", "params"} (JSON-able); DP-SGD adds "epsilon" and "delta"."""
        return {"name": self.name, "spec": self.spec, "params": dict(self.params)}

    def __str__(self) -> str:
        return self.spec

    # ------------------------------------------------------------------ application
    def residual(self, shared: list[torch.Tensor], client_batch: int) -> Residual | None:
        """The attacker's model of what this defense did to one client's update: the mean and
        variance of ||shared - clean||^2 over all entries, from the public parameters and the
        shared tensors alone (defenses/floor.py). None: not modelled (the verdict then keeps its
        plain threshold, which errs on "inconclusive", never on "defended")."""
        return None

    def apply(self, update: SharedUpdate, generator: torch.Generator) -> SharedUpdate:
        """The defended copy of ``update`` (gradients transformed, spec recorded in meta)."""
        with torch.no_grad():
            gradients = self.transform(update.gradients, generator)
        return update.replace(gradients=gradients, meta=record_defense(update.meta, self.spec))

    def transform(self, gradients: dict[str, torch.Tensor],
                  generator: torch.Generator) -> dict[str, torch.Tensor]:
        """New gradient dict (same keys, order, shapes, dtypes, devices); never mutates input."""
        raise NotImplementedError
