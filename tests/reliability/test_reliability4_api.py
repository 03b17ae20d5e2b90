"""Reliability, part 4: the Python API's thread policy, and the labels of an aggregate's clients.

1. The CLI starts fewer torch threads when other work keeps the cores busy; the Python API
   (``pipeline.run``, ``attack_update``) ran on torch's default and was many times slower on a
   busy machine. Both now apply the same policy (runtime.threads_for_run), recorded in
   config.json, the caller's threads restored after. The load is simulated (no timing here).
2. An aggregate's clients each draw a batch with distinct labels; labels may repeat across
   clients (as in a real federation), so 2 clients of 4 fit a 6-class folder. ``--allow-repeats``
   still allows repeats within a client. The truth and the attacks that read label counts
   describe the union, repeats included.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import gradleak.runtime as runtime
from conftest import refused
from gradleak.cli import main
from gradleak.config import make_config
from gradleak.data import open_source, sample_batch
from gradleak.engine import Engine
from gradleak.errors import DataError
from gradleak.experiments.cells import CellResult
from gradleak.fl import fedsgd, load_truth
from gradleak.models import build_model
from gradleak.pipeline import attack_update, run

FAST = ["--iterations", "1", "--no-progress", "--attack", "idlg", "--no-paper-metrics"]


# ================================================================== 1. the API's thread policy
@pytest.fixture
def busy_machine(monkeypatch):
    """torch on 2 threads (its default on this machine) while all cores but one are busy with
    other work: the policy then asks for one thread. The caller's 2 threads are restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    monkeypatch.setattr(runtime, "busy_cores", lambda: float((os.cpu_count() or 1) - 1))
    monkeypatch.setattr(runtime, "BUSY_REUSE_SECONDS", 0.0, raising=False)  # measure each time
    yield
    torch.set_num_threads(before)


@pytest.fixture
def threads_seen(monkeypatch):
    """The torch threads each Engine.run ran with, in order."""
    seen: list[int] = []
    original = Engine.run

    def spy(self, *args, **kwargs):  # noqa: ANN001, ANN202
        seen.append(torch.get_num_threads())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "run", spy)
    return seen


def test_run_applies_the_cli_thread_policy(busy_machine, threads_seen, tmp_path):
    """pipeline.run without threads: one thread on the busy machine, recorded in config.json (a
    rerun from it runs the same), the caller's 2 threads back afterwards."""
    out = tmp_path / "api"
    cfg = make_config(attack="idlg", iterations=1, progress=False, paper_metrics=False, out=str(out))
    run(cfg)
    assert threads_seen == [1]
    assert json.loads((out / "config.json").read_text())["run"]["threads"] == 1
    assert torch.get_num_threads() == 2
    assert cfg.threads is None  # the caller's config is not changed


def test_cli_and_api_decide_alike(busy_machine, tmp_path, capsys):
    """`gradleak attack` on the same busy machine: the same thread count, the same record."""
    out = tmp_path / "cli"
    assert main(["attack", *FAST, "--out", str(out)]) == 0
    assert "1 torch thread instead of 2" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["run"]["threads"] == 1


class Stopped(Exception):
    """Raised by ``threads_only`` in place of the attack."""


@pytest.fixture
def threads_only(monkeypatch):
    """The torch threads Engine.run was called with; the attack itself is skipped (two threads on
    a busy machine are what makes it slow)."""
    seen: list[int] = []

    def spy(self, *args, **kwargs):  # noqa: ANN001, ANN202
        seen.append(torch.get_num_threads())
        raise Stopped

    monkeypatch.setattr(Engine, "run", spy)
    return seen


def test_run_with_threads_given_keeps_them(busy_machine, threads_only):
    with pytest.raises(Stopped):
        run(make_config(attack="idlg", iterations=1, progress=False, paper_metrics=False, threads=2), write=False)
    assert threads_only == [2]


@pytest.fixture(scope="module")
def one_photo():
    batch = sample_batch(open_source("cifar10-samples"), batch_size=1, seed=0, image_size=32, channels=3)
    model = build_model("lenet-dlg", num_classes=10)
    return fedsgd(model, batch), model


def test_attack_update_applies_the_policy_and_its_threads_argument(busy_machine, threads_seen, one_photo):
    """The README's API example: the policy without ``threads``, ``threads=N`` when given (it was
    validated and then ignored), the caller's threads restored either way."""
    update, model = one_photo
    attack_update(update, model, "dlg", iterations=1)
    assert torch.get_num_threads() == 2
    attack_update(update, model, "dlg", iterations=1, threads=1)
    assert threads_seen == [1, 1] and torch.get_num_threads() == 2


def test_attack_update_with_threads_given_keeps_them(busy_machine, threads_only, one_photo):
    with pytest.raises(Stopped):
        attack_update(*one_photo, "dlg", iterations=1, threads=2)
    assert threads_only == [2] and torch.get_num_threads() == 2


def test_idle_machine_keeps_torchs_choice(monkeypatch, threads_only, one_photo):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.setattr(runtime, "busy_cores", lambda: 0.0)
        monkeypatch.setattr(runtime, "BUSY_REUSE_SECONDS", 0.0, raising=False)
        with pytest.raises(Stopped):
            attack_update(*one_photo, "dlg", iterations=1)
        with pytest.raises(Stopped):
            run(make_config(attack="idlg", iterations=1, progress=False, paper_metrics=False), write=False)
        assert threads_only == [2, 2]
    finally:
        torch.set_num_threads(before)


def test_a_recent_measurement_is_reused(monkeypatch):
    """The CLI measures, then calls the pipeline, which must not sleep to measure again."""
    calls: list[float] = []
    monkeypatch.setattr(runtime, "busy_cores", lambda: calls.append(1.0) or 1.0)
    monkeypatch.setattr(runtime, "BUSY_REUSE_SECONDS", 0.0)
    assert runtime.recent_busy_cores() == 1.0 and len(calls) == 1
    monkeypatch.setattr(runtime, "BUSY_REUSE_SECONDS", 3600.0)
    assert runtime.recent_busy_cores() == 1.0 and len(calls) == 1


# ================================================================== 2. an aggregate's labels
@pytest.fixture(scope="module")
def six_classes(tmp_path_factory) -> Path:
    """6 classes x 3 tiny PNGs (labels follow the folder names; pixels do not matter)."""
    root = tmp_path_factory.mktemp("six") / "folder"
    rng = np.random.default_rng(0)
    for c in range(6):
        (root / f"class{c}").mkdir(parents=True)
        for j in range(3):
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(root / f"class{c}" / f"{j}.png")
    return root


def _share(folder: Path, out: Path, *extra: str) -> list[list[int]]:
    """`gradleak share` of 2 clients x 4; each client's labels from the truth file."""
    u, t = out / "u.safetensors", out / "t.safetensors"
    assert main(["share", "--data", str(folder), "--batch-size", "4", "--threat", "aggregate", "--clients", "2",
                 "--out", str(u), "--truth", str(t), *extra]) == 0
    labels = load_truth(t).labels.tolist()
    return [labels[:4], labels[4:]]


def test_two_clients_of_four_on_six_classes(six_classes, tmp_path, capsys):
    """Each client's 4 labels distinct, the 8 of the union necessarily repeat; same seed, same draw."""
    first = _share(six_classes, tmp_path)
    assert all(len(set(client)) == 4 for client in first), first
    assert len(set(first[0] + first[1])) < 8
    again = tmp_path / "again"
    again.mkdir()
    assert _share(six_classes, again) == first
    capsys.readouterr()


def test_allow_repeats_still_allows_repeats_within_a_client(six_classes, tmp_path, capsys):
    """With --allow-repeats the batch is the walk's first 8 items, as before; seed 0 puts a repeat
    inside a client."""
    clients = _share(six_classes, tmp_path, "--allow-repeats")
    source = open_source(str(six_classes))
    walk = sample_batch(source, 8, 0, image_size=8, channels=3, allow_repeats=True)
    assert clients[0] + clients[1] == walk.labels.tolist()
    assert any(len(set(client)) < 4 for client in clients), clients
    capsys.readouterr()


def test_each_client_draws_from_what_is_left(six_classes):
    """Client 1 is the one-client draw at the same seed (which is unchanged); no item twice."""
    source = open_source(str(six_classes))
    one = sample_batch(source, 4, 3, image_size=8, channels=3)
    three = sample_batch(source, 12, 3, image_size=8, channels=3, clients=3)
    assert three.names[:4] == one.names and len(set(three.names)) == 12
    assert all(len(set(three.labels[i:i + 4].tolist())) == 4 for i in (0, 4, 8))
    with pytest.raises(DataError, match="cannot be split evenly"):
        sample_batch(source, 8, 0, image_size=8, channels=3, clients=3)


def test_a_client_larger_than_the_classes_is_one_line(six_classes, tmp_path, capsys):
    refused(["share", "--data", six_classes, "--batch-size", "7", "--threat", "aggregate", "--clients", "2",
             "--out", tmp_path / "u.safetensors"], capsys, "7 with distinct labels", "6 distinct classes",
            "--allow-repeats")
    assert list(tmp_path.iterdir()) == []


def test_cpa_and_the_evaluation_see_the_union_with_repeats(six_classes, tmp_path, capsys):
    """CPA restores label counts: on the aggregate of 2 x 4 with repeated classes every label and
    image comes back, and the evaluation pairs them with the truth's union (repeats included)."""
    out = tmp_path / "cpa"
    assert main(["attack", "--data", str(six_classes), "--batch-size", "4", "--threat", "aggregate", "--clients", "2",
                 "--attack", "cpa", "--model", "mlp", "--image-size", "8", "--no-progress", "--threads", "1",
                 "--no-paper-metrics", "--out", str(out)]) == 0
    capsys.readouterr()
    metrics = json.loads((out / "metrics.json").read_text())
    truth = [p["label_true"] for p in metrics["per_image"]]
    assert len(set(truth)) < len(truth) == 8  # the union repeats classes
    assert sorted(metrics["labels_restored"]) == sorted(truth)
    assert metrics["label_accuracy"] == 1.0 and metrics["psnr_mean"] >= 60


def test_an_experiment_cell_reloads_the_same_truth(six_classes, tmp_path, capsys):
    """A stored cell's truth (figures, identifiability) is drawn as the run drew it."""
    clients = _share(six_classes, tmp_path)
    capsys.readouterr()
    cell = CellResult(key=0, cell_id="c", status="ok",
                      config={"data": str(six_classes), "model": "lenet-dlg", "image_size": 8, "batch_size": 4,
                              "threat": "aggregate", "clients": 2, "seed": 0})
    assert cell.truth().labels.tolist() == clients[0] + clients[1]
