"""Reliability, part 4: the files a run reads and writes, bad data found before the attack, and
errors answered before torch loads.

1. No output (``share --out/--truth/--model-out``, ``attack --out``), even with ``--force``,
   lands on what the run reads or inside an input folder: compared by identity, so a hard link,
   a symbolic link on the way or a linked class folder does not hide it.
2. A broken image anywhere in the data a run decodes (the batch, IIP's pool of other images) is
   an error before the attack's first step, with nothing left behind (no state, no staging
   folder); the same --out then works once the file is fixed.
3. A missing --data folder or --data-root and a malformed --defense value are answered before
   torch is imported, with the loader's and defenses/spec.py's own lines.

Every refusal is exit status 2 with one line ``gradleak: error: ...`` and nothing written (run
in-process through ``gradleak.cli.main``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import refused, run_cli
from gradleak.cli import main
from gradleak.errors import ConfigError, GradleakError

FAST = ["--iterations", "1", "--no-progress", "--threads", "1", "--attack", "idlg"]


def snapshot(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


def photo(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(value).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)


@pytest.fixture
def folder(tmp_path) -> Path:
    """An ImageFolder of 3 classes (a, b, c) of 3 photos each: items 0-2 are a/, 8 is c/2.png."""
    data = tmp_path / "data"
    for k, cls in enumerate("abc"):
        for i in range(3):
            photo(data / cls / f"{i}.png", 3 * k + i)
    return data


# ================================================================== 1. outputs never land on the inputs
@pytest.mark.parametrize("flag", ["--out", "--truth", "--model-out"])
def test_share_force_never_replaces_a_photo_of_the_data(flag, folder, tmp_path, capsys):
    target = folder / "a" / "0.png"
    outputs = {"--out": tmp_path / "u.safetensors", "--truth": tmp_path / "t.safetensors",
               "--model-out": tmp_path / "m.safetensors", flag: target}
    args = ["share", "--data", folder, "--force"] + [a for f, p in outputs.items() for a in (f, p)]
    before = snapshot(tmp_path)
    refused(args, capsys, flag, "a file of --data", "never an input")
    assert snapshot(tmp_path) == before


def test_share_force_refuses_a_hard_link_to_a_photo(folder, tmp_path, capsys):
    link = tmp_path / "u.safetensors"
    os.link(folder / "b" / "1.png", link)   # the same file under another name
    before = snapshot(tmp_path)
    refused(["share", "--data", folder, "--out", link, "--force"], capsys, "a file of --data")
    assert snapshot(tmp_path) == before


def test_share_refuses_outputs_inside_the_data_through_links(folder, tmp_path, capsys):
    """A link on the way to the output, and a class folder that links to a folder elsewhere."""
    (tmp_path / "way").symlink_to(folder / "b")
    outside = tmp_path / "outside"
    photo(outside / "0.png", 99)
    (folder / "d").symlink_to(outside)   # class d's photos live outside the data folder
    for out in (tmp_path / "way" / "u.safetensors", outside / "u.safetensors", folder / "u.safetensors"):
        before = snapshot(tmp_path)
        refused(["share", "--data", folder, "--out", out], capsys, "is inside --data")
        assert snapshot(tmp_path) == before


def test_share_refuses_the_data_root_the_text_file_and_the_checkpoint(folder, tmp_path, capsys):
    refused(["share", "--data", "cifar10-samples", "--data-root", folder, "--out", folder / "u.safetensors"],
            capsys, "inside --data-root")
    text = tmp_path / "sentences.txt"
    text.write_text("the cat sat\non the mat\n")
    before = text.read_bytes()
    refused(["share", "--modality", "text", "--data", text, "--out", text, "--force"], capsys, "--data", "itself")
    assert text.read_bytes() == before
    ckpt = tmp_path / "model.safetensors"
    ckpt.write_bytes(b"not read: refused before")
    refused(["share", "--checkpoint", ckpt, "--out", tmp_path / "u.safetensors", "--truth", ckpt, "--force"],
            capsys, "--truth", "--checkpoint")
    assert ckpt.read_bytes() == b"not read: refused before"


def test_share_force_still_replaces_its_own_earlier_output(folder, tmp_path, capsys):
    out = tmp_path / "u.safetensors"
    for _ in range(2):
        assert main(["share", "--data", str(folder), "--out", str(out), "--force"]) == 0
    assert out.stat().st_size > 0
    capsys.readouterr()


def test_attack_out_inside_the_data_folder_is_refused(folder, tmp_path, capsys):
    """A run folder inside the data would become a class of the next run's data."""
    before = snapshot(tmp_path)
    refused(["attack", "--data", folder, "--out", folder / "run", *FAST], capsys, "inside --data")
    assert snapshot(tmp_path) == before
    from gradleak.config import make_config
    from gradleak.pipeline import run

    with pytest.raises(ConfigError, match="inside --data"):   # the API refuses it too
        run(make_config(data=str(folder), out=str(folder / "a" / "run"), attack="idlg", iterations=1))
    assert snapshot(tmp_path) == before


# ================================================================== 2. bad data before the attack
def truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


BROKEN = {"truncated": truncated, "empty": lambda p: p.write_bytes(b""),
          "not an image": lambda p: p.write_text("hello, not a PNG\n")}


@pytest.mark.parametrize("where", ["iip pool", "batch"])
@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_broken_image_fails_before_the_attack_and_leaves_nothing(kind, where, folder, tmp_path, capsys,
                                                                   monkeypatch):
    """c/2.png (item 8) broken; the batch is items 0 and 3, or 0 and 8. IIP's pool (paper
    metrics, on by default) holds every image of the source: it was decoded after the attack."""
    from gradleak.engine import Engine

    BROKEN[kind](folder / "c" / "2.png")
    indices = ["--indices", "0", "--indices", "8" if where == "batch" else "3"]
    out = tmp_path / "runs" / "bad"
    args = ["attack", "--data", folder, "--batch-size", "2", *indices, "--out", out, *FAST]

    def no_attack(*a, **k):
        raise AssertionError("the attack started before the data was decoded")

    monkeypatch.setattr(Engine, "run", no_attack)
    before = snapshot(tmp_path)
    refused(args, capsys, "c/2.png")
    assert snapshot(tmp_path) == before   # no run folder, no .bad.state, no staging folder
    monkeypatch.undo()
    photo(folder / "c" / "2.png", 8)   # fixed: the same --out now works
    code, lines = run_cli(args, capsys)
    assert code == 0, lines
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["iip_pool_size"] >= 9 and not (tmp_path / "runs" / ".bad.state").exists()


# ================================================================== 3. answered before torch loads
BEFORE_TORCH = [
    (["attack", "--data", "no/such/folder"], "no such folder: no/such/folder"),
    (["attack", "--data-root", "no-such-root"], "no such folder: no-such-root (given as root)"),
    (["attack", "--defense", "gaussian:abc"], "defense gaussian: sigma must be a number, got 'abc'"),
    (["attack", "--defense", "prune:2"], "defense prune: fraction must be a finite number >= 0 and < 1, got 2"),
    (["attack", "--defense", "dpsgd:clip=0,noise=1"], "defense dpsgd: clip must be a finite number > 0, got 0"),
    (["attack", "--defense", "dpsgd:clip=1,noise=1,steps=1.5"], "defense dpsgd: steps must be an integer"),
    (["share", "--data", "./missing", "--out", "u.safetensors"], "no such folder: ./missing"),
    (["share", "--defense", "laplace:-1", "--out", "u.safetensors"], "defense laplace: b must be a finite number >= 0"),
    (["train", "--data", "missing/", "--out", "t"], "no such folder: missing/"),
]


def test_bad_values_are_answered_before_torch_is_imported(tmp_path):
    """One process runs every refusal; torch must still be absent after each."""
    script = (
        "import json, sys\n"
        "from gradleak.cli import main\n"
        "out = []\n"
        f"for argv in {json.dumps([a for a, _ in BEFORE_TORCH])}:\n"
        "    code = main(argv)\n"
        "    out.append([code, 'torch' in sys.modules])\n"
        "print(json.dumps(out))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == len(BEFORE_TORCH), lines
    for (argv, expected), (code, torch_loaded), line in zip(BEFORE_TORCH, results, lines, strict=True):
        assert code == 2 and not torch_loaded, (argv, code, torch_loaded, line)
        assert line.startswith("gradleak: error: ") and expected in line, (argv, line)


SPECS = ["gaussian:0.1", "gaussian:abc", "gaussian:-1", "gaussian:inf", "gaussian:nan", "gaussian", "gaussian:",
         "gaussian:sigma=0", "gaussian:0.1,0.2", "gaussian:sigma=1,sigma=2", "gaussian:mu=1", "Laplace:2",
         "laplace:b=-0.5", "prune:2", "prune:1", "prune:0", "prune:0.5,scope=global", "prune:0.5,scope=x",
         "prune:0.5,", "prune:scope=layer", "fp16", "fp16:1", "int8", "dpsgd:clip=1,noise=1", "dpsgd:1",
         "dpsgd:clip=0,noise=1", "dpsgd:clip=1,noise=-1", "dpsgd:clip=1,noise=1,delta=1",
         "dpsgd:clip=1,noise=1,delta=0", "dpsgd:clip=1,noise=1,sample_rate=1", "dpsgd:clip=1,noise=1,sample_rate=0",
         "dpsgd:clip=1,noise=1,steps=0", "dpsgd:clip=1,noise=1,steps=2.5", "dpsgd:clip=1,noise=1,steps=3",
         "dpsgd:clip=1,noise=1,steps=1e400", "dpsgd:noise=1", "gausian:0.1", "", "  ", " prune : 0.5 "]


@pytest.mark.parametrize("spec", SPECS)
def test_the_torch_free_defense_check_answers_as_the_parser(spec):
    """catalog.check_defense (before torch) and defenses.parse_defense: the same verdict, the same line."""
    from gradleak.catalog import check_defense
    from gradleak.defenses import parse_defense

    def answer(fn):
        try:
            fn(spec)
        except GradleakError as exc:
            return type(exc).__name__, str(exc)
        return None

    assert answer(check_defense) == answer(parse_defense)


def test_the_data_folder_check_answers_as_the_loader(tmp_path):
    from gradleak.cli import check_data_folder
    from gradleak.data import open_source

    (tmp_path / "file.png").write_bytes(b"x")
    for data, root in ((str(tmp_path / "nope"), None), (str(tmp_path / "file.png"), None), ("nope", None),
                       ("cifar10-samples", str(tmp_path / "nope")), ("cifar10-samples", str(tmp_path / "file.png"))):
        with pytest.raises(GradleakError) as early:
            check_data_folder(data, root)
        with pytest.raises(GradleakError) as late:
            open_source(data, root=root)
        assert (type(early.value), str(early.value)) == (type(late.value), str(late.value))
