"""The CLI end to end: share -> file -> attack, the run folder, and one-line errors for bad input."""

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gradleak.config import flat_config
from gradleak.cli import main

FAST = ["--attack", "idlg", "--iterations", "12", "--no-progress", "--threads", "1"]


def run_cli(args, capsys):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    d = tmp_path_factory.mktemp("share")
    code = main(["share", "--model", "lenet-dlg", "--data", "cifar10-samples", "--batch-size", "1", "--seed", "2",
                 "--out", str(d / "u.safetensors"), "--truth", str(d / "t.safetensors")])
    assert code == 0
    return d


def test_share_then_attack_equals_in_memory(shared, tmp_path, capsys):
    code, out, err = run_cli(["attack", *FAST, "--seed", "2", "--update", shared / "u.safetensors", "--truth",
                              shared / "t.safetensors", "--out", tmp_path / "file"], capsys)
    assert code == 0, err
    code, out, err = run_cli(["attack", *FAST, "--seed", "2", "--out", tmp_path / "mem"], capsys)
    assert code == 0, err
    a = json.loads((tmp_path / "file" / "metrics.json").read_text())
    b = json.loads((tmp_path / "mem" / "metrics.json").read_text())
    for key in ("psnr_mean", "ssim_mean", "mse_mean", "label_accuracy", "gradient_distance"):
        assert a[key] == b[key], key
    assert a["per_image"][0]["label_true"] == b["per_image"][0]["label_true"]


def test_run_folder_contents_and_rerun_from_config(shared, tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, err = run_cli(["attack", *FAST, "--out", out], capsys)
    assert code == 0, err
    assert "psnr_mean" in stdout
    for name in ("metrics.json", "reconstruction.png", "history.csv", "config.json", "report.html"):
        assert (out / name).is_file(), name
    m = json.loads((out / "metrics.json").read_text())
    for key in ("attack", "model", "batch_size", "iterations", "wall_seconds", "psnr_mean", "ssim_mean",
                "mse_mean", "label_accuracy", "per_image"):
        assert key in m, key
    assert set(m["per_image"][0]) >= {"psnr", "zero_psnr", "ssim", "mse", "label_true", "label_restored", "fft2d",
                                      "rpsnr", "identified"}
    # the answer that reads nothing of the update, beside the PSNR (console, metrics.json, report)
    assert "zero_psnr_mean" in stdout and m["above_zero_image"] == int(m["psnr_mean"] > m["zero_psnr_mean"])
    assert "zero image" in (out / "report.html").read_text()
    # The GradInversion paper's metrics (Sec. 4): registration never lowers PSNR; FFT2D is a cosine
    # distance; IIP searched the 20 real photos of the source; LPIPS only with real backbone weights.
    from gradleak.metrics.paper import lpips_available

    assert m["rpsnr_mean"] >= m["psnr_mean"] - 1e-9 and 0 <= m["fft2d_mean"] <= 1
    # IIP's pool: the source's 20 photos and the public decoys (outcome.MIN_DECOY_POOL at least)
    assert m["iip"] in (0.0, 1.0) and m["iip_pool_size"] >= 20 + 50 and "pixels" in m["iip_feature_space"]
    assert (m["lpips_mean"] is None) == (not lpips_available())
    if m["lpips_mean"] is None:
        assert m["lpips_notice"] and "LPIPS not computed" in stdout
    rows = (out / "history.csv").read_text().splitlines()
    assert rows[0] == "iteration,loss,psnr" and len(rows) == 13
    cfg = json.loads((out / "config.json").read_text())["attack"]
    assert cfg["iterations"] == 12 and cfg["optimizer"] == "lbfgs"  # resolved, not None
    code, _, err = run_cli(["attack", "--config", out / "config.json", "--out", tmp_path / "again"], capsys)
    assert code == 0, err
    m2 = json.loads((tmp_path / "again" / "metrics.json").read_text())
    assert m2["psnr_mean"] == m["psnr_mean"]
    (out / "report.html").unlink()
    code, _, _ = run_cli(["report", out], capsys)
    assert code == 0 and (out / "report.html").is_file()


def _bad(tmp_path, name, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _tamper(src: Path, dst: Path, fn):
    from safetensors import safe_open

    with safe_open(str(src), "pt") as f:
        meta = f.metadata()
    tensors = load_file(str(src))
    fn(tensors, meta)
    save_file(tensors, str(dst), metadata=meta)
    return dst


def _bad_inputs(shared, tmp_path):
    u = shared / "u.safetensors"
    raw = u.read_bytes()
    missing_key = _tamper(u, tmp_path / "missing.safetensors", lambda t, m: t.pop("grad/fc.weight"))
    wrong_shape = _tamper(u, tmp_path / "shape.safetensors",
                          lambda t, m: t.__setitem__("grad/fc.weight", torch.zeros(3, 3)))
    nan = _tamper(u, tmp_path / "nan.safetensors",
                  lambda t, m: t["grad/fc.bias"].__setitem__(0, float("nan")))
    inf = _tamper(u, tmp_path / "inf.safetensors",
                  lambda t, m: t["weights/fc.bias"].__setitem__(0, float("inf")))
    bad_meta = _tamper(u, tmp_path / "meta.safetensors", lambda t, m: m.__setitem__("meta", "{not json"))
    unknown_model = _tamper(u, tmp_path / "model.safetensors",
                            lambda t, m: m.__setitem__("meta", m["meta"].replace('"lenet-dlg"', '"nope-net"')))
    return {
        "unknown model": ["attack", "--model", "nope-net"],
        "unknown data": ["attack", "--data", "nope-data"],
        "unknown attack": ["attack", "--attack", "nope"],
        "missing folder": ["attack", "--data", tmp_path / "no" / "such" / "folder"],
        "batch larger than data": ["attack", "--batch-size", "50"],
        "batch larger than distinct labels": ["attack", "--batch-size", "9"],
        "truncated update": ["attack", "--update", _bad(tmp_path, "trunc.safetensors", raw[: len(raw) // 2])],
        "not safetensors": ["attack", "--update", _bad(tmp_path, "junk.safetensors", b"hello world" * 10)],
        "empty file": ["attack", "--update", _bad(tmp_path, "empty.safetensors", b"")],
        "huge header": ["attack", "--update", _bad(tmp_path, "huge.safetensors", struct.pack("<Q", 2**60) + b"{}")],
        "missing update": ["attack", "--update", tmp_path / "nope.safetensors"],
        "update lacks a tensor": ["attack", "--update", missing_key],
        "tensor does not fit": ["attack", "--update", wrong_shape],
        "NaN gradient": ["attack", "--update", nan],
        "Inf weight": ["attack", "--update", inf],
        "bad metadata": ["attack", "--update", bad_meta],
        "unknown model in file": ["attack", "--update", unknown_model],
        "truth without update": ["attack", "--truth", shared / "t.safetensors"],
        "update given as truth": ["attack", "--update", u, "--truth", u],
        "negative iterations": ["attack", "--iterations", "-3"],
        "bad number": ["attack", "--lr", "fast"],
        "unknown flag": ["attack", "--frobnicate"],
        "missing config": ["attack", "--config", tmp_path / "none.json"],
        "bad config": ["attack", "--config", _bad(tmp_path, "c.json", b'{"attack": "dlg", "colour": 1}')],
        "bad device": ["attack", "--device", "tpu"],
        "share unknown model": ["share", "--model", "nope", "--out", tmp_path / "x.safetensors"],
    }


def test_bad_input_gives_one_line_and_exit_2(shared, tmp_path, capsys):
    cases = _bad_inputs(shared, tmp_path)
    for what, args in cases.items():
        out_dir = tmp_path / ("run-" + what.replace(" ", "_"))
        full = [*args, "--out", out_dir] if args[0] == "attack" else args
        try:
            code = main([str(a) for a in full])
        except SystemExit as exc:  # argparse's own errors exit through SystemExit
            code = exc.code
        captured = capsys.readouterr()
        lines = [line for line in captured.err.splitlines() if line.strip()]
        assert code == 2, (what, code, captured.err)
        assert len(lines) == 1 and lines[0].startswith("gradleak: error:"), (what, captured.err)
        assert "Traceback" not in captured.err
        assert not out_dir.exists(), what  # nothing half-written
    assert not any(p.name.startswith(".") and "partial" in p.name for p in tmp_path.iterdir())


def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "gradleak"
    res = subprocess.run([str(exe), "attack", "--model", "nope"], capture_output=True, text=True)
    assert res.returncode == 2
    assert res.stderr.strip().startswith("gradleak: error: unknown model 'nope'")


def test_same_command_and_seed_give_identical_metrics(tmp_path, capsys):
    args = ["attack", "--attack", "dlg", "--iterations", "8", "--no-progress", "--seed", "4"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    a = json.loads((tmp_path / "a" / "metrics.json").read_text())
    b = json.loads((tmp_path / "b" / "metrics.json").read_text())
    for m in (a, b):
        m.pop("wall_seconds")
    assert a == b
    assert a["versions"]["torch"] and a["versions"]["gradleak"] and a["seed"] == 4
    assert (tmp_path / "a" / "history.csv").read_text() == (tmp_path / "b" / "history.csv").read_text()


def test_train_then_attack_a_checkpoint(tmp_path, capsys):
    out = tmp_path / "train"
    code = main(["train", "--train-subset", "640", "--test-subset", "200", "--epochs", "1", "--batch-size", "32",
                 "--lr", "0.01", "--checkpoints", "0,1", "--out", str(out), "--no-progress"])
    assert code == 0
    info = json.loads((out / "training.json").read_text())
    assert [c["fraction"] for c in info["checkpoints"]] == [0.0, 1.0]
    code = main(["attack", "--checkpoint", str(out / "checkpoint-1.00.safetensors"), "--data", "fashion-mnist",
                 "--split", "test", "--attack", "idlg", "--iterations", "5", "--no-progress",
                 "--out", str(tmp_path / "run")])
    assert code == 0
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["label_accuracy"] == 1.0
    # A checkpoint for another architecture is refused with one line.
    code = main(["attack", "--checkpoint", str(out / "checkpoint-1.00.safetensors"), "--model", "convnet",
                 "--data", "fashion-mnist", "--out", str(tmp_path / "bad")])
    assert code == 2 and not (tmp_path / "bad").exists()
    assert main(["train", "--epochs", "-1", "--out", str(tmp_path / "t2")]) == 2
    assert not (tmp_path / "t2").exists()


@pytest.mark.parametrize("attack", [["gradinversion", "--model", "convnet", "--batch-size", "2", "--seeds", "2",
                                     "--share-bn-statistics"],
                                    ["ig", "--model", "convnet", "--restarts", "2"]])
def test_run_records_what_ran(attack, tmp_path, capsys):
    """config.json holds every field the attack resolved (no null preset/lr/labels) and
    metrics.json's settings every constant (alphas included); --config reruns it identically."""
    args = ["attack", "--attack", *attack, "--iterations", "4", "--no-progress", "--threads", "1"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    cfg = flat_config(json.loads((tmp_path / "a" / "config.json").read_text()))
    settings = json.loads((tmp_path / "a" / "metrics.json").read_text())["settings"]
    assert all(cfg[k] is not None for k in ("lr", "optimizer", "dtype", "labels", "iterations"))
    if attack[0] == "gradinversion":
        assert (cfg["preset"], cfg["seeds"], cfg["group"], cfg["bn"]) == ("cpu", 2, "registered", "exact")
        assert {"alpha_g", "alpha_tv", "alpha_bn", "alpha_group", "alpha_n", "alpha_l2"} <= set(settings)
        # every constant is in config.json too, so --config reruns them (issue 16)
        assert all(cfg[k] == settings[k] for k in ("alpha_g", "alpha_tv", "alpha_bn", "alpha_group", "alpha_n",
                                                    "alpha_l2", "warmup", "registration_start",
                                                    "registration_every", "registration_steps", "final"))
    else:
        assert cfg["restarts"] == 2 and settings["alpha_tv"] == 0.1
    assert main(["attack", "--config", str(tmp_path / "a" / "config.json"), "--out", str(tmp_path / "b")]) == 0
    a, b = (json.loads((tmp_path / r / "metrics.json").read_text()) for r in "ab")
    assert (a["psnr_mean"], a["gradient_distance"]) == (b["psnr_mean"], b["gradient_distance"])
    capsys.readouterr()
