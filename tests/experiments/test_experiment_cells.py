"""Experiments run their attacks as cells of the sweep engine (issue 16): the store under
DIR/cells keeps every finished cell, so a rerun on DIR recomputes nothing and rebuilds the same
outputs; changed options make other cells, never a mix; failed cells are reported; run folders
give the figures their images. Tiny cases (one or two cells of a few iterations each)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
import torch

from gradleak.cli import main
from gradleak.errors import ConfigError
from gradleak.experiments import make_options, run_experiment
from gradleak.experiments.cells import CELLS
from gradleak.sweep import ResultStore, cells_spec

# model-size with one width and one sample: one Inverting Gradients cell of a few iterations.
TINY = dict(smoke=True, progress=False, width=4, samples=1, iterations=5)


def _rows(folder: Path) -> list[dict[str, str]]:
    with (folder / "results.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_rerun_resumes_and_rebuilds_identical_outputs(tmp_path):
    out = tmp_path / "size"
    first, folder = run_experiment("model-size", make_options(out=str(out), **TINY))  # local pool, 1 worker
    assert first.cells["total"] == 1 and first.cells["computed"] == 1 and first.cells["reused"] == 0
    assert first.cells["failed"] == []
    assert (out / CELLS / "results.sqlite").is_file()
    csv1 = (out / "results.csv").read_bytes()
    rows = _rows(out)
    assert len(rows) == 1 and rows[0]["attack"] == "ig" and rows[0]["width"] == "4" and rows[0]["iterations"] == "5"
    assert 0 < float(rows[0]["psnr_oracle_pairing"]) < 100
    # the first sample's reconstruction beside its photo, from the cell's run folder
    assert "reconstructions.png" in first.figures and (out / "reconstructions.png").stat().st_size > 1000
    assert len(list((out / CELLS / "runs").iterdir())) == 1

    second, _ = run_experiment("model-size", make_options(out=str(out), executor="inline", **TINY))
    assert second.cells["computed"] == 0 and second.cells["reused"] == 1
    assert (out / "results.csv").read_bytes() == csv1       # the same numbers, wall time included
    assert json.loads((out / "experiment.json").read_text())["cells"]["reused"] == 1
    assert not [p for p in out.iterdir() if p.name.startswith(".outputs-partial-")]

    # Other options make another cell: computed, and the table holds only this run's cells.
    third, _ = run_experiment("model-size", make_options(out=str(out), executor="inline",
                                                         **{**TINY, "iterations": 6}))
    assert third.cells["computed"] == 1 and third.cells["reused"] == 0
    assert [r["iterations"] for r in _rows(out)] == ["6"]
    with ResultStore(out / CELLS, create=False) as store:
        assert len(store) == 2                               # the old cell stays in the store, unused
    # ...and going back reuses the first cell again: identical table.
    run_experiment("model-size", make_options(out=str(out), executor="inline", **TINY))
    assert (out / "results.csv").read_bytes() == csv1


def test_threads_and_workers_do_not_change_a_cell(tmp_path):
    out = tmp_path / "size"
    run_experiment("model-size", make_options(out=str(out), executor="inline", threads=1, **TINY))
    again, _ = run_experiment("model-size", make_options(out=str(out), executor="inline", threads=2, workers=2,
                                                         **TINY))
    assert again.cells["computed"] == 0 and again.cells["reused"] == 1


def test_failed_cells_are_reported_not_dropped(tmp_path, capsys):
    out = tmp_path / "bs"
    opts = dict(out=str(out), smoke=True, progress=False, executor="inline", attacks=["idlg", "no-such-attack"],
                batch_sizes=[1], samples=1, iterations=2)
    result, _ = run_experiment("batch-size", make_options(**opts))
    assert [r["attack"] for r in result.rows] == ["idlg"]
    failed = result.cells["failed"]
    assert len(failed) == 1 and failed[0]["key"] == "no-such-attack 1 0" and "no-such-attack" in failed[0]["error"]
    assert "1 of 2 cells FAILED" in (out / "results.md").read_text()
    assert json.loads((out / "experiment.json").read_text())["cells"]["failed"] == failed
    assert "1 of 2 cells of experiment batch-size failed" in capsys.readouterr().err
    # A rerun does not compute the failed cell again unless asked to.
    again, _ = run_experiment("batch-size", make_options(**opts))
    assert again.cells["computed"] == 0 and len(again.cells["failed"]) == 1
    retried, _ = run_experiment("batch-size", make_options(**opts, retry_failed=True))
    assert retried.cells["computed"] == 1 and len(retried.cells["failed"]) == 1


def test_figure_images_come_from_the_run_folder(tmp_path):
    """comparison's image grid reads the cell's reconstruction.safetensors and reloads the truth;
    a run folder that went missing is computed again (with the same numbers)."""
    from gradleak.experiments.cells import Workspace
    from gradleak.experiments.common import DLG_STOP
    from gradleak.metrics import psnr

    out = tmp_path / "cmp"
    opts = dict(out=str(out), smoke=True, progress=False, executor="inline", attacks=["dlg"], batch_sizes=[2],
                samples=1, iterations=2)
    result, _ = run_experiment("comparison", make_options(**opts))
    assert result.cells["computed"] == 1 and "comparison_images.png" in result.figures
    assert (out / "comparison_images.png").stat().st_size > 1000
    runs = list((out / CELLS / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "reconstruction.safetensors").is_file()

    ws = Workspace("comparison", make_options(**opts), out.absolute(), tmp_path)
    cell = ws.run({"dlg": {"attack": "dlg", "model": "convnet", "width": 16, "data": "cifar10-samples",
                           "batch_size": 2, "seed": 0, "iterations": 1, "stall_restarts": 0, "stop": DLG_STOP,
                           "log_every": 1}},
                run_folders=["dlg"])["dlg"]
    assert cell.ok and ws.report.computed == 0   # the same cell as the experiment's
    truth = cell.truth()
    paired = cell.paired_images(truth)
    per_image = sorted(cell.metrics["per_image"], key=lambda r: r["index"])
    assert [r["name"] for r in per_image] == list(truth.names)
    assert torch.allclose(psnr(paired, truth.images).double(), torch.tensor([r["psnr"] for r in per_image]).double(),
                          atol=1e-4)

    import shutil

    shutil.rmtree(runs[0])
    csv1 = _rows(out)
    again, _ = run_experiment("comparison", make_options(**opts))
    assert again.cells["computed"] == 1 and runs[0].is_dir()
    assert [{k: v for k, v in r.items() if k != "wall_seconds"} for r in _rows(out)] == \
        [{k: v for k, v in r.items() if k != "wall_seconds"} for r in csv1]


def test_an_image_grid_refuses_cells_of_other_batches(tmp_path):
    """One "original" row stands for every cell of a grid: cells that attacked another private
    batch (another seed) are refused, not drawn under the wrong photos."""
    from gradleak.experiments.cells import Workspace
    from gradleak.experiments.common import image_grid, save_grids

    opts = make_options(out=str(tmp_path / "g"), smoke=True, progress=False, executor="inline")
    ws = Workspace("grid", opts, (tmp_path / "g").absolute(), tmp_path)
    base = {"attack": "ig", "model": "convnet", "width": 4, "data": "cifar10-samples", "batch_size": 1,
            "iterations": 2, "log_every": 1}
    cells = ws.run({s: {**base, "seed": s} for s in (0, 1, 2)}, run_folders=[0, 1, 2])
    rows, titles = image_grid([("a", cells[0]), ("b", cells[0])])
    assert titles == ["original", "a", "b"] and len(rows) == 3
    with pytest.raises(ValueError, match="'b' attacked another private batch than 'a'"):
        image_grid([("a", cells[0]), ("b", cells[1])])
    # groups of their own batches stack in one figure
    assert save_grids(tmp_path / "g.png", [(f"seed {s}", [("ig", cells[s])]) for s in (0, 1, 2)])
    assert (tmp_path / "g.png").stat().st_size > 1000


def test_folder_of_another_experiment_or_foreign_files_is_refused(tmp_path, capsys):
    out = tmp_path / "size"
    run_experiment("model-size", make_options(out=str(out), executor="inline", **TINY))
    with pytest.raises(ConfigError, match="holds the cells of experiment 'model-size'"):
        run_experiment("optimizers", make_options(out=str(out), smoke=True, progress=False))
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    code = main(["experiment", "model-size", "--smoke", "--no-progress", "--out", str(other)])
    assert code == 2 and "holds no experiment cells" in capsys.readouterr().err
    assert os.listdir(other) == ["keep.txt"]


def test_new_folder_is_removed_when_the_experiment_fails_before_any_cell(tmp_path):
    out = tmp_path / "new" / "exp"
    with pytest.raises(Exception):
        run_experiment("model-size", make_options(out=str(out), executor="inline", model="no-such-model", **TINY))
    assert not (tmp_path / "new").exists()
    (tmp_path / "empty").mkdir()                # an empty folder given stays, emptied again
    with pytest.raises(Exception):
        run_experiment("model-size", make_options(out=str(tmp_path / "empty"), executor="inline",
                                                  model="no-such-model", **TINY))
    assert os.listdir(tmp_path / "empty") == []


def test_cells_spec_identity_dedup_and_varying_fields():
    base = {"attack": "dlg", "model": "lenet-dlg", "iterations": 3}
    spec, ids = cells_spec([{**base, "seed": 0, "threads": 1}, {**base, "seed": 1}, {**base, "seed": 0, "threads": 4}],
                           exclude={"threads"})
    assert ids[0] == ids[2] != ids[1] and len(spec.cells) == 2
    assert [c.grid for c in spec.cells] == [{"seed": 0}, {"seed": 1}]      # threads is not an identity field
    assert spec.cells[0].config["threads"] == 1 and spec.to_dict()["cells"] == [ids[0], ids[1]]
    plain, plain_ids = cells_spec([{**base, "seed": 0, "threads": 1}])
    assert plain_ids[0] != ids[0]                                           # without exclude it is
    with pytest.raises(ConfigError, match=r"cells\[1\]\.out"):
        cells_spec([base, {**base, "out": "x"}])
    with pytest.raises(ConfigError, match=r"cells\[0\]\.iterations"):
        cells_spec([{**base, "iterations": -1}])


@pytest.mark.timeout(240)
def test_ray_executor_gives_the_local_numbers(tmp_path):
    """--executor ray (gradleak.localray: a local Ray on loopback) computes the same cell."""
    pytest.importorskip("ray")
    import fcntl
    import tempfile

    import ray

    lock = Path(tempfile.gettempdir()) / f"gradleak-tests-ray-{os.getuid()}.lock"  # one Ray at a time (conftest)
    with lock.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            run_experiment("model-size", make_options(out=str(tmp_path / "ray"), executor="ray", threads=1, **TINY))
        finally:
            if ray.is_initialized():
                ray.shutdown()
    run_experiment("model-size", make_options(out=str(tmp_path / "inline"), executor="inline", threads=1, **TINY))
    ray_rows, inline_rows = _rows(tmp_path / "ray"), _rows(tmp_path / "inline")
    for r in ray_rows + inline_rows:
        r.pop("wall_seconds")
    assert ray_rows == inline_rows


def test_cli_has_the_executor_flags(tmp_path, capsys):
    out = tmp_path / "size"
    assert main(["experiment", "model-size", "--smoke", "--no-progress", "--width", "4", "--samples", "1",
                 "--iterations", "5", "--executor", "inline", "--workers", "2", "--threads", "1",
                 "--out", str(out)]) == 0
    assert json.loads((out / "experiment.json").read_text())["cells"]["computed"] == 1
    capsys.readouterr()
    assert main(["experiment", "model-size", "--smoke", "--executor", "slurm", "--out", str(tmp_path / "x")]) == 2
    assert "executor" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_optimizers_draw_each_sample_under_every_optimizer(tmp_path):
    out = tmp_path / "opt"
    result, _ = run_experiment("optimizers", make_options(out=str(out), smoke=True, progress=False, executor="inline",
                                                          iterations=3))
    assert "reconstructions.png" in result.figures and (out / "reconstructions.png").stat().st_size > 1000
    # every optimizer attacked the drawn sample (each is a row of the figure under the original)
    assert {(r["optimizer"], r["sample"]) for r in result.rows} == {("lbfgs", 0), ("adam", 0), ("sgd", 0)}
    from PIL import Image

    with Image.open(out / "reconstructions.png") as im:
        assert im.height > 1.5 * im.width  # the original and 3 answers stacked, one image each
