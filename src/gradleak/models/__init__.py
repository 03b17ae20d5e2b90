"""Victim models: the papers' small networks, torchvision ResNets, user modules."""

from .registry import (ModelSpec, build_model, default_image_size, describe_models, find_classifier,
                       model_names, model_shapes, register_model)

__all__ = ["ModelSpec", "build_model", "default_image_size", "describe_models", "find_classifier",
           "model_names", "model_shapes", "register_model"]
from . import pretrained as _pretrained  # noqa: F401,E402  registers efficientnet-lite0
