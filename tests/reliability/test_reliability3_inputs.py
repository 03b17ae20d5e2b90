"""Reliability, part 3: inputs that gave a traceback, lost a result, replaced a file silently or
skipped data without a word.

Every refused input ends in exit status 2 with one line ``gradleak: error: ...`` on stderr and
nothing written (run in-process through ``gradleak.cli.main``)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from pathlib import Path

import pytest
from PIL import Image

from conftest import refused, rewrite_update as _rewrite
from gradleak.cli import main
from gradleak.config import MAX_SEED
from gradleak.errors import ConfigError, DataError

FAST = ["--iterations", "1", "--no-progress", "--threads", "1", "--attack", "idlg", "--no-paper-metrics"]
ROOT = os.geteuid() == 0


def snapshot(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


# ================================================================== 1. seeds beyond what torch takes
@pytest.mark.parametrize("args", [
    ["attack", *FAST, "--seed", str(2**64)],
    ["attack", *FAST, "--model-seed", str(10**20)],
    ["attack", *FAST, "--seed", str(MAX_SEED + 1)],
    ["share", "--seed", str(2**64)],
    ["share", "--model-seed", str(2**70)],
    ["experiment", "model-size", "--smoke", "--no-progress", "--executor", "inline", "--seed", str(2**64)],
    ["train", "--epochs", "0.01", "--train-subset", "64", "--test-subset", "16", "--no-progress",
     "--model-seed", str(10**20)],
])
def test_seed_too_large_is_one_line(args, tmp_path, capsys):
    out = tmp_path / ("u.safetensors" if args[0] == "share" else "out")
    before = snapshot(tmp_path)
    refused([*args, "--out", out], capsys, "seed")
    assert snapshot(tmp_path) == before


def test_largest_seed_works_for_every_threat(tmp_path, capsys):
    """The seeds derived from --seed (the clients' private shuffling) stay in torch's range."""
    for threat in (["--threat", "fedavg", "--local-steps", "2"],
                   ["--threat", "aggregate", "--clients", "2", "--inner", "fedavg"]):
        u = tmp_path / f"u-{threat[1]}.safetensors"
        assert main(["share", *threat, "--seed", str(MAX_SEED), "--model-seed", str(MAX_SEED), "--out", str(u)]) == 0
    u = tmp_path / "text.safetensors"
    assert main(["share", "--modality", "text", "--text", "a b", "--text", "c d", "--threat", "fedavg",
                 "--seed", str(MAX_SEED), "--model-seed", str(MAX_SEED), "--out", str(u)]) == 0
    capsys.readouterr()


@pytest.fixture(scope="module")
def text_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("text")
    assert main(["share", "--modality", "text", "--text", "hello world", "--out", str(d / "u.safetensors"),
                 "--truth", str(d / "t.safetensors")]) == 0
    return d




@pytest.mark.parametrize("seed", [2**64, -1, 10**30, "7", 1.5, True])
def test_text_update_metadata_seed_out_of_range(seed, text_files, tmp_path, capsys):
    def meta_fn(md):
        meta = json.loads(md["meta"])
        meta["model_kwargs"]["seed"] = seed
        md["meta"] = json.dumps(meta)

    bad = _rewrite(text_files / "u.safetensors", tmp_path / "bad.safetensors", meta_fn=meta_fn)
    refused(["attack", "--modality", "text", "--update", bad, "--iterations", "1", "--no-progress",
             "--out", tmp_path / "r"], capsys, "seed")
    assert not (tmp_path / "r").exists()


def test_update_metadata_with_a_huge_integer(text_files, tmp_path, capsys):
    def meta_fn(md):
        md["meta"] = md["meta"].replace('"batch_size": 1', '"batch_size": ' + "9" * 5000)

    bad = _rewrite(text_files / "u.safetensors", tmp_path / "bad.safetensors", meta_fn=meta_fn)
    assert "9" * 5000 in bad.read_bytes().decode("utf-8", "replace")
    refused(["attack", "--modality", "text", "--update", bad, "--iterations", "1", "--no-progress",
             "--out", tmp_path / "r"], capsys)
    assert not (tmp_path / "r").exists()


# ================================================================== 1. text truth token ids
@pytest.mark.parametrize("value", [-1, -5, 10**9])
def test_text_truth_token_id_outside_the_vocabulary(value, text_files, tmp_path, capsys):
    def tensors_fn(t):
        t["input_ids"][0, 1] = value

    bad = _rewrite(text_files / "t.safetensors", tmp_path / "t.safetensors", tensors_fn=tensors_fn)
    refused(["attack", "--modality", "text", "--update", text_files / "u.safetensors", "--truth", bad,
             "--iterations", "1", "--no-progress", "--out", tmp_path / "r"], capsys, "token id")
    assert not (tmp_path / "r").exists()


def test_text_truth_mask_not_zero_or_one(text_files, tmp_path, capsys):
    def tensors_fn(t):
        t["attention_mask"][0, 0] = 7

    bad = _rewrite(text_files / "t.safetensors", tmp_path / "t.safetensors", tensors_fn=tensors_fn)
    refused(["attack", "--modality", "text", "--update", text_files / "u.safetensors", "--truth", bad,
             "--iterations", "1", "--no-progress", "--out", tmp_path / "r"], capsys, "attention_mask")


# ================================================================== 1. --config contents
def test_config_with_a_5000_digit_integer(tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"seed": ' + "9" * 5000 + "}")
    line = refused(["attack", "--config", cfg, *FAST, "--out", tmp_path / "r"], capsys, "config file")
    assert len(line) < 600
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("field", ["out", "update", "truth", "checkpoint", "data_root", "data"])
def test_nul_byte_in_a_config_path(field, tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({field: str(tmp_path / "a\x00b\nc")}))
    before = snapshot(tmp_path)
    line = refused(["attack", "--config", cfg, *FAST], capsys, field)
    assert "\\x00" in line or "NUL" in line
    assert snapshot(tmp_path) == before


def test_nul_byte_in_paths_given_to_the_python_api(tmp_path):
    from gradleak.data import open_source
    from gradleak.experiments import make_options
    from gradleak.paths import check_input_file, check_output_dir, check_output_file
    from gradleak.training import TrainConfig

    for fn in (check_output_dir, check_output_file):
        with pytest.raises(ConfigError, match="NUL"):
            fn(str(tmp_path / "a\x00b"))
    with pytest.raises(Exception, match="NUL") as info:
        check_input_file(str(tmp_path / "a\x00b"), "update file")
    assert "\x00" not in str(info.value)
    with pytest.raises(DataError) as info:
        open_source("fashion-mnist", root=str(tmp_path / "x\x00y\nz"))
    assert "\x00" not in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigError):
        make_options(out=str(tmp_path / "e\x00"))
    with pytest.raises(ConfigError):
        TrainConfig(data_root="a\x00b")
    with pytest.raises(ConfigError):
        TrainConfig(seed=2**64)


# ================================================================== 1. names too long for the file system
LONG = "x" * 300


@pytest.mark.parametrize("command", ["attack", "share", "experiment", "train"])
def test_out_name_too_long(command, tmp_path, capsys):
    extra = {"attack": FAST, "share": [], "train": ["--epochs", "0.01", "--no-progress"],
             "experiment": ["model-size", "--smoke", "--no-progress", "--executor", "inline"]}[command]
    before = snapshot(tmp_path)
    for out in (tmp_path / LONG, tmp_path / LONG / "run", tmp_path / "sub" / LONG):
        refused([command, *extra, "--out", out], capsys, "too long")
    assert snapshot(tmp_path) == before


def test_truth_name_too_long(tmp_path, capsys):
    refused(["share", "--out", tmp_path / "u.safetensors", "--truth", tmp_path / LONG], capsys, "--truth", "too long")
    assert list(tmp_path.iterdir()) == []


def test_longest_legal_names_still_work(tmp_path):
    """A name the file system takes is not refused: the staging folder and the temporary file
    then get shorter names."""
    from gradleak.paths import StagedDir, atomic_write_bytes, check_output_dir

    name = "r" * 255
    stage = StagedDir(tmp_path / name)
    assert len(stage.path.name) <= 255 and stage.path.parent == tmp_path
    (stage.path / "x").write_text("done")
    assert stage.commit() == tmp_path / name and (tmp_path / name / "x").read_text() == "done"
    atomic_write_bytes(tmp_path / ("f" * 255), b"data")
    assert (tmp_path / ("f" * 255)).read_bytes() == b"data"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, "f" * 255])
    with pytest.raises(ConfigError, match="too long"):
        check_output_dir(tmp_path / ("r" * 256))


def test_share_with_the_longest_file_name(tmp_path, capsys):
    u = tmp_path / ("u" * 251 + ".st")
    assert main(["share", "--out", str(u)]) == 0 and u.is_file()
    assert [p.name for p in tmp_path.iterdir()] == [u.name]
    capsys.readouterr()


def test_attack_run_name_that_leaves_no_room_for_its_state(tmp_path, capsys):
    """The run's resumable state goes to .NAME.state beside it: a name that leaves no room for
    it is refused before the attack, in one line."""
    refused(["attack", *FAST, "--out", tmp_path / ("r" * 250)], capsys, "state")
    assert list(tmp_path.iterdir()) == []


# ================================================================== 2. the loser of two runs keeps its result
def test_output_appearing_during_a_run_keeps_the_result(tmp_path, capsys, monkeypatch):
    import importlib

    run_module = importlib.import_module("gradleak.pipeline.run")  # (gradleak.pipeline.run is also a function)
    out = tmp_path / "R"
    real = run_module.attack_case

    def attack_then_someone_else_writes_out(*args, **kwargs):
        result = real(*args, **kwargs)
        out.mkdir()
        (out / "theirs.txt").write_text("the other run's")
        return result

    monkeypatch.setattr(run_module, "attack_case", attack_then_someone_else_writes_out)
    line = refused(["attack", *FAST, "--out", out], capsys, "appeared")
    kept = Path(line.rsplit(" in ", 1)[1].split(";")[0].strip())
    assert kept.is_dir() and kept.parent == tmp_path, line
    assert (kept / "metrics.json").is_file() and (kept / "report.html").is_file()
    assert sorted(p.name for p in out.iterdir()) == ["theirs.txt"]
    monkeypatch.undo()
    # a later run in the same folder does not take it for a dead run's staging folder
    assert main(["attack", *FAST, "--out", str(tmp_path / "later")]) == 0
    assert (kept / "metrics.json").is_file()
    capsys.readouterr()


@pytest.mark.parametrize("what", ["folder", "file"])
def test_output_appearing_inside_commit_keeps_the_result(what, tmp_path, monkeypatch):
    """R appears between the commit's check and its rename (the rename then fails)."""
    import gradleak.paths.staging as paths

    out = tmp_path / "R"
    stage = paths.StagedDir(out)
    (stage.path / "metrics.json").write_text("{}")
    real = os.path.lexists

    def lexists(p):
        if Path(p) == out:
            if what == "folder":
                out.mkdir(exist_ok=True)
                (out / "theirs").write_text("x")
            else:
                out.write_text("theirs")
            return False
        return real(p)

    monkeypatch.setattr(paths.os.path, "lexists", lexists)
    with pytest.raises(paths.OutputAppearedError) as info:
        stage.commit()
    monkeypatch.undo()
    stage.discard()   # what every caller does on an exception: it must not remove the result
    kept = info.value.kept
    assert str(kept) in str(info.value) and (kept / "metrics.json").read_text() == "{}"


# ================================================================== 3. share never replaces a file silently
@pytest.fixture
def shared(tmp_path):
    u, t = tmp_path / "u.safetensors", tmp_path / "t.safetensors"
    u.write_bytes(b"keep update")
    t.write_bytes(b"keep truth")
    return u, t


def test_share_refuses_an_existing_update_or_truth(shared, tmp_path, capsys):
    u, t = shared
    before = snapshot(tmp_path)
    refused(["share", "--out", u], capsys, "exists", "--force")
    refused(["share", "--out", tmp_path / "new.safetensors", "--truth", t], capsys, "exists", "--force")
    assert snapshot(tmp_path) == before     # neither file written


def test_check_output_file_force():
    from gradleak.paths import check_output_file

    path = Path(__file__)
    with pytest.raises(ConfigError, match="exists; pass --force to replace it"):
        check_output_file(path, "--out", force=False)
    assert check_output_file(path, "--out", force=True) == path
    assert check_output_file(path, "report") == path  # callers that rebuild their own file in place


def test_case_save_force_replaces_both(tmp_path):
    from gradleak.config import make_config
    from gradleak.fl import load_truth, load_update
    from gradleak.pipeline.image import simulate_client

    case = simulate_client(make_config())
    u, t = tmp_path / "u.safetensors", tmp_path / "t.safetensors"
    case.save(u, t)
    with pytest.raises(ConfigError, match="exists"):
        case.save(u, t)
    u.write_bytes(b"old")
    t.write_bytes(b"old")
    case.save(u, t, force=True)
    update, _ = load_update(u)
    load_truth(t, update.meta)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.safetensors", "u.safetensors"]


@pytest.mark.parametrize("force", [False, True])
def test_sigterm_while_saving_writes_both_files_or_neither(force, tmp_path, monkeypatch):
    """SIGTERM between the update's and the truth's rename: both files are in place before the
    signal takes effect; no temporary file is left."""
    from gradleak.config import make_config
    from gradleak.pipeline.image import simulate_client

    case = simulate_client(make_config())
    u, t = tmp_path / "u.safetensors", tmp_path / "t.safetensors"
    if force:
        u.write_bytes(b"old")
        t.write_bytes(b"old")

    class Term(Exception):
        pass

    def on_term(signum, frame):
        raise Term()

    renames = []
    real_replace, real_link = os.replace, os.link

    def counted(real):
        def fn(src, dst, *a, **k):
            if Path(dst).parent == tmp_path and not Path(dst).name.startswith("."):
                renames.append(dst)
                if len(renames) == 2:
                    os.kill(os.getpid(), signal.SIGTERM)
            return real(src, dst, *a, **k)
        return fn

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        monkeypatch.setattr(os, "replace", counted(real_replace))
        monkeypatch.setattr(os, "link", counted(real_link))
        with pytest.raises(Term):
            case.save(u, t, force=True) if force else case.save(u, t)
    finally:
        signal.signal(signal.SIGTERM, previous)
        monkeypatch.undo()
    assert len(renames) == 2
    assert u.read_bytes()[:3] != b"old" and t.read_bytes()[:3] != b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.safetensors", "u.safetensors"]


def test_text_share_refuses_an_existing_truth(shared, tmp_path, capsys):
    u, t = shared
    before = snapshot(tmp_path)
    refused(["share", "--modality", "text", "--text", "hi there", "--out", tmp_path / "n.safetensors",
             "--truth", t], capsys, "exists")
    assert snapshot(tmp_path) == before


# ================================================================== 4. unreadable data is never skipped silently
def _image_folder(root: Path) -> Path:
    for cls, colour in (("ant", (200, 10, 10)), ("bee", (10, 200, 10))):
        (root / cls).mkdir(parents=True)
        for k in range(2):
            Image.new("RGB", (32, 32), tuple(c + 20 * k for c in colour)).save(root / cls / f"{k}.png")
    return root


def _deny(monkeypatch, name: str, denied: Path) -> None:
    real = getattr(os, name)

    def fn(path, *args, **kwargs):
        if not isinstance(path, int) and Path(os.fsdecode(path)) == denied:
            if name == "access":
                return False
            raise PermissionError(13, "Permission denied", os.fsdecode(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, name, fn)


def test_unreadable_class_folder_is_refused(tmp_path, capsys, monkeypatch):
    root = _image_folder(tmp_path / "data")
    _deny(monkeypatch, "scandir", root / "bee")
    out = tmp_path / "r"
    for batch in ("1", "2"):
        line = refused(["attack", *FAST, "--data", root, "--batch-size", batch, "--out", out], capsys, "bee")
        assert "read" in line
    assert not out.exists()


def test_unreadable_subfolder_is_refused(tmp_path, monkeypatch):
    from gradleak.data import open_source

    root = _image_folder(tmp_path / "data")
    (root / "bee" / "more").mkdir()
    Image.new("RGB", (32, 32)).save(root / "bee" / "more" / "x.png")
    _deny(monkeypatch, "scandir", root / "bee" / "more")
    with pytest.raises(DataError, match="more"):
        open_source(str(root))


def test_unreadable_image_file_is_refused(tmp_path, capsys, monkeypatch):
    root = _image_folder(tmp_path / "data")
    _deny(monkeypatch, "access", root / "bee" / "1.png")
    refused(["attack", *FAST, "--data", root, "--out", tmp_path / "r"], capsys, "1.png")
    assert not (tmp_path / "r").exists()


def test_unreadable_idx_folder_is_refused(tmp_path, monkeypatch):
    from gradleak.data import open_source

    raw = tmp_path / "fm" / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    (tmp_path / "fm" / "readme.txt").write_text("x")
    _deny(monkeypatch, "stat", raw / "train-images-idx3-ubyte")
    with pytest.raises(DataError, match="raw"):
        open_source(str(tmp_path / "fm"))


@pytest.mark.skipif(ROOT, reason="root reads mode-000 folders; the monkeypatched tests above always run")
def test_unreadable_class_folder_chmod(tmp_path, capsys):
    root = _image_folder(tmp_path / "data")
    os.chmod(root / "bee", 0)
    try:
        refused(["attack", *FAST, "--data", root, "--out", tmp_path / "r"], capsys, "bee")
    finally:
        os.chmod(root / "bee", 0o755)


# ================================================================== 1. a tampered experiment store
TINY = ["model-size", "--smoke", "--no-progress", "--width", "4", "--samples", "1", "--iterations", "5",
        "--executor", "inline"]


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    out = tmp_path_factory.mktemp("exp") / "size"
    assert main(["experiment", *TINY, "--out", str(out)]) == 0
    return out


def _tamper_metrics(folder: Path, fn) -> None:
    con = sqlite3.connect(folder / "cells" / "results.sqlite")
    try:
        for rowid, text in con.execute("SELECT rowid, metrics FROM cells").fetchall():
            metrics = json.loads(text)
            fn(metrics)
            con.execute("UPDATE cells SET metrics = ? WHERE rowid = ?", (json.dumps(metrics), rowid))
        con.commit()
    finally:
        con.close()


@pytest.mark.parametrize("tamper", ["drop-psnr", "drop-per-image-psnr", "psnr-text", "psnr-null", "per-image-not-list"])
def test_tampered_experiment_store_is_one_line(tamper, experiment, tmp_path, capsys):
    import shutil

    out = tmp_path / "size"
    shutil.copytree(experiment, out)
    fn = {"drop-psnr": lambda m: m.pop("psnr_mean"),
          "drop-per-image-psnr": lambda m: m["per_image"][0].pop("psnr"),
          "psnr-text": lambda m: m.__setitem__("psnr_mean", "high"),
          "psnr-null": lambda m: m.__setitem__("psnr_mean", None),
          "per-image-not-list": lambda m: m.__setitem__("per_image", 3)}[tamper]
    _tamper_metrics(out, fn)
    outputs = {k: v for k, v in snapshot(out).items() if not k.startswith("cells")}
    line = refused(["experiment", *TINY, "--out", out], capsys, "results.sqlite")
    assert "psnr" in line or "per_image" in line
    # the experiment's outputs are left as they were (the sweep engine itself records the run in cells/)
    assert {k: v for k, v in snapshot(out).items() if not k.startswith("cells")} == outputs


# ================================================================== 5. the same family: checkpoint metadata
def test_checkpoint_metadata_asking_for_an_absurd_model(tmp_path):
    """load_checkpoint builds the model a checkpoint's metadata describes: 10**13 classes is a
    one-line UpdateFileError, not an allocation of petabytes."""
    from gradleak.errors import UpdateFileError
    from gradleak.training import TrainConfig, load_checkpoint, train

    result = train(TrainConfig(data="fashion-mnist", epochs=0.01, train_subset=64, test_subset=16,
                               checkpoints=(1.0,)), tmp_path / "t", progress=False)
    src = result.checkpoints[0].path

    def meta_fn(md):
        meta = json.loads(md["meta"])
        meta["num_classes"] = 10**13
        md["meta"] = json.dumps(meta)

    bad = _rewrite(src, tmp_path / "bad.safetensors", meta_fn=meta_fn)
    with pytest.raises(UpdateFileError, match="num_classes"):
        load_checkpoint(bad)


@pytest.mark.parametrize("flags", [
    ["share", "--data", "d" * 300, "--out", "{tmp}/u.safetensors"],
    ["attack", *FAST, "--data", "{tmp}/" + "d" * 300, "--out", "{tmp}/r"],
    ["experiment", "model-size", "--smoke", "--no-progress", "--data", "d" * 300, "--out", "{tmp}/e"],
])
def test_input_path_with_a_name_too_long(flags, tmp_path, capsys):
    """A --data path with a name no file system holds is one line, not the OSError of the first
    look at it."""
    refused([f.replace("{tmp}", str(tmp_path)) for f in flags], capsys, "too long")
    assert list(tmp_path.iterdir()) == []
