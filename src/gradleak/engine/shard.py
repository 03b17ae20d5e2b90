"""GradInversion's G seeds spread over processes: the slice of seeds one process owns and the few
collectives the attack needs (torch.distributed; gloo on CPU, NCCL on GPU)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError


@dataclass(frozen=True)
class SeedShard:
    """Seeds [0, total) split into ``world`` contiguous slices (sizes differ by at most one);
    this process (``rank``) owns ``local_range``. ``device`` is where collectives run (a CUDA
    device under NCCL, None: the CPU)."""

    total: int
    world: int = 1
    rank: int = 0
    device: torch.device | None = None

    def __post_init__(self) -> None:
        if self.total < 1 or self.world < 1:
            raise ConfigError("seed shard: seeds and processes must be >= 1")
        if self.world > self.total:
            raise ConfigError(f"{self.world} processes for {self.total} seeds: every process needs at least one "
                              f"seed (use --nproc <= --seeds)")
        if not 0 <= self.rank < self.world:
            raise ConfigError(f"seed shard: rank {self.rank} outside a world of {self.world}")

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def bounds(self, rank: int) -> tuple[int, int]:
        return rank * self.total // self.world, (rank + 1) * self.total // self.world

    @property
    def local_range(self) -> range:
        return range(*self.bounds(self.rank))

    @property
    def counts(self) -> list[int]:
        return [b - a for a, b in (self.bounds(r) for r in range(self.world))]

    def owner(self, seed: int) -> int:
        """The rank that owns global seed index ``seed``."""
        return next(r for r in range(self.world) if self.bounds(r)[0] <= seed < self.bounds(r)[1])

    # -- collectives (identities when world == 1)
    def _comm(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(self.device if self.device is not None else "cpu").contiguous()

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """The sum of ``t`` over all processes (the same tensor on every one)."""
        if not self.distributed:
            return t
        import torch.distributed as dist

        buf = self._comm(t).clone()
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        return buf.to(t.device)

    def any(self, flag: bool) -> bool:
        """True on every process when ``flag`` is true on any."""
        if not self.distributed:
            return flag
        return bool(self.all_reduce_sum(torch.tensor([1.0 if flag else 0.0]))[0] > 0)

    def all_gather_seeds(self, t: torch.Tensor) -> torch.Tensor:
        """Local per-seed values [n_local, ...] -> every seed's [total, ...] on every process."""
        if not self.distributed:
            return t
        import torch.distributed as dist

        buf = self._padded(t)
        parts = [torch.empty_like(buf) for _ in range(self.world)]
        dist.all_gather(parts, buf)
        return torch.cat([p[:n] for p, n in zip(parts, self.counts, strict=True)]).to(t.device)

    def gather_seeds(self, t: torch.Tensor, dst: int = 0) -> torch.Tensor | None:
        """Local per-seed tensors [n_local, ...] -> every seed's [total, ...] on rank ``dst``;
        None on the others."""
        if not self.distributed:
            return t
        import torch.distributed as dist

        buf = self._padded(t)
        parts = [torch.empty_like(buf) for _ in range(self.world)] if self.rank == dst else None
        dist.gather(buf, parts, dst=dst)
        if parts is None:
            return None
        return torch.cat([p[:n] for p, n in zip(parts, self.counts, strict=True)]).to(t.device)

    def seed_tensor(self, t: torch.Tensor, seed: int) -> torch.Tensor:
        """Global seed ``seed``'s slice of the local per-seed tensor ``t`` [n_local, ...], sent by
        its owner to every process."""
        start = self.local_range.start
        if not self.distributed:
            return t[seed - start]
        import torch.distributed as dist

        src = self.owner(seed)
        buf = self._comm(t[seed - start]) if self.rank == src else \
            torch.empty(t.shape[1:], dtype=t.dtype, device=self.device if self.device is not None else "cpu")
        dist.broadcast(buf, src=src)
        return buf.to(t.device)

    def _padded(self, t: torch.Tensor) -> torch.Tensor:
        buf = self._comm(t)
        most = max(self.counts)
        if buf.shape[0] < most:
            buf = torch.cat([buf, buf.new_zeros((most - buf.shape[0], *buf.shape[1:]))])
        return buf


__all__ = ["SeedShard"]
