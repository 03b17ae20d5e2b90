"""GradInversion's group consistency regularisation (Eq. 11-12)."""

from __future__ import annotations

import torch

from .. import registration
from ..errors import ConfigError
from ..engine.shard import SeedShard

GROUP_MODES = ("none", "lazy", "registered")

#: Eq. 12's F: an unbounded similarity whose raw parameters (tx, ty, angle, log-scale) are in
#: units of 1/16 of the side, 0.25 rad and exp(0.25), so one Adam lr suits all four.
TRANSFORM = registration.Transform("similarity", shift=1.0 / 16, angle=0.25, log_scale=0.25, bounded=False)


def lazy_mean(x: torch.Tensor, shard: SeedShard | None = None) -> torch.Tensor:
    """Pixel-wise consensus: x [G, K, C, H, W] -> [K, C, H, W]. With the seeds spread over
    processes (``shard``), x holds this process's seeds and the mean is over all of them."""
    if shard is None or not shard.distributed:
        return x.mean(dim=0)
    return shard.all_reduce_sum(x.sum(dim=0)) / shard.total


def group_penalty(x: torch.Tensor, consensus: torch.Tensor) -> torch.Tensor:
    """Eq. 11 without alpha_group: ||x_g - E||_2 over candidate g's batch. -> [G]."""
    return (x - consensus.unsqueeze(0)).flatten(1).norm(dim=1)


class Registration:
    """Similarity registration of every candidate image onto the pixel-wise mean (Eq. 12's F)."""

    def __init__(self, shape: tuple[int, ...], *, steps: int = 40, lr: float = 0.05,
                 shard: SeedShard | None = None):
        if len(shape) != 5:
            raise ConfigError(f"registration expects candidates [G, K, C, H, W], got {list(shape)}")
        self.shape = tuple(shape)
        self.steps, self.lr = int(steps), float(lr)
        self.shard = shard  # seeds over processes: each fits its own images to the global mean
        self.theta: torch.Tensor | None = None  # [G*K, 4]; None = identity
        self.fits = 0

    def fit(self, x: torch.Tensor) -> None:
        """Re-estimate the transforms from the identity for candidates x [G, K, C, H, W]:
        F_{x_g -> mean} of Eq. 12, every image x_g[k] registered onto the pixel-wise mean [k]."""
        g, k, c, h, w = x.shape
        src = x.detach().reshape(g * k, c, h, w)
        target = lazy_mean(x.detach(), self.shard).unsqueeze(0).expand(g, k, c, h, w).reshape(g * k, c, h, w)
        self.theta = registration.fit(src, target, TRANSFORM, registration.Schedule(steps=self.steps, lr=self.lr))
        self.fits += 1

    def get_state(self) -> dict[str, object]:
        """The transforms and fit count (for resumable runs, see engine/state.py)."""
        return {"theta": self.theta, "fits": self.fits}

    def set_state(self, state: dict[str, object]) -> None:
        theta, fits = state.get("theta"), state.get("fits")
        g, k = self.shape[:2]
        if theta is not None and not (isinstance(theta, torch.Tensor) and theta.shape == (g * k, 4)
                                      and theta.is_floating_point()):
            raise ValueError(f"registration transforms must be [{g * k}, 4], got "
                             f"{list(theta.shape) if isinstance(theta, torch.Tensor) else type(theta).__name__}")
        if not isinstance(fits, int) or fits < 0:
            raise ValueError("registration fit count must be an integer >= 0")
        self.theta, self.fits = theta, fits

    def registered(self, x: torch.Tensor) -> torch.Tensor:
        """Every candidate warped by its current transform, [G, K, C, H, W]."""
        if self.theta is None:
            return x
        g, k, c, h, w = x.shape
        return registration.warp(x.reshape(g * k, c, h, w), self.theta, TRANSFORM).reshape(g, k, c, h, w)

    def consensus(self, x: torch.Tensor) -> torch.Tensor:
        """Eq. 12: (1/G) sum_g F_g(x_g) -> [K, C, H, W]."""
        return lazy_mean(self.registered(x), self.shard)


class GroupConsistency:
    """The consensus target and penalty of Eq. 11-12 for one attack run.

    ``consensus(x)`` is recomputed from the detached candidates whenever asked;
    ``maybe_register(step, x)`` re-estimates the registration on schedule.
    """

    def __init__(self, mode: str, shape: tuple[int, ...], *, start: int, every: int, steps: int = 40,
                 shard: SeedShard | None = None):
        if mode not in GROUP_MODES:
            raise ConfigError(f"group: unknown mode {mode!r}; known: {', '.join(GROUP_MODES)}")
        if every < 1 or start < 0:
            raise ConfigError("group: registration start must be >= 0 and every >= 1")
        self.mode, self.start, self.every = mode, int(start), int(every)
        self.shard = shard  # None or world 1: all G seeds are in ``x``; else this process's slice
        self.registration = Registration(shape, steps=steps, shard=shard) if mode == "registered" else None

    @property
    def active(self) -> bool:
        return self.mode != "none"

    def maybe_register(self, step: int, x: torch.Tensor) -> bool:
        """After step ``step`` (0-based): re-fit the transforms if due. True if it did."""
        if self.registration is None or step + 1 < self.start or (step + 1 - self.start) % self.every:
            return False
        self.registration.fit(x)
        return True

    def get_state(self) -> dict[str, object]:
        """What the next steps depend on: the registration's transforms (engine/state.py)."""
        return {"registration": self.registration.get_state() if self.registration is not None else None}

    def set_state(self, state: dict[str, object]) -> None:
        saved = state.get("registration")
        if (saved is None) != (self.registration is None):
            raise ValueError("group mode differs between the saved state and this run")
        if self.registration is not None:
            if not isinstance(saved, dict):
                raise ValueError("registration state is malformed")
            self.registration.set_state(saved)

    def consensus(self, x: torch.Tensor) -> torch.Tensor:
        x = x.detach()
        if self.registration is not None:
            return self.registration.consensus(x)
        return lazy_mean(x, self.shard)
