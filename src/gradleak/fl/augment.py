"""The FedAvg client's data augmentation: random crops with zero padding and horizontal flips,
drawn privately per sample and step, as torchvision's RandomCrop(size, padding) followed by
RandomHorizontalFlip() do on images in [0, 1] (before Normalize)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ConfigError

AUGMENTS = ("none", "flip", "crop-flip")


def check_augment(policy: str, padding: int) -> None:
    if policy not in AUGMENTS:
        raise ConfigError(f"local augment {policy!r}; known: {', '.join(AUGMENTS)}")
    if not 0 <= padding <= 64:
        raise ConfigError(f"local_crop_padding {padding} is not in 0..64")


def augment(images: torch.Tensor, policy: str, padding: int, generator: torch.Generator) -> torch.Tensor:
    """images [n, C, H, W] in [0, 1] -> the same, each sample cropped (``crop-flip``: offsets
    drawn uniformly in 0..2*padding on a zero-padded copy) then flipped left-right with
    probability 1/2 (``flip``, ``crop-flip``); draws from ``generator`` (the client's own)."""
    if policy == "none":
        return images
    n, _, h, w = images.shape
    out = images
    if policy == "crop-flip" and padding > 0:
        offsets = torch.randint(0, 2 * padding + 1, (n, 2), generator=generator)
        padded = F.pad(images, (padding, padding, padding, padding))  # torchvision's fill 0, "constant"
        out = torch.stack([padded[k, :, int(i):int(i) + h, int(j):int(j) + w] for k, (i, j) in enumerate(offsets)])
    flip = torch.rand(n, generator=generator) < 0.5
    return torch.where(flip.to(out.device)[:, None, None, None], out.flip(-1), out)


__all__ = ["AUGMENTS", "augment", "check_augment"]
