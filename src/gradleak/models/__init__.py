"""Victim models: the papers' small networks, torchvision ResNets, user modules."""

from .registry import build_model, default_image_size, describe_models, model_names, model_shapes, register_model
from .spec import ModelSpec, find_classifier

__all__ = ["ModelSpec", "build_model", "default_image_size", "describe_models", "find_classifier",
           "model_names", "model_shapes", "register_model"]
from . import pretrained as _pretrained  # noqa: F401,E402  registers efficientnet-lite0
