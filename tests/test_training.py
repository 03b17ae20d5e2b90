"""gradleak.training: defended SGD training on real Fashion-MNIST, checkpoints, and their loading."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save

from gradleak.defenses import dp_epsilon
from gradleak.errors import ConfigError, ModelMismatchError, NonFiniteError, UnknownNameError, UpdateFileError
from gradleak.models import build_model
from gradleak.training import (TrainConfig, apply_checkpoint, checkpoint_name, evaluate_accuracy, load_checkpoint,
                               read_checkpoint_meta, train)
from gradleak.training.loop import _decode, _derive_seed


# DLG's sigmoid LeNet with U(-0.5, 0.5) weights needs a small lr; ~190 steps of batch 32 reach ~65 %.
FAST = dict(model="lenet-dlg", train_subset=2000, test_subset=1000, epochs=3.0, batch_size=32, lr=0.01)
FRACTIONS = (0.0, 0.3, 0.7, 1.0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cfg = TrainConfig(**FAST, checkpoints=FRACTIONS)
    return train(cfg, tmp_path_factory.mktemp("train-clean"))


@pytest.fixture(scope="module")
def trained_noisy(tmp_path_factory):
    cfg = TrainConfig(**FAST, checkpoints=(0.0, 1.0), defense=("gaussian:1.0",))
    return train(cfg, tmp_path_factory.mktemp("train-gauss"))


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# ------------------------------------------------------------------ training works
def test_training_raises_accuracy_well_above_chance(trained):
    first, last = trained.checkpoints[0], trained.checkpoints[-1]
    assert first.step == 0 and first.test_accuracy <= 0.2  # random init: near chance (0.1)
    assert last.step == trained.total_steps
    assert trained.final_accuracy == last.test_accuracy
    assert trained.final_accuracy >= 0.5
    assert len(trained.losses) == trained.total_steps
    assert sum(trained.losses[-10:]) / 10 < sum(trained.losses[:10]) / 10 - 0.5


def test_checkpoints_at_the_asked_fractions(trained):
    total = trained.total_steps
    assert trained.steps_per_epoch == 2000 // 32 and total == round(3 * 62)
    assert [c.fraction for c in trained.checkpoints] == list(FRACTIONS)
    steps = [c.step for c in trained.checkpoints]
    assert steps == [round(f * total) for f in FRACTIONS]
    assert steps == sorted(set(steps))  # strictly increasing
    for c in trained.checkpoints:
        assert c.path == trained.out / checkpoint_name(c.fraction) and c.path.is_file()
        meta = read_checkpoint_meta(c.path)
        assert meta["format"] == "gradleak.checkpoint" and meta["step"] == c.step
        assert meta["fraction"] == c.fraction and meta["test_accuracy"] == c.test_accuracy
        assert meta["epochs"] == pytest.approx(c.step / 62)
        assert meta["model"] == "lenet-dlg" and meta["input_shape"] == (1, 32, 32) and meta["num_classes"] == 10
        assert meta["defenses"] == [] and meta["data"]["train_images"] == 2000
    assert (trained.out / "checkpoint-0.30.safetensors").is_file()
    summary = json.loads((trained.out / "training.json").read_text())
    assert summary["config"]["lr"] == 0.01 and summary["total_steps"] == total
    assert [c["step"] for c in summary["checkpoints"]] == steps
    assert summary["final_test_accuracy"] == trained.final_accuracy and summary["wall_seconds"] > 0
    assert summary["privacy"] is None and len(summary["loss"]) == total
    assert (trained.out / "training.png").stat().st_size > 1000


def test_checkpoint_zero_is_the_initial_model(trained):
    spec, meta = load_checkpoint(trained.checkpoints[0].path)
    fresh = build_model("lenet-dlg", num_classes=10, channels=1, image_size=32, seed=0)
    _assert_same_state(_state(spec.module), _state(fresh.module))


def test_load_checkpoint_round_trips_exactly(trained):
    spec, meta = load_checkpoint(trained.checkpoints[-1].path)
    _assert_same_state(_state(spec.module), _state(trained.model.module))
    assert not spec.module.training
    assert (spec.name, spec.input_shape, spec.num_classes) == ("lenet-dlg", (1, 32, 32), 10)
    assert meta["step"] == trained.total_steps


def test_apply_checkpoint(trained):
    model = build_model("lenet-dlg", num_classes=10, channels=1, image_size=32, seed=123)
    meta = apply_checkpoint(model, trained.checkpoints[2].path)
    assert meta["fraction"] == 0.7
    ref, _ = load_checkpoint(trained.checkpoints[2].path)
    _assert_same_state(_state(model.module), _state(ref.module))
    # the stored accuracy is the model's accuracy on the same (seeded) test subset
    from gradleak.data import open_source

    test = open_source("fashion-mnist", split="test")
    idx = sorted(torch.randperm(len(test), generator=torch.Generator().manual_seed(0))[:1000].tolist())
    data = _decode(test, idx, 32, 1)
    assert evaluate_accuracy(model, data.pixels, data.labels) == pytest.approx(meta["test_accuracy"])


@pytest.mark.parametrize("other", [
    dict(name="convnet", num_classes=10, channels=1, image_size=32, width=4),
    dict(name="lenet-dlg", num_classes=10, channels=1, image_size=28),
    dict(name="lenet-dlg", num_classes=10, channels=3, image_size=32),
    dict(name="lenet-dlg", num_classes=5, channels=1, image_size=32),
])
def test_apply_checkpoint_refuses_another_architecture(trained, other):
    model = build_model(other.pop("name"), **other)
    before = _state(model.module)
    with pytest.raises(ModelMismatchError, match="checkpoint is for"):
        apply_checkpoint(model, trained.checkpoints[-1].path)
    _assert_same_state(_state(model.module), before)


# ------------------------------------------------------------------ untrusted checkpoint files
def _rewrite(src: Path, dst: Path, change) -> Path:  # noqa: ANN001
    with safe_open(str(src), framework="pt") as f:
        md = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    md = change(tensors, md) or md
    dst.write_bytes(save(tensors, metadata=md))
    return dst


def test_bad_checkpoint_files_raise_typed_errors(trained, tmp_path):
    good = trained.checkpoints[-1].path
    data = good.read_bytes()

    with pytest.raises(UpdateFileError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.safetensors")
    (tmp_path / "trunc.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(UpdateFileError):
        load_checkpoint(tmp_path / "trunc.safetensors")
    (tmp_path / "tiny.safetensors").write_bytes(data[:5])
    with pytest.raises(UpdateFileError, match="not a safetensors file"):
        load_checkpoint(tmp_path / "tiny.safetensors")
    (tmp_path / "text.safetensors").write_bytes(b"this is not a checkpoint, just some text\n" * 10)
    with pytest.raises(UpdateFileError, match="not a valid safetensors"):
        load_checkpoint(tmp_path / "text.safetensors")
    (tmp_path / "pickle.pt").write_bytes(b"\x80\x04\x95" + b"\x00" * 64)  # a torch.save pickle head
    with pytest.raises(UpdateFileError):
        load_checkpoint(tmp_path / "pickle.pt")

    def wrong_format(t, md):  # noqa: ANN001
        return {**md, "format": "gradleak.shared-update"}

    with pytest.raises(UpdateFileError, match="not a gradleak checkpoint"):
        load_checkpoint(_rewrite(good, tmp_path / "fmt.safetensors", wrong_format))

    def broken_json(t, md):  # noqa: ANN001
        return {**md, "meta": "{not json"}

    with pytest.raises(UpdateFileError, match="not valid JSON"):
        load_checkpoint(_rewrite(good, tmp_path / "json.safetensors", broken_json))

    def bad_shape_meta(t, md):  # noqa: ANN001
        meta = json.loads(md["meta"])
        meta["input_shape"] = [1, 32]
        return {**md, "meta": json.dumps(meta)}

    with pytest.raises(UpdateFileError, match="input_shape"):
        load_checkpoint(_rewrite(good, tmp_path / "meta.safetensors", bad_shape_meta))

    def unknown_model(t, md):  # noqa: ANN001
        meta = json.loads(md["meta"])
        meta["model"] = "no-such-net"
        return {**md, "meta": json.dumps(meta)}

    with pytest.raises(UnknownNameError):
        load_checkpoint(_rewrite(good, tmp_path / "model.safetensors", unknown_model))

    def user_code(t, md):  # noqa: ANN001
        meta = json.loads(md["meta"])
        meta["model"] = "os:getcwd"
        return {**md, "meta": json.dumps(meta)}

    with pytest.raises(UpdateFileError, match="trust_model_code"):
        load_checkpoint(_rewrite(good, tmp_path / "code.safetensors", user_code))


def test_wrong_shape_missing_or_extra_tensor_is_a_model_mismatch(trained, tmp_path):
    good = trained.checkpoints[-1].path

    def wrong_shape(t, md):  # noqa: ANN001
        t["fc.weight"] = t["fc.weight"][:, :-1].contiguous()

    with pytest.raises(ModelMismatchError, match=r"fc.weight has shape \[10, 767\]"):
        load_checkpoint(_rewrite(good, tmp_path / "shape.safetensors", wrong_shape))

    def missing(t, md):  # noqa: ANN001
        del t["fc.bias"]

    with pytest.raises(ModelMismatchError, match="lacks 1 tensors"):
        load_checkpoint(_rewrite(good, tmp_path / "missing.safetensors", missing))

    def extra(t, md):  # noqa: ANN001
        t["fc.extra"] = torch.zeros(3)

    with pytest.raises(ModelMismatchError, match="does not have"):
        load_checkpoint(_rewrite(good, tmp_path / "extra.safetensors", extra))

    def int_weights(t, md):  # noqa: ANN001
        t["fc.bias"] = torch.zeros(10, dtype=torch.int64)

    with pytest.raises(ModelMismatchError, match="dtype"):
        load_checkpoint(_rewrite(good, tmp_path / "dtype.safetensors", int_weights))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_checkpoint_raises(trained, tmp_path, bad):
    def poison(t, md):  # noqa: ANN001
        t["body.0.weight"] = t["body.0.weight"].clone()
        t["body.0.weight"].view(-1)[7] = bad

    with pytest.raises(NonFiniteError, match="body.0.weight"):
        load_checkpoint(_rewrite(trained.checkpoints[-1].path, tmp_path / "nan.safetensors", poison))


# ------------------------------------------------------------------ defenses
def test_strong_gaussian_defense_costs_accuracy(trained, trained_noisy):
    assert trained_noisy.defenses == ["gaussian:1"]
    assert trained_noisy.final_accuracy <= 0.3
    assert trained_noisy.final_accuracy <= trained.final_accuracy - 0.25
    meta = read_checkpoint_meta(trained_noisy.checkpoints[-1].path)
    assert meta["defenses"] == ["gaussian:1"]


def test_dpsgd_training_reports_epsilon(tmp_path):
    cfg = TrainConfig(train_subset=256, test_subset=200, epochs=1.0, batch_size=32, lr=0.01,
                      defense=("dpsgd:clip=1,noise=1.1",), checkpoints=(1.0,))
    res = train(cfg, tmp_path)
    summary = json.loads((tmp_path / "training.json").read_text())
    want = dp_epsilon(1.1, sample_rate=32 / 256, steps=8, delta=1e-5)
    assert res.total_steps == 8 and res.epsilon == pytest.approx(want)
    assert summary["privacy"]["epsilon"] == pytest.approx(want) and summary["privacy"]["delta"] == 1e-5
    assert math.isfinite(want) and want > 0


def test_diverging_training_raises_non_finite(tmp_path):
    cfg = TrainConfig(train_subset=64, test_subset=50, batch_size=32, lr=1e10, defense=("gaussian:1e30",),
                      checkpoints=(1.0,))
    with pytest.raises(NonFiniteError, match="lower lr"):
        train(cfg, tmp_path)


def test_dpsgd_refuses_batchnorm_before_writing_anything(tmp_path):
    cfg = TrainConfig(model="convnet", width=4, image_size=16, train_subset=64, test_subset=64, batch_size=32,
                      defense=("dpsgd:clip=1,noise=1",))
    with pytest.raises(ConfigError, match="BatchNorm"):
        train(cfg, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ reproducibility, BN, semantics
def test_same_config_and_seed_give_identical_weights(tmp_path):
    cfg = TrainConfig(train_subset=320, test_subset=100, epochs=0.5, batch_size=32, lr=0.01,
                      defense=("gaussian:0.01",), checkpoints=(1.0,))
    a = train(cfg, tmp_path / "a")
    b = train(cfg, tmp_path / "b", progress=True)  # the progress bar changes nothing
    _assert_same_state(_state(a.model.module), _state(b.model.module))
    assert a.losses == b.losses
    ma = read_checkpoint_meta(tmp_path / "a" / "checkpoint-1.00.safetensors")
    mb = read_checkpoint_meta(tmp_path / "b" / "checkpoint-1.00.safetensors")
    assert ma == mb  # (not byte-equal: safetensors writes its metadata map in arbitrary order)
    c = train(TrainConfig(**{**cfg.to_dict(), "seed": 1}), tmp_path / "c")
    assert not torch.equal(c.model.module.fc.weight, a.model.module.fc.weight)


def test_steps_equal_a_plain_sgd_loop_and_bn_running_stats_move(tmp_path):
    """Without defenses a step is exactly loss.backward(); SGD.step() on the module in train mode,
    running BN statistics included (fedsgd itself leaves them alone)."""
    from gradleak.data import open_source

    cfg = TrainConfig(model="convnet", width=4, image_size=16, train_subset=96, test_subset=50, epochs=1.0,
                      batch_size=32, lr=0.05, momentum=0.9, checkpoints=(0.0, 1.0))
    res = train(cfg, tmp_path)
    assert res.total_steps == 3

    ref = build_model("convnet", num_classes=10, channels=1, image_size=16, width=4, seed=0)
    src = open_source("fashion-mnist", split="train")
    perm = torch.randperm(len(src), generator=torch.Generator().manual_seed(_derive_seed(0, "subset")))
    data = _decode(src, perm[:96].tolist(), 16, 1)
    order = torch.randperm(96, generator=torch.Generator().manual_seed(_derive_seed(0, "shuffle")))
    opt = torch.optim.SGD(ref.module.parameters(), lr=0.05, momentum=0.9)
    ref.module.train()
    for step in range(3):
        batch = data.batch(order[step * 32:(step + 1) * 32], "fashion-mnist")
        opt.zero_grad()
        F.cross_entropy(ref.module(ref.normalize(batch.images)), batch.labels).backward()
        opt.step()
    got, want = _state(res.model.module), _state(ref.module)
    assert got.keys() == want.keys()
    for k in want:
        assert torch.allclose(got[k].float(), want[k].float(), atol=1e-5, rtol=1e-4), k
    assert int(got["features.1.num_batches_tracked"]) == 3
    initial, _ = load_checkpoint(res.checkpoints[0].path)
    assert not torch.allclose(initial.module.features[1].running_mean, got["features.1.running_mean"])


# ------------------------------------------------------------------ configuration errors
@pytest.mark.parametrize("bad", [
    dict(epochs=0), dict(epochs=-1.0), dict(epochs=float("nan")), dict(checkpoints=(1.5,)),
    dict(checkpoints=(-0.1, 0.5)), dict(checkpoints=(0.301, 0.304)), dict(batch_size=0), dict(batch_size=2.5),
    dict(lr=0), dict(lr=float("inf")), dict(momentum=1.0), dict(momentum=-0.1), dict(train_subset=0),
    dict(test_subset=-3), dict(width=0), dict(image_size=2), dict(defense=("gaussian:-1",)),
    dict(defense=("gaussian:0.1", "dpsgd:clip=1,noise=1")), dict(seed="0"),
])
def test_bad_config_values_raise_config_error(bad):
    with pytest.raises(ConfigError):
        TrainConfig(**bad)


def test_unknown_defense_and_impossible_sizes(tmp_path):
    with pytest.raises(UnknownNameError):
        TrainConfig(defense=("blur:1",))
    with pytest.raises(ConfigError, match="batch_size=64 is larger"):
        train(TrainConfig(train_subset=10, test_subset=10), tmp_path)
    with pytest.raises(ConfigError, match="train_subset"):
        train(TrainConfig(train_subset=10**6), tmp_path)
    with pytest.raises(ConfigError, match="no separate train/test"):
        train(TrainConfig(data="cifar10-samples", batch_size=4), tmp_path)


def test_config_normalises_sequences():
    cfg = TrainConfig(defense="gaussian:0.1", checkpoints=[1.0, 0.0, 0.5, 0.5])
    assert cfg.defense == ("gaussian:0.1",) and cfg.checkpoints == (0.0, 0.5, 1.0)
    assert TrainConfig(**cfg.to_dict()) == cfg


def test_user_model_checkpoint_needs_trust(tmp_path):
    cfg = TrainConfig(model="gradleak.models.small:LeNetDLG", train_subset=64, test_subset=50, batch_size=32,
                      checkpoints=(1.0,))
    res = train(cfg, tmp_path)
    path = res.checkpoints[0].path
    with pytest.raises(UpdateFileError, match="trust_model_code"):
        load_checkpoint(path)
    spec, _ = load_checkpoint(path, trust_model_code=True)
    _assert_same_state(_state(spec.module), _state(res.model.module))
    other = build_model("gradleak.models.small:LeNetDLG", num_classes=10, channels=1, image_size=32, seed=5)
    apply_checkpoint(other, path)
    _assert_same_state(_state(other.module), _state(res.model.module))
