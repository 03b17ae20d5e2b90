"""Figures and the self-contained HTML report."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
import torch
from PIL import Image

from gradleak.errors import DataError
from gradleak.report import render_report, save_image_grid, save_line_plot, save_loss_plot

EVIL_NAME = "<script>alert(1)</script>.png"
AMP_CLASS = "cats & dogs"


def write_run(run: Path, with_truth: bool = True) -> Path:
    """A fake run folder following the metrics.json / config.json / history.csv contract."""
    run.mkdir(parents=True, exist_ok=True)
    metrics = {
        "attack": "idlg", "model": "lenet", "data": "cifar10", "batch_size": 2,
        "iterations": 300, "wall_seconds": 12.5,
        "psnr_mean": 31.25 if with_truth else None,
        "ssim_mean": 0.91 if with_truth else None,
        "mse_mean": 0.00075 if with_truth else None,
        "label_accuracy": 0.5 if with_truth else None,
        "per_image": [
            {"index": 0, "name": EVIL_NAME, "psnr": 30.0, "ssim": 0.9, "mse": 0.001,
             "label_true": 1, "label_restored": 1, "matched_slot": 1},
            {"index": 1, "name": "b&w.png", "psnr": 32.5, "ssim": 0.92, "mse": 0.0005,
             "label_true": 0, "label_restored": 2, "matched_slot": 0},
        ] if with_truth else [],
        "class_names": ["plane", AMP_CLASS, "<b>bird</b>"],
        "threat": {"client": "honest", "local_steps": 1, "note": "x < y & z"},
        "defenses": ["noise(sigma=0.01) & clip"],
        "update": {"kind": "gradient", "parameters": 10},
        "versions": {"gradleak": "0.1.0", "torch": "2.14.1"},
        "fft2d_mean": 0.123, "lpips_mean": None, "iip": 0.5,
    }
    (run / "metrics.json").write_text(json.dumps(metrics), encoding="utf-8")
    (run / "config.json").write_text(
        json.dumps({"attack": {"name": "idlg", "lr": 0.1}, "out": "<script>evil()</script>"}),
        encoding="utf-8",
    )
    (run / "history.csv").write_text(
        "iteration,loss,psnr\n0,1.5,\n10,0.2,12.5\n20,0.01,\n30,0.0005,25.0\n", encoding="utf-8"
    )
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    save_image_grid(run / "reconstruction.png", [images, images.flip(0)], ["originals", "reconstructions"],
                    [["PSNR 30.0 dB / label 1", "x"], ["a", "b"]])
    return run


def assert_self_contained(page: str) -> None:
    lower = page.lower()
    assert "<script" not in lower  # nothing from the input survives unescaped, and we add none
    assert "http://" not in lower and "https://" not in lower
    assert not re.search(r"<(link|iframe|object|embed)\b", lower)
    assert not re.search(r"""src\s*=\s*["'](?!data:)""", lower)  # every src is a data URI


def test_render_report_is_escaped_and_self_contained(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run1")
    out = render_report(run)
    assert out == run / "report.html" and out.is_file()
    assert not (run / "report.html.tmp").exists()
    page = out.read_text(encoding="utf-8")
    assert_self_contained(page)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;.png" in page
    assert "cats &amp; dogs" in page and "&lt;b&gt;bird&lt;/b&gt;" in page
    assert "b&amp;w.png" in page and "x &lt; y &amp; z" in page
    assert "idlg on lenet, cifar10" in page
    assert page.count("data:image/png;base64,") >= 2  # reconstruction + loss plot
    for label in ("FFT2D cosine distance (mean)", "LPIPS (mean)", "IIP"):  # the paper's metrics in the summary
        assert label in page
    assert "31.25 dB" in page and "50.0 %" in page
    assert "no ground truth given" not in page.lower()
    # the embedded images decode to real PNGs
    for b64 in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page):
        assert base64.b64decode(b64).startswith(b"\x89PNG")


def test_render_report_without_ground_truth(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run2", with_truth=False)
    (run / "config.json").unlink()
    page = render_report(run).read_text(encoding="utf-8")
    assert_self_contained(page)
    assert "no ground truth given" in page.lower()
    assert "data:image/png;base64," in page


def test_render_report_minimal_folder(tmp_path: Path) -> None:
    run = tmp_path / "run3"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps({"attack": "dlg", "per_image": []}), encoding="utf-8")
    page = render_report(run).read_text(encoding="utf-8")
    assert_self_contained(page)
    assert "no ground truth given" in page.lower()
    with pytest.raises(DataError):
        render_report(tmp_path / "missing")


@pytest.mark.parametrize("channels,size", [(1, 28), (3, 32), (3, 8)])
def test_save_image_grid_writes_png(tmp_path: Path, channels: int, size: int) -> None:
    rows = [torch.rand(4, channels, size, size), torch.rand(4, channels, size, size)]
    path = save_image_grid(tmp_path / "grid.png", rows, ["originals", "$x$ reconstructions"],
                           [["PSNR 41.2 dB / label 3"] * 4, ["a", "b", "c", "d"]])
    assert path == tmp_path / "grid.png"
    assert not (tmp_path / "grid.tmp.png").exists()
    with Image.open(path) as im:
        assert im.mode in ("RGB", "RGBA")
        scale = max(1, round(96 / size))
        width, height = im.size
        assert width >= 4 * size * scale and height >= 2 * size * scale
        # a cell is copied pixel-exact (nearest-neighbour upscaling, no resampling blur)
        px = im.convert("RGB").load()
        row0 = rows[0][0].expand(3, -1, -1) if channels == 1 else rows[0][0]
        expected = tuple(int(v * 255 + 0.5) for v in row0[:, 0, 0].tolist())
        assert px[8, 8 + 20] == expected and px[8 + scale - 1, 8 + 20 + scale - 1] == expected


def test_save_image_grid_rejects_bad_rows(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        save_image_grid(tmp_path / "g.png", [torch.rand(2, 2, 8, 8)], ["two channels"])
    with pytest.raises(ValueError):
        save_image_grid(tmp_path / "g.png", [torch.rand(2, 3, 8, 8)], ["a", "b"])


def test_loss_and_line_plots(tmp_path: Path) -> None:
    history = [{"iteration": i, "loss": 10.0 ** -i, **({"psnr": 5.0 * i} if i % 2 else {})} for i in range(6)]
    for path in (save_loss_plot(tmp_path / "loss.png", history), save_loss_plot(tmp_path / "empty.png", []),
                 save_line_plot(tmp_path / "line.png", [1, 2, 4], {"dlg": [10.0, 20.0, 30.0], "idlg": [1.0, None, 3.0]},
                                "batch size", "PSNR (dB)", "PSNR vs batch size", logy=True)):
        with Image.open(path) as im:
            assert im.size[0] > 0 and im.size[1] > 0 and im.mode in ("RGB", "RGBA")
