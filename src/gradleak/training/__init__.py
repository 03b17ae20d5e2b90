"""Train a victim model under a defense, with checkpoints, so that "accuracy under a defense" and
"attacks at a stage of training" are measured, not guessed: the config (config.py), the
checkpoint files (checkpoints.py) and the training loop (loop.py)."""

from .checkpoints import CHECKPOINT_FORMAT, apply_checkpoint, load_checkpoint, read_checkpoint_meta
from .config import CheckpointInfo, TrainConfig, TrainResult, checkpoint_name
from .loop import evaluate_accuracy, train

__all__ = ["CHECKPOINT_FORMAT", "CheckpointInfo", "TrainConfig", "TrainResult", "apply_checkpoint",
           "checkpoint_name", "evaluate_accuracy", "load_checkpoint", "read_checkpoint_meta", "train"]
