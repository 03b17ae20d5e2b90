"""Precision while an attack runs: IEEE float32 on CUDA (never TF32), restored afterwards, so that
GPU gradient distances have no TF32 floor and match CPU runs up to rounding."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch



@contextlib.contextmanager
def ieee_float32(device: torch.device) -> Iterator[None]:
    """While an attack runs on CUDA: float32 convolutions (cuDNN) and matmuls (cuBLAS) in IEEE
    float32, not TF32; the previous settings come back afterwards. Nothing changes on a CPU.

    Set through torch's legacy flags (``cudnn.allow_tf32``, ``cuda.matmul.allow_tf32``) so that
    code reading them during the attack (an observer, ``torch.backends.cudnn.flags()``) still can:
    after the per-backend ``fp32_precision`` API is used, torch refuses to read the legacy flags.
    Where the process's flags were already set through that API in a way the legacy flags cannot
    express, the API itself is used. The flags are process-wide: two attacks in threads of one
    process share them (gradleak runs attacks in processes, or one at a time under a lock)."""
    if torch.device(device).type != "cuda":
        yield
        return
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    try:
        legacy = (cudnn.allow_tf32, matmul.allow_tf32)
    except RuntimeError:  # mixed legacy / new settings: only the new API can restore them
        legacy = None
    if legacy is not None:
        cudnn.allow_tf32, matmul.allow_tf32 = False, False
        try:
            yield
        finally:
            cudnn.allow_tf32, matmul.allow_tf32 = legacy
        return
    saved = (cudnn.conv.fp32_precision, matmul.fp32_precision)
    cudnn.conv.fp32_precision, matmul.fp32_precision = "ieee", "ieee"
    try:
        yield
    finally:
        cudnn.conv.fp32_precision, matmul.fp32_precision = saved


__all__ = ["ieee_float32"]
