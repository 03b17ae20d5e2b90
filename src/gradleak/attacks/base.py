"""What every image attack shares: settings, initialisation, the observer hook."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from ..errors import ConfigError
from ..models import ModelSpec
from ..runtime import resolve_device

# observer(iteration, images) with images [K, C, H, W] (or [G, K, C, H, W]) in [0, 1]: lets the
# caller watch progress (e.g. PSNR against a truth it holds); nothing flows back into the attack.
Observer = Callable[[int, torch.Tensor], None]
INITS = ("randn", "rand", "zeros")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class AttackSettings:
    """Options common to the image attacks. ``None`` means "the attack's own default".

    The last five are read by the attacks that have them (DLG/iDLG ignore them):
    preset: GradInversion's preset ("paper", "cpu"); seeds: GradInversion's G seeds, or
    Inverting Gradients' restarts; group: "none" | "lazy" | "registered" (GradInversion Eq. 11-12);
    bn: "exact" | "approx" | "none" (GradInversion Eq. 10 targets); labels: the label
    restoration method ("gradinversion" Eq. 8, "sum" Eq. 7, "counts", "llg", "idlg").
    """

    iterations: int | None = None
    lr: float | None = None
    optimizer: str | None = None
    init: str = "randn"
    dtype: str | None = None
    seed: int = 0
    device: str = "cpu"
    log_every: int = 10
    progress: bool = False
    preset: str | None = None
    seeds: int | None = None
    group: str | None = None
    bn: str | None = None
    labels: str | None = None

    def with_defaults(self, **defaults: object) -> "AttackSettings":
        """Fill every field that is None from ``defaults``."""
        return replace(self, **{k: v for k, v in defaults.items() if getattr(self, k) is None})

    def torch_device(self) -> torch.device:
        """The device ("cpu", "cuda", "cuda:N", "auto") as a torch.device (ConfigError if absent)."""
        return resolve_device(self.device)

    def torch_dtype(self) -> torch.dtype:
        try:
            return DTYPES[self.dtype or "float32"]
        except KeyError:
            raise ConfigError(f"dtype: unknown {self.dtype!r}; known: {', '.join(DTYPES)}") from None


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
