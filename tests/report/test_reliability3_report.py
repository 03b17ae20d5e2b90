"""Reports (issue 43): a closed-form run draws no empty loss chart, and the raw JSON records
(config, structured metrics) are folded away behind <details>, not dumped at the page's end."""

from __future__ import annotations

import re

from gradleak.cli import main


def _body_after(html: str, heading: str) -> str:
    return html.split(f"<h2>{heading}</h2>", 1)[1].split("<h2>", 1)[0]


def test_closed_form_report_has_no_empty_loss_chart(tmp_path, capsys):
    out = tmp_path / "run"
    # auto on one photo of the DLG LeNet: R-GAP's closed form answers (iterations 0)
    assert main(["attack", "--no-progress", "--threads", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    html = (out / "report.html").read_text()
    loss = _body_after(html, "Loss")
    assert "<img" not in loss and "closed form" in loss, loss
    assert "relative gradient distance" in loss
    for heading in ("Config", "Other recorded fields"):
        section = _body_after(html, heading)
        assert section.startswith("<details><summary>"), (heading, section[:200])
        assert "</pre></details>" in section, heading
    # no <pre> outside a <details> element
    assert all("</summary><pre>" in html[max(0, i - 400):i + 5] for i in [m.start() for m in re.finditer("<pre>", html)])


def test_optimised_run_still_draws_its_loss(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["attack", "--attack", "dlg", "--iterations", "6", "--stall-restarts", "0", "--no-progress",
                 "--threads", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    loss = _body_after((out / "report.html").read_text(), "Loss")
    assert "<img" in loss and "No loss curve" not in loss


def test_text_report_folds_its_config(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["attack", "--modality", "text", "--text", "the code is 1234", "--attack", "bow", "--no-progress",
                 "--threads", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    config = _body_after((out / "report.html").read_text(), "Config")
    assert config.startswith("<details><summary>") and "<pre>" in config


def test_sigterm_during_train_leaves_no_staging_folder(tmp_path):
    """SIGTERM ends `gradleak train` the way Ctrl-C does (issue 43: every command that writes
    handles SIGTERM as `attack` does): its staging folder is removed, one line, exit 128 + 15."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "ckpt"
    proc = subprocess.Popen([sys.executable, "-m", "gradleak.cli", "train", "--model", "lenet-dlg", "--epochs", "3",
                             "--threads", "1", "--no-progress", "--out", str(out)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(p.name.startswith(".ckpt.partial-") for p in tmp_path.iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines() == ["gradleak: interrupted (SIGTERM)"], err
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_hostile_metadata_value_is_not_echoed_in_full(tmp_path, capsys):
    """A 10 MB `server` string in an update's metadata gave a 10 MB error line (issue 43)."""
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    u = tmp_path / "u.safetensors"
    assert main(["share", "--out", str(u)]) == 0
    with safe_open(str(u), "pt") as f:
        meta = f.metadata()
    inner = json.loads(meta["meta"])
    inner.setdefault("model_kwargs", {})["server"] = "evil" + "\n" + "x" * 10_000_000
    meta["meta"] = json.dumps(inner)
    bad = tmp_path / "bad.safetensors"
    save_file(load_file(str(u)), str(bad), metadata=meta)
    capsys.readouterr()
    assert main(["attack", "--update", str(bad), "--no-progress", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 2100 and "server" in err, err[:300]
    assert not (tmp_path / "run").exists()


def test_image_grid_is_cut_and_says_so(tmp_path):
    """A row of 4096 images (a batch size an update file states) is drawn as its first
    MAX_GRID_COLUMNS, and the title says so; rows beyond MAX_GRID_ROWS are not drawn."""
    import torch
    from PIL import Image

    from gradleak.report.figures import MAX_GRID_COLUMNS, MAX_GRID_ROWS, _bounded_grid, save_image_grid

    rows = [torch.rand(4096, 3, 8, 8), torch.rand(4096, 3, 8, 8)]
    path = save_image_grid(tmp_path / "g.png", rows, ["original", "rebuilt"], [["c"] * 4096, ["d"] * 4096])
    with Image.open(path) as png:
        assert png.width < (MAX_GRID_COLUMNS + 2) * 110
    cut_rows, titles, caps = _bounded_grid(rows, ["original", "rebuilt"], [["c"] * 4096, ["d"] * 4096])
    assert [r.shape[0] for r in cut_rows] == [MAX_GRID_COLUMNS] * 2 and len(caps[0]) == MAX_GRID_COLUMNS
    assert titles == [f"original (first {MAX_GRID_COLUMNS} of 4096)", f"rebuilt (first {MAX_GRID_COLUMNS} of 4096)"]
    many = [torch.rand(2, 3, 8, 8)] * (MAX_GRID_ROWS + 5)
    cut_rows, titles, _ = _bounded_grid(many, [f"seed {i}" for i in range(len(many))], None)
    assert len(cut_rows) == MAX_GRID_ROWS and titles[-1].endswith("5 more rows not drawn")


def test_dlg_summary_gives_the_budget_per_start_and_the_total(tmp_path, capsys):
    """`--attack dlg --iterations 150` printed "iterations 300" (issue 43): the summary now gives the
    total over the starts and the budget per start."""
    import json

    out = tmp_path / "run"
    assert main(["attack", "--attack", "dlg", "--iterations", "5", "--stall-restarts", "1", "--no-progress",
                 "--threads", "1", "--out", str(out)]) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["iterations_per_start"] == 5 and 5 <= m["iterations"] <= 5 * m["trials"]
    printed = " ".join(capsys.readouterr().out.split())
    starts = f"{m['trials']} start" + ("s" if m["trials"] != 1 else "")
    assert f"{m['iterations']} in all (5 per start, {starts})" in printed, printed


def test_nproc_children_start_with_a_safe_path(monkeypatch):
    """--nproc spawns `python -c` children, whose import path starts with the working folder
    unless PYTHONSAFEPATH is set while they start (issue 43's planted-module family)."""
    import os

    import torch.multiprocessing as mp

    from gradleak.config import make_config
    from gradleak.pipeline import distributed

    seen = {}
    before = os.environ.get("PYTHONSAFEPATH")

    class Stop(Exception):
        pass

    def fake_start(*args, **kwargs):
        seen["safe"] = os.environ.get("PYTHONSAFEPATH")
        raise Stop

    monkeypatch.setattr(mp, "start_processes", fake_start)
    cfg = make_config(attack="gradinversion", model="convnet", batch_size=2, nproc=2, iterations=1, seeds=2)
    import pytest

    with pytest.raises(Stop):
        distributed.spawn(cfg, None, write=False)
    assert seen["safe"] == "1"
    assert os.environ.get("PYTHONSAFEPATH") == before  # given back after the start


def test_share_refuses_to_overwrite_unless_force(tmp_path, capsys):
    """`gradleak share` replaced existing files silently (issue 43): now one line and exit 2, the
    files untouched; --force replaces both."""
    u, t = tmp_path / "u.safetensors", tmp_path / "t.safetensors"
    assert main(["share", "--out", str(u), "--truth", str(t)]) == 0
    before = (u.read_bytes(), t.read_bytes())
    capsys.readouterr()
    assert main(["share", "--seed", "3", "--out", str(u), "--truth", str(t)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists; pass --force" in err
    assert (u.read_bytes(), t.read_bytes()) == before
    assert main(["share", "--seed", "3", "--out", str(u), "--truth", str(t), "--force"]) == 0
    assert u.read_bytes() != before[0] and t.read_bytes() != before[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.safetensors", "u.safetensors"]  # no temporary left
