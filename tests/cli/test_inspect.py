"""`gradleak inspect` (gradleak/fl/inspect.py) and `gradleak share --model-out`: the client's check
of the model it received. Honest models exit 0, the malicious servers' models 1, bad input 2 with
one line; the thresholds themselves are measured by benchmarks/inspect_models.py."""

import json
import math
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from gradleak.cli import main
from gradleak.errors import ModelMismatchError, NonFiniteError, UnknownNameError, UpdateFileError
from gradleak.fl.inspect import inspect_file, inspect_model
from gradleak.models import build_model


def run(args, capsys):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def save_state(path, state):
    save_file({k: v.detach().contiguous().clone() for k, v in state.items()}, str(path))
    return path


@pytest.fixture(scope="module")
def honest_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("honest")
    return {arch: save_state(d / f"{arch}.safetensors", build_model(arch, num_classes=10, seed=3).module.state_dict())
            for arch in ("mlp", "convnet", "resnet18-cifar")}


def checks(result):
    return {(name, f.check) for name, f in result.findings}


# ---------------------------------------------------------------- honest models: exit 0
@pytest.mark.parametrize("arch", ["mlp", "convnet", "resnet18-cifar"])
def test_honest_untrained_models_exit_0(honest_files, arch, capsys):
    code, out, err = run(["inspect", honest_files[arch], "--model", arch], capsys)
    assert code == 0, out + err
    assert "nothing found" in out and err == ""


def test_trained_checkpoint_exits_0(tmp_path, capsys):
    from gradleak.data import open_source
    from gradleak.errors import DataError

    try:
        open_source("fashion-mnist")
    except DataError as exc:
        pytest.skip(f"no Fashion-MNIST here: {exc}")
    code, _, err = run(["train", "--model", "mlp", "--width", "64", "--data", "fashion-mnist", "--epochs", "1",
                        "--train-subset", "512", "--test-subset", "64", "--checkpoints", "1.0", "--threads", "1",
                        "--no-progress", "--out", tmp_path / "t"], capsys)
    assert code == 0, err
    ckpt = tmp_path / "t" / "checkpoint-1.00.safetensors"
    code, out, err = run(["inspect", ckpt, "--model", "mlp", "--width", "64", "--data", "fashion-mnist"], capsys)
    assert code == 0, out + err


# ---------------------------------------------------------------- share --model-out, then inspect
@pytest.mark.parametrize("server, block, expected", [
    ("imprint:bins=8", "imprint", {("imprint.linear0", "extra"), ("imprint.linear0", "parallel-rows"),
                                   ("imprint.linear2", "parallel-columns"), ("imprint.linear2", "scale")}),
    ("trap:rows=64,shrink=0.1", "trap", {("trap.linear0", "extra"), ("trap.linear0", "trap-rows"),
                                         ("trap.linear2", "scale")}),
])
def test_share_model_out_round_trip_and_inspect_finds_the_server(tmp_path, capsys, server, block, expected):
    u, m = tmp_path / "u.safetensors", tmp_path / "m.safetensors"
    code, out, err = run(["share", "--model", "convnet", "--width", "8", "--server", server, "--seed", "1",
                          "--out", u, "--model-out", m], capsys)
    assert code == 0, err
    assert str(m) in out
    received, update = load_file(str(m)), load_file(str(u))
    weights = {k.partition("/")[2]: v for k, v in update.items() if k.startswith("weights/")}
    # the file is the model the update was computed on, the server's block included
    assert set(received) == set(weights) and any(k.startswith(block + ".") for k in received)
    assert all(torch.equal(received[k], weights[k]) for k in received)
    code, out, err = run(["inspect", m, "--model", "convnet", "--width", "8", "--json"], capsys)
    assert code == 1, err
    report = json.loads(out)
    assert report["suspicious"] and report["prefix"] == "net."
    assert expected <= {(f["layer"], f["check"]) for f in report["findings"]}
    # only the block is flagged: the victim's own layers are what the server took from the honest model
    assert all(f["layer"].startswith(block + ".") for f in report["findings"])


def test_share_model_out_is_written_with_the_others_or_not_at_all(tmp_path, capsys, monkeypatch):
    import gradleak.paths.atomic as paths

    u, t, m = tmp_path / "u.safetensors", tmp_path / "t.safetensors", tmp_path / "m.safetensors"
    m.write_bytes(b"already here")
    code, _, err = run(["share", "--model", "lenet-dlg", "--out", u, "--truth", t, "--model-out", m], capsys)
    assert code == 2 and "--model-out" in err and "exists" in err and len(err.strip().splitlines()) == 1
    assert not u.exists() and not t.exists() and m.read_bytes() == b"already here"
    code, _, err = run(["share", "--model", "lenet-dlg", "--out", u, "--model-out", u], capsys)
    assert code == 2 and "same file" in err
    m.unlink()
    real = paths._temp_copy

    def fail_on_model(path, data, durable, temps):
        if path.name == "m.safetensors":
            raise OSError(28, "No space left on device")
        return real(path, data, durable, temps)

    monkeypatch.setattr(paths, "_temp_copy", fail_on_model)
    with pytest.raises(OSError):
        main(["share", "--model", "lenet-dlg", "--out", str(u), "--truth", str(t), "--model-out", str(m)])
    assert sorted(os.listdir(tmp_path)) == []   # nothing written, no temporary file left


# ---------------------------------------------------------------- the checks (Python API)
def test_trap_rows_are_found_in_a_layer_arch_has():
    """Trap rows the server put in place of the mlp's own first layer (no extra tensor, the scale
    untouched): rows drawn in pixel space, positives scaled down, folded into the model's
    normalisation as models/trap.py folds them; found by the trap test alone."""
    mlp = build_model("mlp", num_classes=10, width=256)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(256, 3 * 32 * 32, generator=g, dtype=torch.float64)
    w = torch.where(w > 0, w * 0.9, w)
    std = torch.tensor(mlp.std, dtype=torch.float64).repeat_interleave(32 * 32)
    mean = torch.tensor(mlp.mean, dtype=torch.float64).repeat_interleave(32 * 32)
    state = mlp.module.state_dict()
    rms = float(state["fc1.weight"].double().pow(2).sum(1).mean().sqrt())
    scale = rms / float((w * std).pow(2).sum(1).mean().sqrt())          # the honest layer's size
    state["fc1.weight"] = (scale * w * std).float()
    state["fc1.bias"] = (scale * (w @ mean)).float()
    r = inspect_model(state, "mlp", num_classes=10, width=256)
    assert checks(r) == {("fc1", "trap-rows")}
    f = r.findings[0][1]
    assert f.score <= f.threshold and "trap weights" in f.reason
    assert r.layers[0].stats["trap_negative"] > 0.9 and abs(r.layers[0].stats["trap_count_share"]) < 0.1
    # the same rows without the shrink are honest random rows
    w0 = torch.randn(256, 3 * 32 * 32, generator=g, dtype=torch.float64)
    state["fc1.weight"] = (scale * w0 * std).float()
    assert not inspect_model(state, "mlp", num_classes=10, width=256).suspicious


def test_a_trained_layer_drifting_negative_is_not_a_trap():
    """A first layer shifted as a whole (signs with magnitudes, as training drifts it) is not
    the trap's signature (the shrink keeps every sign)."""
    state = build_model("mlp", num_classes=10, width=256).module.state_dict()
    w = state["fc1.weight"]
    state["fc1.weight"] = w - 0.04 * w.abs().mean()
    r = inspect_model(state, "mlp", num_classes=10, width=256)
    stats = r.layers[0].stats
    assert stats["trap_t"] < -5 and stats["trap_mean_z"] < -0.3 and stats["trap_count_share"] > 0.5
    assert not r.suspicious


@pytest.mark.parametrize("factor, found", [(3.0, False), (100.0, True), (1000.0, True)])
def test_a_scaled_residual_block_is_found(factor, found):
    state = build_model("resnet18-cifar", num_classes=10).module.state_dict()
    for k in ("weight", "bias"):
        state[f"layer2.0.bn2.{k}"] = state[f"layer2.0.bn2.{k}"] * factor
    r = inspect_model(state, "resnet18-cifar", num_classes=10)
    assert checks(r) == ({("layer2.0.bn2", "scale")} if found else set())
    if found:
        assert math.isclose(r.findings[0][1].score, factor, rel_tol=1e-3)


def test_imprint_with_a_small_gain_is_still_found_by_its_bins():
    from gradleak.models.imprint import imprint_model

    spec = imprint_model(build_model("convnet", num_classes=10, width=8), bins=32, mean=0.0, std=0.3, gain=1.0)
    r = inspect_model(spec.module.state_dict(), "convnet", num_classes=10, width=8)
    found = checks(r)
    assert ("imprint.linear0", "parallel-rows") in found and ("imprint.linear2", "parallel-columns") in found
    assert not any(check == "scale" for _, check in found)
    reason = next(f.reason for name, f in r.findings if f.check == "parallel-rows" and name == "imprint.linear0")
    assert "32 distinct biases" in reason and "Robbing the Fed" in reason


# ---------------------------------------------------------------- bad input: exit 2, one line
def test_bad_inputs_exit_2_with_one_line(honest_files, tmp_path, capsys):
    good = honest_files["convnet"]
    data = good.read_bytes()
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(data[:len(data) // 2])
    text = tmp_path / "text.safetensors"
    text.write_text("not a safetensors file at all\n")
    state = load_file(str(good))
    state["fc.weight"][0, 0] = float("nan")
    nan = save_state(tmp_path / "nan.safetensors", state)
    cases = [
        ([tmp_path / "missing.safetensors", "--model", "convnet"], "does not exist"),
        ([truncated, "--model", "convnet"], "not a valid safetensors"),
        ([text, "--model", "convnet"], "safetensors"),
        ([nan, "--model", "convnet"], "NaN"),
        ([good, "--model", "mlp"], "does not hold the tensors of model mlp"),
        ([good, "--model", "convnet", "--num-classes", "7"], "expects [7, 2048]"),
        ([good, "--model", "convnet", "--width", "16"], "expects"),
        ([good, "--model", "no-such-net"], "unknown model"),
        ([good, "--model", "convnet", "--channels", "9"], "--channels"),
    ]
    for args, expected in cases:
        code, out, err = run(["inspect", *args], capsys)
        assert code == 2, (args, out, err)
        assert err.startswith("gradleak: error:") and len(err.strip().splitlines()) == 1, err
        assert expected in err, (expected, err)


def test_the_api_raises_typed_errors(honest_files, tmp_path):
    good = honest_files["convnet"]
    with pytest.raises(UpdateFileError):
        inspect_file(tmp_path / "missing.safetensors", "convnet", num_classes=10)
    state = load_file(str(good))
    with pytest.raises(ModelMismatchError):
        inspect_model(state, "convnet", num_classes=3)
    with pytest.raises(UnknownNameError):
        inspect_model(state, "no-such-net", num_classes=10)
    state["features.1.running_var"][0] = float("inf")
    with pytest.raises(NonFiniteError):
        inspect_model(state, "convnet", num_classes=10)


def test_json_report_file(honest_files, tmp_path, capsys):
    report = tmp_path / "r.json"
    code, out, err = run(["inspect", honest_files["mlp"], "--model", "mlp", "--report", report], capsys)
    assert code == 0, err
    data = json.loads(report.read_text())
    assert data["suspicious"] is False and data["findings"] == []
    assert [layer["name"] for layer in data["layers"]] == ["fc1", "fc"]
    assert data["layers"][0]["reads_image"] and not data["layers"][1]["reads_image"]
    assert set(data["thresholds"]) >= {"parallel", "trap_t", "scale_ratio"}
