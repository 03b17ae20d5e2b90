"""`gradleak dashboard` on a guard folder (guard.csv and its run folders): decisions per round,
the verdicts before and after, the pictures of both checks; a damaged guard.csv is one DataError."""

import csv

import pytest
import torch

from gradleak.errors import ConfigError, DataError
from gradleak.report.dashboard import render_dashboard
from gradleak.report.dashboard.guard_page import DECISIONS, read_guard


def stores():
    from gradleak.sweep.dashboard_cli import sweep_stores

    return sweep_stores()


COLUMNS = ("round", "client", "decision", "verdict_before", "verdict_after", "attack", "noise_multiplier",
           "noise_sigma", "clip", "seconds", "train_seconds", "run_before", "run_after", "reason")


def guard_folder(tmp_path, rows):
    from gradleak.report import save_image_grid

    for row in rows:
        for col in ("run_before", "run_after"):
            if row.get(col) and ".." not in row[col]:   # a hostile name is only written into guard.csv
                folder = tmp_path / row[col]
                folder.mkdir(parents=True)
                save_image_grid(folder / "reconstruction.png", [torch.rand(1, 1, 28, 28)], ["x"])
                (folder / "report.html").write_text("<html></html>")
    with open(tmp_path / "guard.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        for row in rows:
            w.writerow({k: row.get(k, "") for k in COLUMNS})
    return tmp_path


ROWS = [{"round": 1, "client": "0", "decision": "remedied", "verdict_before": "leaked", "verdict_after": "defended",
         "attack": "rgap", "noise_multiplier": 3.0, "noise_sigma": 0.0056, "seconds": 45.0, "train_seconds": 0.02,
         "run_before": "guard-runs/round-001-client-0-before", "run_after": "guard-runs/round-001-client-0-noise-3",
         "reason": "noise z = 3: <b>defended</b>"},
        {"round": 1, "client": "1", "decision": "refused model", "verdict_before": "", "verdict_after": "",
         "seconds": 0.2, "train_seconds": 0.0, "reason": "fl.inspect flags the received model"},
        {"round": 2, "client": "0", "decision": "withheld", "verdict_before": "leaked", "verdict_after": "leaked",
         "seconds": 80.0, "train_seconds": 0.02, "run_before": "guard-runs/round-002-client-0-before"}]


def test_the_page_shows_each_decision_the_verdicts_and_both_pictures(tmp_path):
    folder = guard_folder(tmp_path, ROWS)
    page = render_dashboard(folder, stores=stores()).read_text()
    assert "Guard: " in page and "Decision per client and round" in page and "Before and after" in page
    for d in ("remedied", "refused model", "withheld"):
        assert d in page
    assert page.count('src="data:image/png;base64,') == 3          # before + after, before
    assert "&lt;b&gt;defended&lt;/b&gt;" in page                    # the folder's text is escaped
    assert "guard-runs/round-001-client-0-noise-3/report.html" in page
    assert "mean 41.7 s" in page and "training's mean" in page


def test_the_decisions_are_the_guards():
    from gradleak.guard import DECISIONS as GUARD

    assert set(DECISIONS) == set(GUARD)


@pytest.mark.parametrize("edit, message", [
    (lambda r: r.update(decision="dropped"), "decision 'dropped' is not one of"),
    (lambda r: r.update(round="x"), "round 'x' is not a round number"),
    (lambda r: r.update(seconds="fast"), "seconds 'fast' is not a finite number"),
    (lambda r: r.update(run_before="../../etc"), "is not a run folder of the guard"),
])
def test_a_damaged_guard_csv_is_one_data_error(tmp_path, edit, message):
    row = dict(ROWS[1])
    edit(row)
    folder = guard_folder(tmp_path, [row])
    with pytest.raises(DataError, match=message) as info:
        read_guard(folder / "guard.csv")
    assert "\n" not in str(info.value) and "line 2" in str(info.value)


def test_the_page_never_replaces_guard_csv(tmp_path):
    folder = guard_folder(tmp_path, ROWS[1:2])
    with pytest.raises(ConfigError):
        render_dashboard(folder, out=folder / "guard.csv", stores=stores())
