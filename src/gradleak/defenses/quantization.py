"""Lower-precision transport of the gradients (DLG rebuttal Table 3: FP-16, 8 bit)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import NonFiniteError
from .base import Defense, Residual, uniform_rounding

INT8_LEVELS = 127


# Declared for the catalog (read without torch). "averages": False: a mean of quantised updates
# is off their grid, so the noise floor does not model an aggregate (defenses/floor.py).
SPEC = [
    {"name": "fp16", "class": "FP16", "summary": "cast each gradient to float16 and back", "parameters": {},
     "averages": False},
    {"name": "int8", "class": "Int8", "summary": "symmetric per-tensor 8-bit quantisation, then dequantisation",
     "parameters": {}, "averages": False},
]


@dataclass(frozen=True)
class FP16(Defense):
    """``fp16``: cast each gradient to float16 and back, as a float16 transport would.

    Exactly ``g.to(float16).to(g.dtype)``: round to nearest even; magnitudes above 65504 become
    +-inf (as on the wire) and below ~6e-8 flush to zero.
    """

    name: ClassVar[str] = "fp16"

    def residual(self, shared: list[torch.Tensor], client_batch: int) -> Residual:
        # the float16 grid around each shared value: spacing 2^(e - 11) for |t| = m 2^e, m in
        # [0.5, 1), at least 2^-24 (subnormals); a value flushed to 0 was below 2^-25
        halves = []
        for t in shared:
            _, e = torch.frexp(t.detach().double())
            step = torch.exp2((e - 11).clamp(min=-24).double())
            halves.append(torch.where(t == 0, torch.full_like(step, 2.0 ** -25), step / 2).reshape(-1))
        return uniform_rounding(torch.cat(halves)) if halves else Residual(0.0, 0.0)

    def transform(self, gradients: dict[str, torch.Tensor],
                  generator: torch.Generator) -> dict[str, torch.Tensor]:
        return {k: g.detach().to(torch.float16).to(g.dtype) for k, g in gradients.items()}


def int8_scale(g: torch.Tensor) -> torch.Tensor:
    """Symmetric per-tensor step: max|g| / 127 (0-dim tensor, g's dtype at least float32)."""
    return g.detach().abs().amax().to(torch.promote_types(g.dtype, torch.float32)) / INT8_LEVELS


@dataclass(frozen=True)
class Int8(Defense):
    """``int8``: symmetric per-tensor 8-bit quantisation, then dequantisation.

    scale = max|g| / 127; q = round(g / scale) in [-127, 127] (round half to even); the server
    sees q * scale, so each entry is on the grid scale * Z and within scale / 2 of the original.
    An all-zero tensor stays zero.
    """

    name: ClassVar[str] = "int8"

    def residual(self, shared: list[torch.Tensor], client_batch: int) -> Residual:
        # the largest entry lands on +-127 * scale exactly, so the shared tensor gives back its
        # scale; every entry is within scale / 2 of the original
        # an entry shared as exactly 0 may have been 0 (a dead ReLU row): counted as no error, which
        # errs on a lower floor ("inconclusive"), never on "defended" (measured on mlp updates: a floor
        # that counted them was 2.2x the real residual)
        halves = [torch.where(t.reshape(-1) == 0, 0.0, float(int8_scale(t)) / 2).double() for t in shared]
        return uniform_rounding(torch.cat(halves)) if halves else Residual(0.0, 0.0)

    def transform(self, gradients: dict[str, torch.Tensor],
                  generator: torch.Generator) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for k, g in gradients.items():
            scale = int8_scale(g)
            if not bool(torch.isfinite(scale)):
                raise NonFiniteError(f"defense int8: gradient {k} holds NaN or Inf; cannot quantise it")
            if float(scale) == 0.0:
                out[k] = g.detach().clone()
                continue
            x = g.detach().to(scale.dtype)
            q = torch.round(x / scale).clamp_(-INT8_LEVELS, INT8_LEVELS)
            out[k] = (q * scale).to(g.dtype)
        return out
