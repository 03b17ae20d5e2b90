"""Property-based: hostile or broken input never gives a traceback, a hang or a partial output.

Every case must end in exit status 2 with one line ``gradleak: error: ...`` on stderr and no
run folder, or (for inputs that are odd but valid) in a normal run.
"""

import gzip
import json
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from PIL import Image

from conftest import rewrite_update as _rewrite
from gradleak.cli import main

# No shrinking phase: a failure is reported as found (shrinking CLI runs can take minutes).
SETTINGS = settings(max_examples=12, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
FAST = ["--iterations", "1", "--no-progress", "--threads", "1", "--attack", "idlg"]


_counter = [0]


def expect_clean_error(args, tmp_path, capsys, allow_success=False):
    _counter[0] += 1
    out = tmp_path / f"run{_counter[0]}"
    full = [str(a) for a in args]
    if full[0] == "attack":
        full += ["--out", str(out)]
    try:
        code = main(full)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    if allow_success and code == 0:
        assert (out / "metrics.json").is_file() or full[0] != "attack"
        return code
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (args, code, err)
    assert len(lines) == 1 and lines[0].startswith("gradleak: error:"), err
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if "partial" in p.name]
    return code




# 1-3: random bytes, truncation, byte flips in the header
@SETTINGS
@given(data=st.binary(max_size=300))
def test_random_bytes_as_update(data, tmp_path, capsys, valid):
    p = tmp_path / "r.safetensors"
    p.write_bytes(data)
    expect_clean_error(["attack", *FAST, "--update", p], tmp_path, capsys)


@SETTINGS
@given(frac=st.floats(0, 0.999))
def test_truncated_update(frac, tmp_path, capsys, valid):
    raw = (valid / "u.safetensors").read_bytes()
    p = tmp_path / "t.safetensors"
    p.write_bytes(raw[: int(len(raw) * frac)])
    expect_clean_error(["attack", *FAST, "--update", p], tmp_path, capsys)


@SETTINGS
@given(pos=st.integers(0, 2000), byte=st.integers(0, 255))
def test_corrupted_header_byte(pos, byte, tmp_path, capsys, valid):
    raw = bytearray((valid / "u.safetensors").read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    i = pos % (n + 8)
    if raw[i] == byte:
        byte = (byte + 1) % 256
    raw[i] = byte
    p = tmp_path / "c.safetensors"
    p.write_bytes(bytes(raw))
    # A flipped byte may land on something harmless (e.g. whitespace or a float digit in
    # metadata): then the run succeeds; otherwise a clean error.
    expect_clean_error(["attack", *FAST, "--update", p], tmp_path, capsys, allow_success=True)


# 4-5: wrong dtypes and shapes
@SETTINGS
@given(key=st.sampled_from(["grad/fc.weight", "grad/body.0.bias", "weights/fc.bias", "weights/body.2.weight"]),
       dtype=st.sampled_from(["int32", "int64", "uint8", "bool"]))
def test_wrong_dtype(key, dtype, tmp_path, capsys, valid):
    import torch

    def fn(t):
        t[key] = t[key].to(getattr(torch, dtype))
    p = _rewrite(valid / "u.safetensors", tmp_path / "d.safetensors", tensors_fn=fn)
    expect_clean_error(["attack", *FAST, "--update", p], tmp_path, capsys)


@SETTINGS
@given(key=st.sampled_from(["grad/fc.weight", "grad/body.0.weight", "weights/fc.bias"]),
       shape=st.lists(st.integers(1, 9), min_size=0, max_size=4))
def test_shape_mismatch(key, shape, tmp_path, capsys, valid):
    import torch

    def fn(t):
        t[key] = torch.zeros(shape)
    p = _rewrite(valid / "u.safetensors", tmp_path / "s.safetensors", tensors_fn=fn)
    expect_clean_error(["attack", *FAST, "--update", p], tmp_path, capsys)


# 6: huge declared sizes
@SETTINGS
@given(n=st.integers(2**20, 2**63 - 1))
def test_huge_declared_header(n, tmp_path, capsys):
    p = tmp_path / "h.safetensors"
    p.write_bytes(struct.pack("<Q", n) + b'{"a":{"dtype":"F32","shape":[1000000000000],"data_offsets":[0,4]}}')
    expect_clean_error(["attack", *FAST, "--update", p], tmp_path, capsys)


def test_huge_declared_tensor_shape(tmp_path, capsys):
    header = json.dumps({"grad/fc.weight": {"dtype": "F32", "shape": [10**9, 10**9], "data_offsets": [0, 4]},
                         "__metadata__": {"format": "gradleak.shared-update"}}).encode()
    p = tmp_path / "hs.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    expect_clean_error(["attack", *FAST, "--update", p], tmp_path, capsys)


# 7: NaN / Inf anywhere
@SETTINGS
@given(key=st.sampled_from(["grad/fc.weight", "grad/body.4.bias", "weights/fc.weight", "weights/body.0.bias"]),
       value=st.sampled_from([float("nan"), float("inf"), float("-inf")]), pos=st.integers(0, 10_000))
def test_non_finite(key, value, pos, tmp_path, capsys, valid):
    def fn(t):
        flat = t[key].view(-1)
        flat[pos % flat.numel()] = value
    p = _rewrite(valid / "u.safetensors", tmp_path / "n.safetensors", tensors_fn=fn)
    expect_clean_error(["attack", *FAST, "--update", p], tmp_path, capsys)


# 8-9: wrong or missing metadata
@SETTINGS
@given(field=st.sampled_from(["model", "num_classes", "input_shape", "mean", "std", "batch_size", "loss", "threat"]),
       value=st.one_of(st.none(), st.integers(-5, 0), st.text(max_size=5), st.lists(st.integers(-2, 2), max_size=5),
                       st.just(float("nan"))))
def test_wrong_metadata_field(field, value, tmp_path, capsys, valid):
    def fn(meta):
        m = json.loads(meta["meta"])
        m[field] = value
        meta["meta"] = json.dumps(m)
    p = _rewrite(valid / "u.safetensors", tmp_path / "m.safetensors", meta_fn=fn)
    # loss is informational; a changed number there is harmless.
    expect_clean_error(["attack", *FAST, "--update", p], tmp_path, capsys, allow_success=(field == "loss"))


@pytest.mark.parametrize("change", [{"format": "something-else"}, {"format_version": "99"}, {"meta": "[]"},
                                    {"meta": ""}, {}])
def test_wrong_format_markers(change, tmp_path, capsys, valid):
    def fn(meta):
        if not change:
            meta.clear()
        meta.update(change)
    p = _rewrite(valid / "u.safetensors", tmp_path / "f.safetensors", meta_fn=fn)
    expect_clean_error(["attack", *FAST, "--update", p], tmp_path, capsys)


# 10-11: configs with unknown keys, wrong types, out-of-range values
@SETTINGS
@given(key=st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12))
def test_unknown_config_key(key, tmp_path, capsys):
    from gradleak.config import AttackConfig

    if key in AttackConfig.model_fields:
        key = key + "_x"
    p = tmp_path / "c.json"
    p.write_text(json.dumps({key: 1}))
    expect_clean_error(["attack", "--config", p], tmp_path, capsys)


@SETTINGS
@given(field=st.sampled_from(["batch_size", "iterations", "lr", "seed", "image_size", "num_classes", "width",
                              "seeds", "local_steps", "clients", "log_every"]),
       value=st.one_of(st.integers(-10**6, 0), st.just(float("nan")), st.just("many"), st.just([1])))
def test_out_of_range_config_value(field, value, tmp_path, capsys):
    if field in ("seed",) and isinstance(value, int) and value == 0:
        value = -1
    p = tmp_path / "c.json"
    p.write_text(json.dumps({field: value}, allow_nan=True))
    expect_clean_error(["attack", "--config", p], tmp_path, capsys)


@pytest.mark.parametrize("content", [b"[1, 2]", b"42", b"\xff\xfe\x00bad", b"", b"{"])
def test_config_file_not_an_object(content, tmp_path, capsys):
    p = tmp_path / "c.json"
    p.write_bytes(content)
    expect_clean_error(["attack", "--config", p], tmp_path, capsys)


# 12-14: image folders: odd modes and sizes (valid), empty, broken, too few classes
@SETTINGS
@given(mode=st.sampled_from(["1", "L", "P", "RGB", "RGBA", "LA", "I;16", "CMYK", "F"]),
       w=st.integers(1, 70), h=st.integers(1, 70))
def test_image_folder_odd_modes_and_sizes(mode, w, h, tmp_path, capsys):
    root = tmp_path / f"imgs-{_counter[0]}"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        arr = (np.random.default_rng(0).random((h, w)) * 255).astype(np.uint8)
        img = Image.fromarray(arr, "L").convert(mode) if mode not in ("I;16", "F") else Image.fromarray(arr, "L").convert("I").convert(mode) if mode == "F" else Image.fromarray(arr.astype(np.uint16) * 200)
        suffix = ".tiff" if mode in ("CMYK", "F") else ".png"
        img.save(root / c / f"x{suffix}")
    expect_clean_error(["attack", *FAST, "--data", root, "--num-classes", "10"], tmp_path, capsys, allow_success=True)


def test_empty_and_broken_folders(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "noimg" / "a").mkdir(parents=True)
    (tmp_path / "noimg" / "a" / "x.txt").write_text("x")
    (tmp_path / "broken" / "a").mkdir(parents=True)
    (tmp_path / "broken" / "a" / "x.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    (tmp_path / "one" / "a").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "one" / "a" / "x.png")
    for folder in ("empty", "noimg", "broken"):
        expect_clean_error(["attack", *FAST, "--data", tmp_path / folder], tmp_path, capsys)
    # one class only: a classifier needs >= 2 classes
    expect_clean_error(["attack", *FAST, "--data", tmp_path / "one"], tmp_path, capsys)
    # two images wanted with distinct labels from a single class
    expect_clean_error(["attack", *FAST, "--data", tmp_path / "one", "--batch-size", "2", "--num-classes", "10"],
                       tmp_path, capsys)


@SETTINGS
@given(k=st.integers(9, 40))
def test_duplicate_labels_where_unique_are_needed(k, tmp_path, capsys):
    expect_clean_error(["attack", *FAST, "--batch-size", k], tmp_path, capsys)


# 15: truth files that do not fit the update
def test_truth_mismatch(tmp_path, capsys, valid):
    import torch

    bad_k = _rewrite(valid / "t.safetensors", tmp_path / "k.safetensors",
                     tensors_fn=lambda t: (t.__setitem__("images", torch.zeros(2, 3, 32, 32)),
                                           t.__setitem__("labels", torch.zeros(2, dtype=torch.long))))
    bad_label = _rewrite(valid / "t.safetensors", tmp_path / "l.safetensors",
                         tensors_fn=lambda t: t.__setitem__("labels", torch.tensor([99])))
    nan = _rewrite(valid / "t.safetensors", tmp_path / "n.safetensors",
                   tensors_fn=lambda t: t["images"].view(-1).__setitem__(0, float("nan")))
    for p in (bad_k, bad_label, nan):
        expect_clean_error(["attack", *FAST, "--update", valid / "u.safetensors", "--truth", p], tmp_path, capsys)


# 16: corrupt IDX files
@SETTINGS
@given(magic=st.integers(0, 2**32 - 1), n=st.integers(0, 10**9))
def test_corrupt_idx(magic, n, tmp_path, capsys):
    root = tmp_path / f"fm-{_counter[0]}"
    root.mkdir()
    with gzip.open(root / "train-images-idx3-ubyte.gz", "wb") as fh:
        fh.write(struct.pack(">IIII", magic, n, 28, 28) + b"\0" * 100)
    with gzip.open(root / "train-labels-idx1-ubyte.gz", "wb") as fh:
        fh.write(struct.pack(">II", 2049, n) + b"\0" * 10)
    expect_clean_error(["attack", *FAST, "--data", "fashion-mnist", "--data-root", root], tmp_path, capsys)


# 17: unknown names anywhere
@SETTINGS
@given(flag=st.sampled_from(["--model", "--attack", "--data", "--defense", "--preset", "--labels"]),
       name=st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=10))
def test_unknown_names(flag, name, tmp_path, capsys):
    name = "zz" + name  # never a real name
    expect_clean_error(["attack", *FAST, flag, name], tmp_path, capsys)
