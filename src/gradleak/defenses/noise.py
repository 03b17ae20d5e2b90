"""Additive noise on the shared gradients (DLG rebuttal Table 3: G-1e-4..1e-1, L-1e-4..1e-1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import Defense, Residual, check_finite, entry_noise


# The two noise defenses, declared for the catalog (specs.declarations reads this without torch):
# each parameter as [type, required, (minimum, inclusive) or None, (maximum, inclusive) or None, choices].
SPEC = [
    {"name": "gaussian", "class": "GaussianNoise", "summary": "add N(0, sigma^2) i.i.d. to every gradient entry",
     "positional": "sigma", "parameters": {"sigma": ["float", True, [0.0, True], None, []]},
     "example": "gaussian:0.01"},
    {"name": "laplace", "class": "LaplaceNoise", "summary": "add Laplace(0, b) i.i.d. to every gradient entry",
     "positional": "b", "parameters": {"b": ["float", True, [0.0, True], None, []]}, "example": "laplace:0.01"},
]


def _noise_dtype(t: torch.Tensor) -> torch.dtype:
    # float64 gradients get float64 noise; half/bfloat16 ones get float32 noise, rounded on add
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def gaussian_like(t: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """N(0, std^2) i.i.d., shaped like ``t``, drawn with ``generator`` and moved to t.device.

    Drawn as ``torch.normal(0, std, size, generator=...)``, the call Opacus' DPOptimizer makes,
    so the same generator state gives the same noise as Opacus.
    """
    dtype = _noise_dtype(t)
    noise = torch.normal(0.0, float(std), size=tuple(t.shape), generator=generator, dtype=dtype,
                         device=generator.device)
    return noise.to(t.device)


def laplace_like(t: torch.Tensor, b: float, generator: torch.Generator) -> torch.Tensor:
    """Laplace(0, b) i.i.d. (density exp(-|x|/b)/2b, std sqrt(2) b), shaped like ``t``.

    Drawn as b * (E1 - E2) with E = -log(1 - U), U ~ U[0, 1): exact, finite, generator-driven
    (torch.distributions.Laplace takes no generator).
    """
    dtype = _noise_dtype(t)
    u = torch.rand((2, *t.shape), generator=generator, dtype=dtype, device=generator.device)
    e = -torch.log1p(-u)
    return (float(b) * (e[0] - e[1])).to(t.device)


@dataclass(frozen=True)
class _AdditiveNoise(Defense):
    """Add zero-mean i.i.d. noise to every gradient entry. A subclass has one field, its
    ``positional`` one: the noise scale (a finite number >= 0; 0 leaves the gradients as they
    are), and draws the noise in :meth:`noise_like`."""

    def __post_init__(self) -> None:
        field = str(self.positional)
        object.__setattr__(self, field, check_finite(self.name, field, getattr(self, field), minimum=0.0))

    @property
    def scale(self) -> float:
        return float(getattr(self, str(self.positional)))

    def noise_like(self, t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Noise shaped like ``t`` on t.device, drawn with ``generator``."""
        raise NotImplementedError

    def moments(self) -> tuple[float, float]:
        """(E n^2, E n^4) of one noise entry."""
        raise NotImplementedError

    def residual(self, shared: list[torch.Tensor], client_batch: int) -> Residual:
        # the noise itself: its variance and fourth moment are public (the defense's parameter)
        return entry_noise(sum(t.numel() for t in shared), *self.moments())

    def transform(self, gradients: dict[str, torch.Tensor],
                  generator: torch.Generator) -> dict[str, torch.Tensor]:
        if self.scale == 0:
            return {k: g.detach().clone() for k, g in gradients.items()}
        return {k: (g.detach() + self.noise_like(g, generator)).to(g.dtype)
                for k, g in gradients.items()}


@dataclass(frozen=True)
class GaussianNoise(_AdditiveNoise):
    """``gaussian:SIGMA``: add N(0, SIGMA^2) i.i.d. to every gradient entry."""

    name: ClassVar[str] = "gaussian"
    positional: ClassVar[str | None] = "sigma"
    sigma: float

    def moments(self) -> tuple[float, float]:
        return self.sigma ** 2, 3 * self.sigma ** 4

    def noise_like(self, t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return gaussian_like(t, self.sigma, generator)


@dataclass(frozen=True)
class LaplaceNoise(_AdditiveNoise):
    """``laplace:B``: add Laplace(0, B) i.i.d. to every gradient entry (std = sqrt(2) B)."""

    name: ClassVar[str] = "laplace"
    positional: ClassVar[str | None] = "b"
    b: float

    def moments(self) -> tuple[float, float]:
        return 2 * self.b ** 2, 24 * self.b ** 4  # E n^k = k! b^k for even k

    def noise_like(self, t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return laplace_like(t, self.b, generator)
