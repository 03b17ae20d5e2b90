"""What a person watching a run sees: the progress bar, and when the observer is called
(it watches the current answer; nothing flows back into the attack)."""

from __future__ import annotations

from typing import Callable

import torch

from .settings import LoopSettings

# observer(iteration, images) with images [K, C, H, W] (or [G, K, C, H, W]) in [0, 1]: lets the
# caller watch progress (e.g. PSNR against a truth it holds); nothing flows back into the attack.
Observer = Callable[[int, torch.Tensor], None]


def progress_bar(settings: LoopSettings):  # noqa: ANN202
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]:.3e}"), TimeElapsedColumn(), TimeRemainingColumn(),
                    transient=False, disable=not settings.progress)


def log_due(done: int, log_every: int, total: int) -> bool:
    """Whether on_log runs after ``done`` steps: every ``log_every`` steps and after the last."""
    return log_every > 0 and (done % log_every == 0 or done == total)


__all__ = ["Observer", "log_due", "progress_bar"]
