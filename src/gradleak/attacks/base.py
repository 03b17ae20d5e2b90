"""What every image attack shares: precisions, initialisation, the observer hook."""

from __future__ import annotations

from typing import Any

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


def start_images(model: ModelSpec, shape: tuple[int, ...], init: str, generator: torch.Generator,
                 dtype: torch.dtype, start: Any = None, labels: torch.Tensor | None = None) -> torch.Tensor:
    """An optimisation's start, shape ``shape`` (..., K, C, H, W), in the model's input space: the
    attack's own init (:func:`initial_images`, drawn in every case so that the generator's stream
    goes on as in any run), or the engine's ``start`` batch (engine.StartBatch) for every seed,
    its images put into the slots whose ``labels`` [K] (the attack's hard labels) match theirs."""
    x = initial_images(model, shape, init, generator, dtype)
    if start is None:
        return x
    images = start.images[slot_order(start.labels, labels)] if labels is not None else start.images
    if tuple(images.shape) != tuple(shape[-4:]):
        raise ConfigError(f"the start batch has shape {tuple(images.shape)}, the attack's images {tuple(shape[-4:])}")
    return model.normalize(images.detach().cpu().to(dtype)).expand(shape).clone()


def slot_order(start_labels: torch.Tensor, slot_labels: torch.Tensor) -> torch.Tensor:
    """[K] indices into the start batch: slot i gets an unused start image labelled
    ``slot_labels[i]`` where there is one, the rest in order."""
    have = [int(v) for v in start_labels.reshape(-1).tolist()]
    want = [int(v) for v in slot_labels.reshape(-1).tolist()]
    free, order = list(range(len(have))), [-1] * len(want)
    for i, label in enumerate(want):
        j = next((j for j in free if have[j] == label), None)
        if j is not None:
            order[i] = j
            free.remove(j)
    for i in range(len(want)):
        if order[i] < 0 and free:
            order[i] = free.pop(0)
    return torch.tensor([o if o >= 0 else i for i, o in enumerate(order)], dtype=torch.long)


def to_pixels(model: ModelSpec, x: torch.Tensor) -> torch.Tensor:
    """Model input space -> [0, 1] float32 pixels on the CPU."""
    return model.denormalize(x.detach()).clamp(0, 1).float().cpu()
