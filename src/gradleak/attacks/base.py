"""What every image attack shares: precisions, initialisation, the observer hook."""

from __future__ import annotations

import torch

from ..errors import ConfigError
from ..models import ModelSpec

INITS = ("randn", "rand", "zeros")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def initial_images(model: ModelSpec, shape: tuple[int, ...], init: str, generator: torch.Generator,
                   dtype: torch.dtype) -> torch.Tensor:
    """Dummy inputs in the model's normalised input space, shape ``shape`` (..., C, H, W).

    randn: N(0, I) in input space (DLG's code, GradInversion Sec. 4); rand: U(0, 1) pixels;
    zeros: mid-grey pixels.
    """
    if init == "randn":
        return torch.randn(shape, generator=generator, dtype=dtype)
    if init == "rand":
        return model.normalize(torch.rand(shape, generator=generator, dtype=dtype))
    if init == "zeros":
        return model.normalize(torch.full(shape, 0.5, dtype=dtype))
    raise ConfigError(f"init: unknown {init!r}; known: {', '.join(INITS)}")


def to_pixels(model: ModelSpec, x: torch.Tensor) -> torch.Tensor:
    """Model input space -> [0, 1] float32 pixels on the CPU."""
    return model.denormalize(x.detach()).clamp(0, 1).float().cpu()
