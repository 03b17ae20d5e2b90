"""Issue 15: files and paths that could hurt the person who opens them.

By family: files that name code or folders, absurd but well-typed metadata, output paths that
could only fail (or replace something) after the work, inputs that are not regular files,
parsers (nesting, duplicate keys), text that is not UTF-8. Every case ends in exit status 2
with one line ``gradleak: error: ...``, nothing half-written, no user file replaced, within
seconds, and the attack is never started when the problem could be seen before it.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import gradleak.engine.core as engine
import gradleak.pipeline.image as runner
from gradleak.cli import main

# A hang (a FIFO read, an endless walk) fails the test here; timings belong in benchmarks/.
pytestmark = pytest.mark.timeout(180)
SETTINGS = settings(max_examples=8, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
FAST = ["--iterations", "1", "--no-progress", "--threads", "1", "--attack", "idlg"]


@pytest.fixture
def no_attack(monkeypatch):
    """Fails the test if an attack starts: the error must come before any work."""
    calls = []

    def spy(*args, **kwargs):
        calls.append(args[1])
        raise AssertionError("the attack ran although the problem was visible before it")

    monkeypatch.setattr(engine.Engine, "run", spy)
    return calls


@pytest.fixture
def no_model_built(monkeypatch):
    """Records every real model an update file makes gradleak build (meta-device shapes aside)."""
    import gradleak.fl.files as files

    built = []
    real = files.build_model
    monkeypatch.setattr(files, "build_model", lambda *a, **k: built.append(a) or real(*a, **k))
    return built


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() and not p.is_symlink() else b"<dir/link>")
            for p in sorted(folder.rglob("*"))}


def clean_error(args, capsys) -> str:
    """Exit 2 and one line ``gradleak: error: ...`` (a hang fails the module's timeout)."""
    try:
        code = main([os.fspath(a) if isinstance(a, Path) else a for a in args])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (args, code, err)
    assert len(lines) == 1 and lines[0].startswith("gradleak: error:"), err
    return lines[0]


def rewrite_meta(src: Path, dst: Path, **changes) -> Path:
    with safe_open(str(src), "pt") as f:
        md = dict(f.metadata())
    meta = json.loads(md["meta"])
    for k, v in changes.items():
        if k.startswith("threat."):
            meta["threat"][k.split(".", 1)[1]] = v
        elif k.startswith("model_kwargs."):
            meta["model_kwargs"][k.split(".", 1)[1]] = v
        else:
            meta[k] = v
    md["meta"] = json.dumps(meta)
    save_file(load_file(str(src)), str(dst), metadata=md)
    return dst


# ------------------------------------------------------------ files that name code or folders
@pytest.fixture
def trap_module(tmp_path, monkeypatch):
    """A module that leaves a marker file when it is imported, on sys.path."""
    name = "gradleak_trap_mod"
    marker = tmp_path / "IMPORTED"
    (tmp_path / f"{name}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('x')\n"
        "from gradleak.models.small import LeNetDLG\n"
        "def net(num_classes, channels, image_size):\n    return LeNetDLG(num_classes, channels, image_size)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{name}:net", marker
    sys.modules.pop(name, None)


@SETTINGS
@given(name=st.sampled_from(["this:d", "os:system", "gradleak_trap_mod:net", "subprocess:run", "a.b.c:d"]))
def test_update_naming_code_is_refused(name, valid, tmp_path, capsys, trap_module, no_attack):
    sys.modules.pop("this", None)
    bad = rewrite_meta(valid / "u.safetensors", tmp_path / "code.safetensors", model=name)
    line = clean_error(["attack", *FAST, "--update", bad, "--out", tmp_path / "r"], capsys)
    assert "never imports code" in line
    assert not trap_module[1].exists() and "this" not in sys.modules
    assert not (tmp_path / "r").exists()


def test_config_and_sweep_spec_naming_code_are_refused(tmp_path, capsys, trap_module, no_attack):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model": trap_module[0], "iterations": 1}))
    assert "never imports code" in clean_error(["attack", "--config", cfg, "--out", tmp_path / "r"], capsys)
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"base: {{iterations: 1}}\ngrid: {{model: [lenet-dlg, '{trap_module[0]}']}}\n")
    assert "never imports code" in clean_error(["sweep", spec, "--out", tmp_path / "s", "--executor", "inline"], capsys)
    assert not trap_module[1].exists()
    assert not (tmp_path / "s").exists() and not (tmp_path / "r").exists()


def test_own_model_only_from_the_command_line(tmp_path, capsys, trap_module):
    """--model module:callable is the user's own decision: share and attack run with it, and the
    update's model name must then match."""
    name, marker = trap_module
    u = tmp_path / "u.safetensors"
    assert main(["share", "--model", name, "--out", str(u)]) == 0
    assert marker.exists()
    marker.unlink()
    line = clean_error(["attack", *FAST, "--update", u, "--out", tmp_path / "r0"], capsys)
    assert "never imports code" in line and not marker.exists()
    assert main(["attack", *FAST, "--update", str(u), "--model", name, "--out", str(tmp_path / "r1")]) == 0
    assert (tmp_path / "r1" / "metrics.json").is_file()


def test_truth_naming_a_folder_is_not_walked(valid, tmp_path, capsys, monkeypatch):
    opened = []
    real = runner.open_source

    def spy(name, *args, **kwargs):
        opened.append(str(name))
        return real(name, *args, **kwargs)

    monkeypatch.setattr(runner, "open_source", spy)
    for source in ("/", str(tmp_path)):
        truth = tmp_path / "t.safetensors"
        with safe_open(str(valid / "t.safetensors"), "pt") as f:
            md = dict(f.metadata())
        md["source"] = source
        save_file(load_file(str(valid / "t.safetensors")), str(truth), metadata=md)
        out = tmp_path / f"r{len(opened)}-{source.count('/')}"
        assert main(["attack", *FAST, "--update", str(valid / "u.safetensors"), "--truth", str(truth),
                     "--out", str(out)]) == 0
        assert json.loads((out / "metrics.json").read_text())["iip"] is not None  # over the originals
    assert opened == []
    capsys.readouterr()


def test_named_truth_source_gives_the_iip_pool(valid, tmp_path, monkeypatch):
    opened = []
    real = runner.open_source
    monkeypatch.setattr(runner, "open_source", lambda name, *a, **k: opened.append(name) or real(name, *a, **k))
    assert main(["attack", *FAST, "--update", str(valid / "u.safetensors"), "--truth", str(valid / "t.safetensors"),
                 "--out", str(tmp_path / "r")]) == 0
    assert opened == ["cifar10-samples"]


def test_symlink_loop_in_a_data_folder(tmp_path, cifar10):
    """A link back up the tree is followed once: the walk ends, and images keep their class."""
    from gradleak.data import open_source

    for cls, index in (("a", 0), ("b", 1)):
        (tmp_path / "d" / cls / "sub").mkdir(parents=True)
        (tmp_path / "d" / cls / f"{cls}.png").write_bytes(cifar10.path(index).read_bytes())
    (tmp_path / "d" / "a" / "sub" / "loop").symlink_to("../..")
    (tmp_path / "d" / "b" / "sub" / "self").symlink_to(".")
    src = open_source(str(tmp_path / "d"))
    assert len(src) == 2 and [src.label(i) for i in range(2)] == [0, 1]


# ------------------------------------------------------------ absurd but well-typed metadata
@SETTINGS
@given(change=st.sampled_from([
    {"batch_size": 10**9}, {"batch_size": 10**12}, {"batch_size": 5000}, {"num_classes": 10**9},
    {"num_classes": 10**12}, {"model_kwargs.width": 10**9}, {"model_kwargs.width": 4097},
    {"model_kwargs.depth": 3}, {"input_shape": [3, 10**6, 10**6]}, {"input_shape": [10**4, 32, 32]},
    {"threat.name": "fedavg", "threat.local_steps": 10**9},
    {"threat.name": "fedavg", "threat.local_steps": 2, "threat.local_batch_size": 10**6},
    {"threat.name": "aggregate", "threat.clients": 5},
    {"threat.name": "aggregate", "threat.clients": 10**12},
    {"threat.name": "fedavg", "threat.local_lr": True},
    {"threat.name": "fedavg", "threat.surprise": 1},
]))
def test_absurd_metadata(change, valid, tmp_path, capsys, no_attack, no_model_built):
    bad = rewrite_meta(valid / "u.safetensors", tmp_path / "absurd.safetensors", **change)
    clean_error(["attack", *FAST, "--update", bad, "--out", tmp_path / "r"], capsys)
    assert no_model_built == []  # refused before any model (of any size) was allocated


def test_width_in_range_but_not_in_the_file(tmp_path, capsys, no_attack, no_model_built):
    """A convnet of width 4096 is allowed by the bounds; the file's tensors decide, before the
    model is allocated (meta-device shapes)."""
    u = tmp_path / "u.safetensors"
    assert main(["share", "--model", "convnet", "--width", "8", "--out", str(u)]) == 0
    bad = rewrite_meta(u, tmp_path / "wide.safetensors", **{"model_kwargs.width": 4096})
    assert "shape" in clean_error(["attack", *FAST, "--update", bad, "--out", tmp_path / "r"], capsys)
    assert no_model_built == []


# ------------------------------------------------------------ inputs that are not regular files
@pytest.mark.parametrize("flag", ["--update", "--config", "--checkpoint", "text --data"])
@pytest.mark.parametrize("target", ["folder", "/dev/zero", "fifo"])
def test_inputs_that_are_not_files(flag, target, tmp_path, capsys, no_attack):
    if target == "folder":
        path, words = tmp_path / "folder", "is a folder"
        path.mkdir()
    elif target == "fifo":
        path, words = tmp_path / "pipe", "not a regular file"
        os.mkfifo(path)
    else:
        path, words = Path(target), "not a regular file"
    args = (["--modality", "text", "--attack", "bow", "--data", path] if flag == "text --data"
            else [*FAST, flag, path])
    line = clean_error(["attack", *args, "--out", tmp_path / "r"], capsys)
    assert words in line and "does not exist" not in line


# ------------------------------------------------------------ output paths
def _attack(tmp_path, out):
    return ["attack", *FAST, "--out", out]


@pytest.mark.parametrize("case", ["symlink-to-empty", "dot", "dotdot", "below-file", "file", "not-empty",
                                  "proc", "non-utf8"])
def test_attack_out_checked_before_the_attack(case, tmp_path, capsys, no_attack, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "afile").write_text("keep me")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me too")
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    out = {"symlink-to-empty": "link", "dot": ".", "dotdot": "..", "below-file": "afile/run",
           "file": "afile", "not-empty": "full", "proc": "/proc/gradleak-run",
           "non-utf8": os.fsdecode(b"run-\xff")}[case]
    before = snapshot(tmp_path)
    clean_error(_attack(tmp_path, out), capsys)
    assert snapshot(tmp_path) == before
    assert not [p for p in tmp_path.iterdir() if "partial" in p.name]


def test_share_out_and_truth_checked_first(tmp_path, capsys, monkeypatch):
    simulated = []
    monkeypatch.setattr(runner, "simulate_client", lambda cfg: simulated.append(cfg))
    (tmp_path / "afile").write_text("keep")
    (tmp_path / "link.safetensors").symlink_to(tmp_path / "afile")
    before = snapshot(tmp_path)
    for args in (["--out", tmp_path / "x.safetensors", "--truth", tmp_path / "x.safetensors"],
                 ["--out", tmp_path / "x.safetensors", "--truth", tmp_path / "sub" / ".." / "x.safetensors"],
                 ["--out", tmp_path, "--truth", tmp_path / "t.safetensors"],
                 ["--out", tmp_path / "afile" / "u.safetensors"],
                 ["--out", tmp_path / "link.safetensors"],
                 ["--out", "/dev/null"],
                 ["--out", tmp_path / os.fsdecode(b"u\xfe.safetensors")]):
        clean_error(["share", *args], capsys)
    assert simulated == [] and snapshot(tmp_path) == before


@pytest.mark.parametrize("command", ["train", "experiment"])
def test_other_outputs_checked_first(command, tmp_path, capsys):
    (tmp_path / "afile").write_text("keep")
    before = snapshot(tmp_path)
    extra = (["--data", "fashion-mnist", "--epochs", "0.01"] if command == "train"
             else ["optimizers", "--smoke"])
    for out in (tmp_path / "afile" / "x", ".", tmp_path / "afile", "/proc/gradleak-out"):
        clean_error([command, *extra, "--out", out], capsys)
    assert snapshot(tmp_path) == before


def test_killed_run_leaves_no_partial_for_long(tmp_path, capsys):
    """SIGKILL skips every clean-up; the next run writing into the same folder removes the dead
    process's staging folder (which holds its reconstruction once written)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gradleak.cli", "attack", "--attack", "dlg", "--iterations", "100000",
                             "--no-progress", "--threads", "1", "--out", str(tmp_path / "killed")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while not [p for p in tmp_path.iterdir() if ".partial-" in p.name]:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert [p for p in tmp_path.iterdir() if ".partial-" in p.name]
    assert main(["attack", *FAST, "--out", str(tmp_path / "next")]) == 0
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]
    capsys.readouterr()


def test_staging_names_are_unpredictable(tmp_path):
    from gradleak.paths import StagedDir

    a, b = StagedDir(tmp_path / "run"), StagedDir(tmp_path / "run")
    assert a.path != b.path and a.path.parent == tmp_path and a.path.name.startswith(".run.partial-")
    a.discard()
    b.discard()
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------ parsers and text
@pytest.mark.parametrize("content", [
    "[" * 100000 + "]" * 100000,
    '{"a":' * 50000 + "1" + "}" * 50000,
    '{"iterations": 1, "iterations": 2}',
    '{"defense": ["gaussian:1e-3"], "defense": []}',
])
def test_config_parser(content, tmp_path, capsys, no_attack):
    cfg = tmp_path / "c.json"
    cfg.write_text(content)
    clean_error(["attack", "--config", cfg, "--out", tmp_path / "r"], capsys)


@SETTINGS
@given(raw=st.binary(min_size=1, max_size=6).filter(lambda b: not _utf8(b)))
def test_text_and_names_not_utf8(raw, tmp_path, capsys, no_attack):
    bad = os.fsdecode(b"x" + raw)
    clean_error(["attack", "--modality", "text", "--attack", "bow", "--text", bad, "--out", tmp_path / "r"], capsys)
    clean_error(["attack", *FAST, "--data", bad, "--out", tmp_path / "r"], capsys)
    assert list(tmp_path.iterdir()) == []


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_resume_state_naming_code(tmp_path, capsys):
    """The saved state of an interrupted run is a file as well: a module:callable model in its
    config is refused on --resume unless the user names the same --model again."""
    proc = subprocess.Popen([sys.executable, "-m", "gradleak.cli", "attack", "--attack", "dlg", "--iterations", "100000",
                             "--no-progress", "--threads", "1", "--checkpoint-every", "5", "--out", str(tmp_path / "run")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    state = tmp_path / ".run.state"
    # Signal only once the loop has written a checkpoint: a fixed sleep after the staging folder
    # appeared was not always enough on a loaded machine (CI: the SIGTERM came before the loop
    # installed its handler, so no state was saved).
    deadline = time.time() + 240
    while not (state / "state.json").is_file():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.time() < deadline, "no checkpoint within 240 s"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) != 0
    cfg = json.loads((state / "config.json").read_text())
    cfg["model"] = "this:d"
    (state / "config.json").write_text(json.dumps(cfg))
    sys.modules.pop("this", None)
    line = clean_error(["attack", "--resume", tmp_path / "run"], capsys)
    assert "never imports code" in line and "this" not in sys.modules
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


# ------------------------------------------------------------ flags: absurd but well-typed values
@pytest.mark.parametrize("args", [
    ["train", "--data", "fashion-mnist", "--threads", "0"], ["train", "--data", "fashion-mnist", "--threads", "100000"],
    ["train", "--data", "fashion-mnist", "--epochs", "1e12"], ["train", "--data", "fashion-mnist", "--width", "100000"],
    ["train", "--data", "fashion-mnist", "--model-seed", "-1"],
    ["train", "--data", "fashion-mnist", "--batch-size", "10000000"],
    ["experiment", "optimizers", "--smoke", "--batches", "1000000"],
    ["experiment", "optimizers", "--smoke", "--batch-sizes", "1,100000"],
    ["experiment", "optimizers", "--smoke", "--samples", "1000000000"],
    ["experiment", "optimizers", "--smoke", "--threads", "100000"],
    ["attack", "--batch-size", "1000000"], ["attack", "--threads", "100000"],
    ["attack", "--threat", "aggregate", "--clients", "100000"],
    ["attack", "--threat", "fedavg", "--local-steps", "1000000000"],
    # the FedAvg client's local training (fl.optim, fl.augment): out of range, or not applying
    *[["attack", "--threat", "fedavg", *flags] for flags in (
        ["--local-epochs", "0"], ["--local-epochs", "100000"], ["--local-momentum", "1"],
        ["--local-momentum", "-0.1"], ["--local-weight-decay", "-0.1"], ["--local-weight-decay", "2"],
        ["--local-optimizer", "adam", "--local-betas", "0.9,1"], ["--local-optimizer", "adam", "--local-betas", "x"],
        ["--local-optimizer", "adam", "--local-betas", "0.9"], ["--local-optimizer", "adam", "--local-eps", "0"],
        ["--local-optimizer", "rmsprop"], ["--local-augment", "rotate"],
        ["--local-augment", "crop-flip", "--local-crop-padding", "65"], ["--local-nesterov"],
        ["--local-epochs", "2", "--local-steps", "3"], ["--local-optimizer", "adam", "--local-momentum", "0.9"],
        ["--local-betas", "0.8,0.9"], ["--local-eps", "1e-6"], ["--local-crop-padding", "2"],
        ["--batch-size", "256", "--local-batch-size", "1", "--local-epochs", "1000"])],
    ["attack", "--local-optimizer", "adam"], ["attack", "--local-epochs", "2"],
    ["attack", "--modality", "text", "--threat", "fedavg", "--local-momentum", "0.9"],
])
def test_absurd_flags(args, tmp_path, capsys, no_attack):
    clean_error([*args, "--out", tmp_path / "o"], capsys)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("out", ["afile", "afile/x", ".", "link", "/proc/gradleak-audit", "full"])
def test_audit_flower_out_checked_before_the_federation(out, tmp_path, capsys, monkeypatch):
    import gradleak.audit.example as example

    started = []
    monkeypatch.setattr(example, "run_federation", lambda *a, **k: started.append(a))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("keep")
    (tmp_path / "empty").mkdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "audit.csv").write_text("keep")
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    before = snapshot(tmp_path)
    clean_error(["audit-flower", "--rounds", "1", "--clients", "2", "--iterations", "1", "--out", out], capsys)
    assert started == [] and snapshot(tmp_path) == before


def test_flags_that_an_update_file_decides(tmp_path, capsys, no_attack):
    """With --update the file decides what the client did: a flag that contradicts it, or that
    describes the client's private choices, is an error (never silently ignored)."""
    u = tmp_path / "u.safetensors"
    assert main(["share", "--model", "convnet", "--width", "8", "--threat", "fedavg", "--local-steps", "2",
                 "--batch-size", "2", "--out", str(u)]) == 0
    for flags in (["--threat", "fedsgd"], ["--batch-size", "4"], ["--model", "lenet-dlg"], ["--width", "16"],
                  ["--local-steps", "3"], ["--local-lr", "0.5"], ["--model-seed", "3"], ["--allow-repeats"],
                  ["--share-bn-statistics"], ["--threat", "aggregate", "--clients", "2"],
                  ["--local-optimizer", "adam"], ["--local-momentum", "0.9"], ["--local-epochs", "2"],
                  ["--local-augment", "flip"], ["--local-weight-decay", "1e-4"]):
        line = clean_error(["attack", *FAST, "--update", u, *flags, "--out", tmp_path / "r"], capsys)
        assert "update file" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["u.safetensors"]


def test_update_run_records_what_the_file_stands_for(tmp_path, capsys):
    """config.json of an update-file run holds the file's model, batch and threat, so that
    `--config` reruns it with identical numbers."""
    u = tmp_path / "u.safetensors"
    assert main(["share", "--model", "convnet", "--width", "8", "--threat", "fedavg", "--local-steps", "2",
                 "--batch-size", "2", "--out", str(u), "--truth", str(tmp_path / "t.safetensors")]) == 0
    assert main(["attack", *FAST, "--update", str(u), "--truth", str(tmp_path / "t.safetensors"),
                 "--model", "convnet", "--out", str(tmp_path / "a")]) == 0
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())["run"]
    assert (cfg["model"], cfg["width"], cfg["batch_size"], cfg["threat"], cfg["local_steps"]) == \
        ("convnet", 8, 2, "fedavg", 2)
    assert main(["attack", "--config", str(tmp_path / "a" / "config.json"), "--out", str(tmp_path / "b")]) == 0
    a, b = (json.loads((tmp_path / r / "metrics.json").read_text()) for r in "ab")
    assert a["psnr_mean"] == b["psnr_mean"] and a["labels_restored"] == b["labels_restored"]
    capsys.readouterr()
