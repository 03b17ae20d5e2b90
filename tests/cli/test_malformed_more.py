"""Property-based, continued (issue 8 item 3): the inputs added since the first malformed-input
suite: checkpoint files, defense specs, text inputs, sweep specs, experiment options, GradInversion
options, and the typed exceptions the Python API raises for the same inputs.

Each CLI case must end in exit status 2 with one line ``gradleak: error: ...`` and no output
folder (``expect_clean_error`` from test_malformed.py).
"""

from __future__ import annotations


import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from safetensors.torch import save_file

from gradleak.cli import main
from gradleak.errors import ConfigError, GradleakError, UpdateFileError

from test_malformed import SETTINGS, expect_clean_error

FAST = ["--iterations", "1", "--no-progress", "--threads", "1", "--attack", "idlg"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    assert main(["train", "--model", "lenet-dlg", "--data", "fashion-mnist", "--epochs", "1", "--train-subset", "64", "--test-subset", "32",
                 "--checkpoints", "1.0", "--out", str(d / "train"), "--no-progress"]) == 0
    return next((d / "train").glob("checkpoint-*.safetensors"))


# 1: random bytes / truncation of a checkpoint file
@SETTINGS
@given(data=st.binary(max_size=200), frac=st.floats(0, 0.999))
def test_hostile_checkpoint_bytes(data, frac, checkpoint, tmp_path, capsys):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(data)
    expect_clean_error(["attack", *FAST, "--data", "fashion-mnist", "--checkpoint", bad], tmp_path, capsys)
    raw = checkpoint.read_bytes()
    bad.write_bytes(raw[: int(len(raw) * frac)])
    expect_clean_error(["attack", *FAST, "--data", "fashion-mnist", "--checkpoint", bad], tmp_path, capsys)


# 2: a checkpoint whose tensors do not fit the model (shape, dtype, NaN)
@SETTINGS
@given(kind=st.sampled_from(["shape", "dtype", "nan", "missing", "extra"]))
def test_checkpoint_not_fitting_the_model(kind, checkpoint, tmp_path, capsys):
    from safetensors import safe_open

    with safe_open(str(checkpoint), "pt") as f:
        meta = dict(f.metadata() or {})
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    key = sorted(tensors)[0]
    if kind == "shape":
        tensors[key] = torch.zeros(3, 5, 7)
    elif kind == "dtype":
        tensors[key] = tensors[key].to(torch.int32)
    elif kind == "nan":
        tensors[key] = tensors[key].clone().float()
        tensors[key].view(-1)[0] = float("nan")
    elif kind == "missing":
        del tensors[key]
    else:
        tensors["not.a.parameter"] = torch.zeros(2)
    bad = tmp_path / "bad.safetensors"
    save_file(tensors, str(bad), metadata=meta)
    expect_clean_error(["attack", *FAST, "--data", "fashion-mnist", "--checkpoint", bad], tmp_path, capsys)


# 3: malformed defense specs
@SETTINGS
@given(spec=st.one_of(
    st.sampled_from(["gaussian", "gaussian:", "gaussian:-1", "gaussian:nan", "gaussian:inf", "prune:1.5",
                     "prune:-0.1", "prune:0.3,scope=nowhere", "dpsgd:clip=0", "dpsgd:noise=-1", "int8:3",
                     "laplace:abc", "fp16:2", ":", "dpsgd:clip=1,clip=2"]),
    st.text("abcdefxyz:=,.-0123456789", min_size=1, max_size=15).filter(
        lambda s: s.split(":")[0] not in ("gaussian", "laplace", "prune", "fp16", "int8", "dpsgd"))))
def test_malformed_defense_specs(spec, tmp_path, capsys):
    expect_clean_error(["attack", *FAST, "--defense", spec], tmp_path, capsys)


# 4: text input that cannot make a batch (empty, blank, binary file, empty file, too long)
@SETTINGS
@given(kind=st.sampled_from(["empty-text", "blank-text", "binary-file", "empty-file", "missing-file",
                             "too-long", "batch-too-big"]))
def test_malformed_text_input(kind, tmp_path, capsys):
    pytest.importorskip("transformers")
    base = ["attack", "--modality", "text", "--model", "tiny-transformer", "--iterations", "1", "--no-progress",
            "--threads", "1"]
    f = tmp_path / "s.txt"
    if kind == "empty-text":
        args = [*base, "--text", ""]
    elif kind == "blank-text":
        args = [*base, "--text", "   \t "]
    elif kind == "binary-file":
        f.write_bytes(b"\xff\xfe\x00\x81" * 10)
        args = [*base, "--data", f]
    elif kind == "empty-file":
        f.write_text("\n\n")
        args = [*base, "--data", f]
    elif kind == "missing-file":
        args = [*base, "--data", tmp_path / "nope.txt"]
    elif kind == "too-long":
        args = [*base, "--text", " ".join(["word"] * 500)]
    else:
        args = [*base, "--text", "one sentence", "--batch-size", "5"]
    expect_clean_error(args, tmp_path, capsys)


# 5: malformed sweep specs
@SETTINGS
@given(content=st.sampled_from([
    "", "[]", "base: 3", "grid: []", "grid: {}", "grid: {batch_size: []}", "grid: {atack: [dlg]}",
    "base: {iterations: -1}\ngrid: {seed: [0]}", "grid: {batch_size: [one]}", "base: {out: x}\ngrid: {seed: [0]}",
    "unknown: 1\ngrid: {seed: [0]}", "grid: {seed: 0}", "{{{{", "grid: {seed: [0]}\nbase: {seed: 1}",
]))
def test_malformed_sweep_specs(content, tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(content)
    out = tmp_path / "sweep"
    code = main(["sweep", str(spec), "--out", str(out), "--no-progress", "--executor", "inline"])
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("gradleak: error:"), (content, code, err)
    assert not (out / "results.csv").exists()


# 6: out-of-range experiment options
@SETTINGS
@given(flag=st.sampled_from(["--batch-sizes", "--batches", "--samples", "--iterations", "--width", "--seed"]),
       value=st.sampled_from(["0", "-3", "x", "1,,2", "nan", ""]))
def test_malformed_experiment_options(flag, value, tmp_path, capsys):
    assume(not (flag == "--seed" and value == "0"))  # a valid seed
    out = tmp_path / "exp"
    try:
        code = main(["experiment", "optimizers", "--smoke", "--out", str(out), flag, value])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("gradleak: error:"), (flag, value, err)
    assert not out.exists()


# 7: GradInversion options out of range or contradictory
@SETTINGS
@given(args=st.sampled_from([["--seeds", "0"], ["--seeds", "-2"], ["--group", "registered-ish"], ["--bn", "exactly"],
                             ["--preset", "gpu"], ["--labels", "magic"], ["--nproc", "0"], ["--nproc", "9"],
                             ["--batch-size", "9"]]))
def test_malformed_gradinversion_options(args, tmp_path, capsys):
    expect_clean_error(["attack", "--attack", "gradinversion", "--model", "convnet", "--width", "4",
                        "--iterations", "1", "--no-progress", "--threads", "1", "--batch-size", "2", *args],
                       tmp_path, capsys)


# 8: the Python API raises typed exceptions (no traceback-only failures) for the same inputs
@SETTINGS
@given(data=st.binary(max_size=120))
def test_api_raises_typed_errors(data, tmp_path):
    from gradleak.config import make_config
    from gradleak.defenses import parse_defenses
    from gradleak.fl import load_update

    bad = tmp_path / "u.safetensors"
    bad.write_bytes(data)
    with pytest.raises(UpdateFileError):
        load_update(bad)
    with pytest.raises(ConfigError):
        make_config(batch_size=0)
    with pytest.raises(GradleakError):
        parse_defenses(["gaussian:-1"])
    with pytest.raises(GradleakError):
        make_config(attack="dlg", seeds=3, nonsense=1)

