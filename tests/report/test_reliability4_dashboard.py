"""Reliability, part 4: the runs-folder dashboard (and the report) show only what their folder
holds, at a cost bounded by what they read.

* symbolic links are never followed: a linked run folder, a linked metrics.json, config.json,
  reconstruction.png or report.html inside a real run folder, a link loop; the page says how many
  it left out; an index (results.sqlite, audit.csv) or an audited run's metrics.json that is a link
  is refused, as is a linked file of a run folder given to `gradleak report`;
* the cost is bounded (data.MAX_RUNS_BYTES of JSON text, data.MAX_RUNS_VALUES parsed values):
  past a bound one line and exit 2 before anything is parsed; hard links of one file are parsed
  once (they drove `dashboard runs/` past 3.5 GB: every link parsed and kept anew).

Every refused input ends in exit status 2 with one line ``gradleak: error: ...`` on stderr and
nothing written (run in-process through ``gradleak.cli.main``)."""

from __future__ import annotations

import base64
import csv
import json
import os
import tracemalloc
from pathlib import Path

import pytest
import torch

from conftest import refused, run_cli
from gradleak.report.dashboard import folders as dashboard_data
from gradleak.report.figures import save_image_grid

SECRET = "SECRET-OUTSIDE-THE-FOLDER"


def metrics(psnr: float = 12.0, **extra) -> dict:
    return {"attack": "idlg", "model": "lenet-dlg", "data": "cifar10-samples", "psnr_mean": psnr,
            "converged": False, "convergence": {"converged": False, "relative_gradient_distance": 0.3,
                                                "noise_floor": 0.0}, **extra}


def run_folder(path: Path, psnr: float = 12.0, *, config: dict | None = None, **extra) -> Path:
    """A run folder as `gradleak attack --out` leaves it (what a dashboard reads of it)."""
    path.mkdir(parents=True)
    (path / "metrics.json").write_text(json.dumps(metrics(psnr, **extra)))
    (path / "config.json").write_text(json.dumps({"attack": "idlg", "model": "lenet-dlg", "seed": 0,
                                                  **(config or {})}))
    return path


def picture(path: Path, seed: int = 0) -> Path:
    x = torch.rand(1, 3, 8, 8, generator=torch.Generator().manual_seed(seed))
    return save_image_grid(path, [x, x.flip(-1)], ["original", "reconstruction"])


def page_of(folder: Path, capsys) -> str:
    code, lines = run_cli(["dashboard", folder], capsys)
    assert code == 0, lines
    return (folder / "dashboard.html").read_text()


@pytest.fixture
def outside(tmp_path) -> Path:
    """A run folder outside the scanned folder, every file of it marked with SECRET."""
    out = run_folder(tmp_path / "elsewhere" / "run", 55.0, config={"data_root": SECRET}, note=SECRET)
    (out / "report.html").write_text(f"<html>{SECRET}</html>")
    picture(out / "reconstruction.png", seed=3)
    return out


# ================================================================== 1. symbolic links
def test_a_linked_run_folder_is_not_followed(tmp_path, outside, capsys):
    runs = tmp_path / "runs"
    run_folder(runs / "real")
    os.symlink(outside, runs / "linked")
    page = page_of(runs, capsys)
    assert SECRET not in page and "55.0" not in page
    assert "1 symbolic link(s)" in page and "linked" in page


@pytest.mark.parametrize("name", ["metrics.json", "config.json"])
def test_a_linked_json_file_inside_a_real_run_folder_is_not_followed(tmp_path, outside, capsys, name):
    runs = tmp_path / "runs"
    run_folder(runs / "a-real")
    mixed = run_folder(runs / "b-mixed")
    (mixed / name).unlink()
    os.symlink(outside / name, mixed / name)
    page = page_of(runs, capsys)
    assert SECRET not in page
    assert f"b-mixed/{name}" in page and "1 symbolic link(s)" in page
    assert "1 gradleak attack run folders" in page   # the mixed run is left out whole


def test_a_linked_picture_or_report_of_a_real_run_is_not_shown(tmp_path, outside, capsys):
    """Links out of the folder, and links inside it too: a run's picture that is a link to another
    run's was shown as its own."""
    runs = tmp_path / "runs"
    real = run_folder(runs / "real")
    os.symlink(outside / "reconstruction.png", real / "reconstruction.png")
    os.symlink(outside / "report.html", real / "report.html")
    own = picture(run_folder(runs / "own") / "reconstruction.png", seed=1)   # a plain file still is shown
    borrowed = run_folder(runs / "borrowed")
    os.symlink(own, borrowed / "reconstruction.png")
    page = page_of(runs, capsys)
    assert base64.b64encode((outside / "reconstruction.png").read_bytes()).decode() not in page
    assert "report.html</a>" not in page
    assert page.count(base64.b64encode(own.read_bytes()).decode()) == 1


def test_link_loops_are_skipped_without_hanging(tmp_path, capsys):
    runs = tmp_path / "runs"
    run_folder(runs / "real")
    os.symlink(runs, runs / "parent")                 # a folder linking to its parent
    os.symlink(runs / "self", runs / "self")          # a link to itself (ELOOP)
    looped = run_folder(runs / "looped")
    (looped / "metrics.json").unlink()
    os.symlink(looped / "metrics.json", looped / "metrics.json")
    page = page_of(runs, capsys)
    assert "3 symbolic link(s)" in page and "1 gradleak attack run folders" in page


def test_a_folder_of_nothing_but_links_is_refused_in_one_line(tmp_path, outside, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()
    os.symlink(outside, runs / "linked")
    refused(["dashboard", runs], capsys, "no run folders", "1 symbolic links not followed")
    assert not (runs / "dashboard.html").exists()


def test_a_linked_index_or_audited_run_file_is_refused(tmp_path, outside, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (tmp_path / "results.sqlite").write_bytes(b"")
    os.symlink(tmp_path / "results.sqlite", sweep / "results.sqlite")
    refused(["dashboard", sweep], capsys, "results.sqlite is a symbolic link")

    audit = tmp_path / "audit"
    audit.mkdir()
    index = tmp_path / "elsewhere" / "audit.csv"
    with open(index, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["round", "client", "status", "run"])
        w.writerow([1, "0", "ok", "runs/r1"])
    os.symlink(index, audit / "audit.csv")
    refused(["dashboard", audit], capsys, "audit.csv is a symbolic link")
    os.unlink(audit / "audit.csv")
    (audit / "audit.csv").write_text(index.read_text())
    (audit / "runs" / "r1").mkdir(parents=True)
    os.symlink(outside / "metrics.json", audit / "runs" / "r1" / "metrics.json")
    refused(["dashboard", audit], capsys, "metrics.json is a symbolic link")
    assert not (audit / "dashboard.html").exists() and not (sweep / "dashboard.html").exists()


@pytest.mark.parametrize("name", ["metrics.json", "config.json", "history.csv", "reconstruction.png"])
def test_report_refuses_a_linked_file_of_its_run_folder(tmp_path, outside, capsys, name):
    """The same family in `gradleak report`: a run's file that is a link would bring any file of the
    machine into report.html."""
    run = run_folder(tmp_path / "run")
    (outside / "history.csv").write_text(f"step,loss\n0,{SECRET}\n")
    if (run / name).exists():
        (run / name).unlink()
    os.symlink(outside / name, run / name)
    refused(["report", run], capsys, f"{name} is a symbolic link")
    assert not (run / "report.html").exists()


# ================================================================== 2. bounded cost
def _count_parses(monkeypatch) -> list[int]:
    """The sizes of the texts the dashboard parses as JSON (gradleak.paths.loads_json)."""
    import gradleak.paths

    sizes: list[int] = []
    real = gradleak.paths.loads_json

    def counting(text, what, **kw):
        sizes.append(len(text))
        return real(text, what, **kw)
    monkeypatch.setattr(gradleak.paths, "loads_json", counting)
    return sizes


def _linked_runs(runs: Path, n: int, text: str) -> None:
    """``n`` run folders whose metrics.json are hard links of one file holding ``text``."""
    first = runs / "r0000"
    first.mkdir(parents=True)
    (first / "metrics.json").write_text(text)
    for i in range(1, n):
        (runs / f"r{i:04d}").mkdir()
        os.link(first / "metrics.json", runs / f"r{i:04d}" / "metrics.json")


def test_hard_links_of_one_metrics_file_are_parsed_once(tmp_path, capsys, monkeypatch):
    """The blow-up's cause: every link of one large-ish metrics.json was parsed anew and kept (JSON
    of empty objects costs ~25x its size in memory). Now one inode is parsed once: the memory the
    load takes does not grow with the links."""
    text = json.dumps(metrics(blob=[{}] * 60_000))   # 240 KB, ~6 MB parsed
    _linked_runs(tmp_path / "runs", 40, text)
    sizes = _count_parses(monkeypatch)
    tracemalloc.start()
    try:
        src = dashboard_data.load_source(tmp_path / "runs", dashboard_data.StoreAccess("results.sqlite", (),
                                                                                   lambda p: ([], 0, None)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(src.records) == 40 and sizes == [len(text)]
    assert peak < 4 * 6_000_000, peak    # one parse (~6 MB), not 40 (~240 MB)


def test_too_many_bytes_of_run_files_are_refused_before_any_parse(tmp_path, capsys, monkeypatch):
    """MAX_RUNS_BYTES counts every run (hard links too: the page's work grows with the runs it shows),
    from the sizes the scan sees, before anything is parsed."""
    text = json.dumps(metrics(pad="x" * (1024 * 1024)))
    n = dashboard_data.MAX_RUNS_BYTES // len(text) + 2
    _linked_runs(tmp_path / "runs", n, text)
    sizes = _count_parses(monkeypatch)
    refused(["dashboard", tmp_path / "runs"], capsys, "more than 64 MiB of metrics.json and config.json",
            "fewer runs")
    assert sizes == [] and not (tmp_path / "runs" / "dashboard.html").exists()
    (tmp_path / "runs" / "r0000" / "metrics.json").unlink()   # one of those runs alone: shown
    for i in range(2, n):
        (tmp_path / "runs" / f"r{i:04d}" / "metrics.json").unlink()
    assert page_of(tmp_path / "runs", capsys)


def test_too_many_json_values_are_refused_before_they_are_parsed(tmp_path, capsys, monkeypatch):
    """MAX_RUNS_VALUES bounds what parsing costs in memory, counted from each file's text (commas
    and openings) before it is parsed: 2 bytes a value fit many values in few bytes."""
    runs = tmp_path / "runs"
    per = dashboard_data.MAX_RUNS_VALUES // 3
    for i in range(4):   # distinct files: no link shares a parse
        (runs / f"r{i}").mkdir(parents=True)
        (runs / f"r{i}" / "metrics.json").write_text(json.dumps(metrics(blob=[0] * per), separators=(",", ":")))
    sizes = _count_parses(monkeypatch)
    refused(["dashboard", runs], capsys, f"more than {dashboard_data.MAX_RUNS_VALUES:,} JSON values")
    assert len(sizes) == 2, sizes   # the third file, past the bound, is never parsed
    assert dashboard_data.json_values_bound(json.dumps([0, [1, {"a": 2, "b": []}], "x,y"])) >= 6


def test_the_number_of_run_folders_is_bounded(tmp_path, capsys, monkeypatch):
    runs = tmp_path / "runs"
    for i in range(4):
        run_folder(runs / f"r{i}")
    monkeypatch.setattr(dashboard_data, "MAX_RUN_FOLDERS", 3)
    sizes = _count_parses(monkeypatch)
    refused(["dashboard", runs], capsys, "more than 3 run folders")
    assert sizes == []
