"""Issue 62: each image is judged on its own (rebuilt or recognisable, an identification with a
margin over the leak-free priors included -> that image is leaked; otherwise the run's convergence evidence), the run's verdict is the worst over its images,
and the written files name the pixels' pairing for what it is (an oracle's)."""

from __future__ import annotations

import csv
from typing import Any

from gradleak.experiments.base import ExperimentResult, output_name, write_result
from gradleak.experiments.cells import CellResult
from gradleak.experiments.common import (DEFENDED, INCONCLUSIVE, LEAKED, images_leaked, pairing_fields,
                                         verdict_fields, verdict_of)


def _row(index: int, psnr: float, ssim: float, **extra: Any) -> dict[str, Any]:
    return {"index": index, "name": f"img{index}", "psnr": psnr, "ssim": ssim, "label_true": index,
            "label_restored": index, **extra}


def _metrics(rows: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"psnr_mean": sum(r["psnr"] for r in rows) / len(rows), "ssim_mean": sum(r["ssim"] for r in rows) / len(rows),
            "mse_mean": 0.01, "label_accuracy": 1.0, "iterations": 2, "wall_seconds": 0.1, "per_image": rows,
            "converged": True, "convergence": {"converged": True, "relative_gradient_distance": 0.9, "noise_floor": 0.9},
            **extra}


# outcome.py's positive evidence for "defended" (a defense, an answer that fits like the truth, a
# control that leaked)
DEFENDED_EVIDENCE = {"defenses": ["laplace:0.1"], "relative_gradient_distance": 0.9, "truth_relative_distance": 0.9,
                     "control": {"verdict": "leaked"}}


def test_a_batch_mate_of_a_recognisable_image_is_not_leaked_by_association():
    m = _metrics([_row(0, 17.0, 0.71), _row(1, 9.0, 0.12), _row(2, 25.0, 0.3)])
    assert verdict_of(m, None, image=0) == LEAKED        # recognisable (SSIM 0.71 >= 0.5), below 20 dB
    assert verdict_of(m, None, image=1) == INCONCLUSIVE  # no defense: the run's evidence says inconclusive
    assert verdict_of(m, None, image=2) == LEAKED        # rebuilt (25 dB)
    assert verdict_of(m, None) == LEAKED                 # the run: the worst over its images
    assert images_leaked(m) == 2
    # the experiment's own rule (e.g. identifiability's IIP hit) makes that image leaked
    assert verdict_of(m, True, image=1) == LEAKED


def test_identified_image_leaks_and_the_rest_keep_the_defended_evidence():
    # identified among >= 50 candidates with a coarse SSIM 0.1 above the leak-free priors
    # (outcome.recognisable_row): that image leaked, its batch-mate keeps the defended evidence
    shown = {"identified": True, "identified_among": 50, "coarse_ssim": 0.45, "zero_coarse_ssim": 0.1,
             "prior_coarse_ssim": 0.2}
    rows = [_row(0, 8.0, 0.05, **shown), _row(1, 7.0, 0.04, identified=False)]
    m = _metrics(rows, iip_pool_size=50, **DEFENDED_EVIDENCE)
    assert verdict_of(m, None, image=0) == LEAKED
    assert verdict_of(m, None, image=1) == DEFENDED
    assert verdict_of(m, None) == LEAKED
    # a bare identification (no margin over the priors: a flat answer picked out by chance) is no
    # leak, as outcome.judge reads it: inconclusive, never defended
    m = _metrics([_row(0, 8.0, 0.05, identified=True), _row(1, 7.0, 0.04)], iip_pool_size=50, **DEFENDED_EVIDENCE)
    assert verdict_of(m, None, image=0) == INCONCLUSIVE and verdict_of(m, None, image=1) == DEFENDED
    assert verdict_of(m, None) == INCONCLUSIVE
    # nothing identified: every image defended, and so is the run
    m = _metrics([_row(0, 8.0, 0.05), _row(1, 7.0, 0.04)], **DEFENDED_EVIDENCE)
    assert [verdict_of(m, None, image=i) for i in (0, 1)] == [DEFENDED, DEFENDED] and verdict_of(m, None) == DEFENDED
    # an identification among too few candidates (3 photos) is no evidence
    m = _metrics([_row(0, 8.0, 0.05, identified=True)], iip_pool_size=3)
    assert verdict_of(m, None, image=0) == INCONCLUSIVE


def test_verdict_columns_and_pairing_fields_of_a_cell():
    rows = [_row(0, 30.0, 0.9, psnr_by_label=12.0, zero_psnr=10.0, prior_psnr=11.0),
            _row(1, 8.0, 0.1, psnr_by_label=9.0, zero_psnr=9.0, prior_psnr=12.0)]
    cell = CellResult(key=("a",), cell_id="c", config={}, status="ok", metrics=_metrics(rows))
    image = verdict_fields(cell, None, image=1)
    assert (image["verdict"], image["batch_verdict"]) == (INCONCLUSIVE, LEAKED)
    batch = verdict_fields(cell, False)
    assert (batch["verdict"], batch["images_leaked"]) == (LEAKED, 1)
    p = pairing_fields(cell)
    assert (p["psnr_by_label"], p["psnr_by_label_min"], p["zero_psnr"], p["prior_psnr"]) == (10.5, 9.0, 9.5, 11.5)
    # a cell computed before the pairing existed: None, not a number made up
    old = CellResult(key=("b",), cell_id="d", config={}, status="ok", metrics=_metrics([_row(0, 30.0, 0.9)]))
    assert pairing_fields(old)["psnr_by_label"] is None


def test_written_files_name_the_oracle_pairing(tmp_path):
    rows = [{"k": 1, "psnr": 12.5, "psnr_by_label": 10.0, "verdict": LEAKED}]
    summary = [{"k": 1, "psnr_mean": 12.5, "psnr_by_label_mean": 10.0, "psnr_mean_converged": None}]
    result = ExperimentResult(name="x", title="X", columns=["k", "psnr_by_label", "psnr", "verdict"], rows=rows,
                              setup={}, summary=summary, summary_columns=["k", "psnr_by_label_mean", "psnr_mean",
                                                                          "psnr_mean_converged"])
    write_result(result, tmp_path)
    with (tmp_path / "results.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert list(row) == ["k", "psnr_by_label", "psnr_oracle_pairing", "verdict"] and row["psnr_oracle_pairing"] == "12.5"
    with (tmp_path / "summary.csv").open() as f:
        assert next(csv.reader(f)) == ["k", "psnr_by_label_mean", "psnr_oracle_pairing_mean",
                                       "psnr_oracle_pairing_mean_converged"]
    assert "| k | psnr_by_label | psnr_oracle_pairing | verdict |" in (tmp_path / "results.md").read_text()
    assert output_name("psnr_min") == "psnr_oracle_pairing_min" and output_name("prior_psnr") == "prior_psnr"
    assert "Experiment `x`, 1 rows, 0 s.\n" in (tmp_path / "results.md").read_text()
    # a run that replayed its cells from the store says so beside its time (no compute time)
    result.cells = {"total": 4, "reused": 3, "computed": 1}
    write_result(result, tmp_path)
    assert "computed 1 of its 4 cells and replayed 3 from its cell store" in (tmp_path / "results.md").read_text()
