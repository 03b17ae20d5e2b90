"""Federated-learning client simulation and the SharedUpdate file format."""

from .client import BNStatisticsRecorder, fedsgd, trainable_parameters
from .files import load_truth, load_update, read_update_meta, save_truth, save_update
from .update import SharedUpdate, UpdateMeta

__all__ = ["BNStatisticsRecorder", "SharedUpdate", "UpdateMeta", "fedsgd", "load_truth", "load_update",
           "read_update_meta", "save_truth", "save_update", "trainable_parameters"]
