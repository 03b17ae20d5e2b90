"""The optimisers the loop steps with, and the memory bound on their state."""

from __future__ import annotations

import torch

from ..errors import ConfigError
from ..optim import SGD, Adam
from .lbfgs import CompactLBFGS
from .settings import LoopSettings


# The optimiser's own state grows with the variables: L-BFGS keeps lbfgs_history pairs (s, y) of
# their size (2 m n values, allocated at its first step), Adam two moments, SGD one momentum. The
# variables' size comes from the update's metadata (K images, K x classes soft labels): a batch of
# 4096 32 px images, which the update file's bounds allow, would make DLG's L-BFGS (m = 100, float64)
# allocate 20 GiB. Above MAX_OPTIMIZER_BYTES the run is refused (ConfigError) before anything is
# allocated; DLG's L-BFGS at float64 then takes up to 2.7 M values (873 images of 32 px).
MAX_OPTIMIZER_BYTES = 4 * 2**30


def optimizer_bytes(values: int, itemsize: int, settings: LoopSettings) -> int:
    """The optimiser state's memory for ``values`` variables of ``itemsize`` bytes."""
    copies = {"lbfgs": 2 * settings.lbfgs_history, "adam": 2, "sgd": 1}.get(settings.optimizer, 2)
    return copies * values * itemsize


def check_optimizer_memory(values: int, itemsize: int, settings: LoopSettings) -> None:
    """ConfigError when the optimiser's state for ``values`` variables is over MAX_OPTIMIZER_BYTES."""
    need = optimizer_bytes(values, itemsize, settings)
    if need > MAX_OPTIMIZER_BYTES:
        extra = (f"{2 * settings.lbfgs_history} x {values} values of L-BFGS history" if settings.optimizer == "lbfgs"
                 else f"the state of {values} values")
        raise ConfigError(f"{settings.description}: the optimiser would need {need / 2**30:.3g} GiB ({extra}), more "
                          f"than the bound of {MAX_OPTIMIZER_BYTES / 2**30:.3g} GiB; attack a smaller batch"
                          + (" or use --optimizer adam" if settings.optimizer == "lbfgs" else ""))


def make_optimizer(variables: list[torch.Tensor], settings: LoopSettings) -> torch.optim.Optimizer:
    if variables:
        check_optimizer_memory(sum(v.numel() for v in variables), max(v.element_size() for v in variables), settings)
    if settings.optimizer == "lbfgs":
        # torch's L-BFGS algorithm with the compact (matrix) form of its direction (lbfgs.py)
        return CompactLBFGS(
            variables, lr=settings.lr, max_iter=settings.lbfgs_max_iter,
            history_size=settings.lbfgs_history, line_search_fn=settings.lbfgs_line_search,
            tolerance_grad=settings.lbfgs_tolerance_grad, tolerance_change=settings.lbfgs_tolerance_change)
    if settings.optimizer == "adam":  # torch's Adam and SGD without the torch._dynamo import (optim.py)
        return Adam(variables, lr=settings.lr)
    return SGD(variables, lr=settings.lr, momentum=0.9)


__all__ = ["MAX_OPTIMIZER_BYTES", "check_optimizer_memory", "make_optimizer", "optimizer_bytes"]
