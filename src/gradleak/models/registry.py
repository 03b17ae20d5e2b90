"""Named victim models. The attacker rebuilds the architecture from the public name in the
shared update and loads the global weights the client received."""

from __future__ import annotations

import functools
import importlib
import inspect
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ..catalog import unknown
from ..errors import ModelMismatchError, UnknownNameError
from ..specs import declarations
from .small import MLP, ConvNet, LeNetDLG
from .spec import ModelSpec

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _per_channel(values: tuple[float, ...], channels: int) -> tuple[float, ...]:
    if channels == len(values):
        return tuple(values)
    return (sum(values) / len(values),) * channels


def _lenet(num_classes: int, channels: int, image_size: int, **kw: Any) -> nn.Module:
    return LeNetDLG(num_classes=num_classes, channels=channels, image_size=image_size)


def _convnet(num_classes: int, channels: int, image_size: int, width: int | None = None, **kw: Any) -> nn.Module:
    if image_size < 8:
        raise ModelMismatchError("convnet needs images of at least 8 px")
    return ConvNet(num_classes=num_classes, channels=channels, width=width or 32)


def _mlp(num_classes: int, channels: int, image_size: int, width: int | None = None, **kw: Any) -> nn.Module:
    return MLP(num_classes=num_classes, channels=channels, image_size=image_size, width=width or 1024)


def _torchvision_resnet(arch: str, cifar_stem: bool) -> Callable[..., nn.Module]:
    def build(num_classes: int, channels: int, image_size: int, **kw: Any) -> nn.Module:
        import torchvision

        net = getattr(torchvision.models, arch)(weights=None, num_classes=num_classes)
        if cifar_stem or channels != 3:
            stride = 1 if cifar_stem else 2
            k, p = (3, 1) if cifar_stem else (7, 3)
            net.conv1 = nn.Conv2d(channels, 64, kernel_size=k, stride=stride, padding=p, bias=False)
        if cifar_stem:
            net.maxpool = nn.Identity()
        return net

    return build


_resnet18 = _torchvision_resnet("resnet18", False)
_resnet50 = _torchvision_resnet("resnet50", False)
_resnet18_cifar = _torchvision_resnet("resnet18", True)

# The models whose builders live here, declared as any module under models/ declares its own
# (specs.declarations("model") reads them without torch): build, the builder's name in the module,
# ``build(num_classes, channels, image_size, **kwargs) -> nn.Module``; image_size, its default
# side; mean and std, its input normalisation per channel. mean 0 / std 1 for LeNet: the DLG code
# feeds ToTensor() pixels without normalisation. The ResNets: ImageNet's mean and std.
SPEC = [
    {"name": "convnet", "summary": "small CNN with BatchNorm (--width, default 32)", "build": "_convnet",
     "image_size": 32, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
    {"name": "lenet-dlg", "summary": "DLG paper's LeNet, sigmoid, U(-0.5,0.5) weights", "build": "_lenet",
     "image_size": 32, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0]},
    {"name": "mlp", "summary": "fully connected: Linear(C*H*W, width) - ReLU - Linear (--width, default 1024)",
     "build": "_mlp", "image_size": 32, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
    {"name": "resnet18", "summary": "torchvision ResNet-18", "build": "_resnet18", "image_size": 224,
     "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
    {"name": "resnet18-cifar", "summary": "ResNet-18 with a 3x3 stem for 32 px", "build": "_resnet18_cifar",
     "image_size": 32, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
    {"name": "resnet50", "summary": "torchvision ResNet-50", "build": "_resnet50", "image_size": 224,
     "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
]


@dataclass(frozen=True)
class _Entry:
    build: Callable[..., nn.Module]
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    description: str


# The models added with :func:`register_model` (beside the declared ones).
_ADDED: dict[str, _Entry] = {}


@functools.cache
def _declared() -> dict[str, _Entry]:
    """The declared models, their modules imported on first use."""
    entries = {}
    for name, d in declarations("model").items():
        build = getattr(importlib.import_module(d.module), d.get("build"))
        entries[name] = _Entry(build, int(d.get("image_size")), tuple(d.get("mean")), tuple(d.get("std")), d.summary)
    return entries


def _registry() -> dict[str, _Entry]:
    """Every named model: the declared ones, then those added with :func:`register_model`."""
    return {**_declared(), **_ADDED}


def register_model(name: str, build: Callable[..., nn.Module], image_size: int,
                   mean: tuple[float, ...], std: tuple[float, ...], description: str = "") -> None:
    """Add a named model: ``build(num_classes, channels, image_size, **kwargs) -> nn.Module``."""
    _ADDED[name] = _Entry(build, image_size, mean, std, description)


def model_names() -> list[str]:
    return sorted(_registry())


def describe_models() -> dict[str, str]:
    return {k: v.description for k, v in sorted(_registry().items())}


def default_image_size(name: str) -> int:
    if name in _registry():
        return _registry()[name].image_size
    if ":" in name:
        return 32
    raise unknown("model", name, model_names(), " or package.module:callable")


def _user_model(spec: str, num_classes: int, channels: int, image_size: int, **kw: Any) -> nn.Module:
    mod_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UnknownNameError(f"cannot import model {spec!r}: {exc}") from None
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    offered = {"num_classes": num_classes, "channels": channels, "image_size": image_size, **kw}
    accepts_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    args = offered if accepts_kw else {k: v for k, v in offered.items() if k in params}
    net = factory(**args)
    if not isinstance(net, nn.Module):
        raise ModelMismatchError(f"{spec} returned {type(net).__name__}, not a torch.nn.Module")
    return net


def build_model(name: str, *, num_classes: int, channels: int = 3, image_size: int | None = None,
                seed: int = 0, width: int | None = None, server: str | None = None) -> ModelSpec:
    """Build a named victim model with weights drawn reproducibly from ``seed``.

    ``name`` is a registry name or ``package.module:callable`` (a user's nn.Module factory; it
    receives whichever of num_classes, channels, image_size it accepts, and is normalised with
    mean 0.5 / std 0.5 per channel).
    """
    if num_classes < 2:
        raise ModelMismatchError(f"num_classes must be >= 2, got {num_classes}")
    size = image_size or default_image_size(name)
    if size < 4 or size > 1024:
        raise ModelMismatchError(f"image size {size} is out of range (4..1024)")
    kwargs: dict[str, Any] = {}
    if width is not None:
        kwargs["width"] = int(width)
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # weight init draws from the global generator; restored below
    try:
        if name in _registry():
            entry = _registry()[name]
            if width is not None and "width" not in inspect.signature(entry.build).parameters:
                takes = ", ".join(n for n, e in _registry().items() if "width" in inspect.signature(e.build).parameters)
                raise ModelMismatchError(f"--width applies to models with a width ({takes}), not to {name}")
            module = entry.build(num_classes=num_classes, channels=channels, image_size=size, **kwargs)
            mean, std = _per_channel(entry.mean, channels), _per_channel(entry.std, channels)
        elif ":" in name:
            module = _user_model(name, num_classes, channels, size, **kwargs)
            mean, std = (0.5,) * channels, (0.5,) * channels
        else:
            raise unknown("model", name, model_names(), " or package.module:callable")
    finally:
        torch.random.set_rng_state(gen_state)
    spec = ModelSpec(name=name, module=module, input_shape=(channels, size, size), num_classes=num_classes,
                     mean=mean, std=std, kwargs=kwargs)
    if server is not None:  # what a (malicious) server sends instead (models/server.py)
        from .server import server_model

        spec = server_model(spec, server)
    _check_runs(spec)
    return spec


def normalisation(name: str, channels: int = 3) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) per channel of model ``name``'s input normalisation, without building it (a
    ``module:callable`` model: 0.5 / 0.5, as :func:`build_model` normalises it)."""
    if name in _registry():
        entry = _registry()[name]
        return _per_channel(entry.mean, channels), _per_channel(entry.std, channels)
    if ":" in name:
        return (0.5,) * channels, (0.5,) * channels
    raise unknown("model", name, model_names(), " or package.module:callable")


def model_shapes(name: str, *, num_classes: int, channels: int = 3, image_size: int | None = None,
                 width: int | None = None, server: str | None = None
                 ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(state dict, trainable parameters) of a registry model as meta tensors: shapes and
    dtypes without allocating memory, to check a file's declared tensors before the model is
    built for real. A ``module:callable`` model is built for real (its code is the user's)."""
    if name not in _registry():
        spec = build_model(name, num_classes=num_classes, channels=channels, image_size=image_size, width=width,
                           server=server)
        module = spec.module
    else:
        if num_classes < 2:
            raise ModelMismatchError(f"num_classes must be >= 2, got {num_classes}")
        size = image_size or default_image_size(name)
        if size < 4 or size > 1024:
            raise ModelMismatchError(f"image size {size} is out of range (4..1024)")
        kwargs = {"width": int(width)} if width is not None else {}
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")  # pretrained weights copied onto meta tensors: a no-op
            module = _registry()[name].build(num_classes=num_classes, channels=channels, image_size=size, **kwargs)
            if server is not None:
                from .server import server_model

                entry = _registry()[name]
                module = server_model(ModelSpec(name, module, (channels, size, size), num_classes,
                                                _per_channel(entry.mean, channels), _per_channel(entry.std, channels)),
                                      server).module
    state = dict(module.state_dict())
    params = {n: p for n, p in module.named_parameters() if p.requires_grad}
    return state, params


def _check_runs(spec: ModelSpec) -> None:
    """One tiny forward pass so shape errors surface as a clear message, not deep in an attack."""
    was_training = spec.module.training
    spec.module.eval()
    try:
        with torch.no_grad():
            out = spec.module(torch.zeros(1, *spec.input_shape))
    except Exception as exc:  # noqa: BLE001 - any failure here is a model/input mismatch
        raise ModelMismatchError(f"model {spec.name} does not accept input {spec.input_shape}: {exc}") from None
    finally:
        spec.module.train(was_training)
    if out.shape != (1, spec.num_classes):
        raise ModelMismatchError(f"model {spec.name} returns {tuple(out.shape)}, expected (1, {spec.num_classes})")
