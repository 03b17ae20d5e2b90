"""A summary's verdict counts count images where a sample is a batch of them: the trend notes
say "inconclusive 12/12 images", never "12/3" (verdicts per image over batches)."""

from gradleak.experiments.common import summarize, trend_notes


def test_trend_notes_count_verdicts_over_what_they_count():
    rows = [{"batch_size": k, "sample": s, "image": i, "identified": float(k > 1), "converged": False,
             "verdict": "inconclusive"} for k in (1, 4) for s in range(3) for i in range(k)]
    summary = summarize(rows, ["batch_size"], ["identified"], images=True)
    assert [(s["samples"], s["images"], s["inconclusive"]) for s in summary] == [(3, 3, 3), (3, 12, 12)]
    note = trend_notes(summary, "batch_size", falls=True, claim="IIP falls", value="identified", unit="")[0]
    assert "inconclusive 3/3 images / 12/12 images" in note and "12/3" not in note
    per_sample = summarize([{**r, "image": 0} for r in rows if r["image"] == 0], ["batch_size"], ["identified"])
    assert "inconclusive 3/3 / 3/3" in trend_notes(per_sample, "batch_size", falls=True, claim="c",
                                                   value="identified", unit="")[0]


def test_old_trend_note_mixed_units_is_gone():
    """The note printed before the fix, 'inconclusive 12/3', divided images by batches; it now
    prints both over images and says so."""
    rows = [{"batch_size": k, "population": "vulnerable", "sample": s, "image": i, "identified": 0.0,
             "converged": False, "verdict": "inconclusive"} for k in (4, 8) for s in range(3) for i in range(k)]
    rows[-1]["identified"], rows[-1]["verdict"] = 1.0, "leaked"
    summary = summarize(rows, ["batch_size", "population"], ["identified"], images=True)
    assert [(s["samples"], s["images"], s["non_converged"], s["inconclusive"]) for s in summary] == [
        (3, 12, 3, 12), (3, 24, 3, 23)]
    note = trend_notes(summary, "batch_size", falls=True, within=("population",), claim="c",
                       value="identified", unit="")[0]
    assert "inconclusive 12/12 images / 23/24 images" in note
    assert "12/3" not in note and "23/3" not in note


def test_summary_note_says_which_unit_each_count_counts(tmp_path):
    """Where a sample is a batch, results.md says that `samples` and `non_converged` count batches
    and the verdicts count images; a per-sample summary does not carry that sentence."""
    from gradleak.experiments.base import ExperimentResult, write_result
    from gradleak.experiments.base import IMAGES_NOTE, MEANS_NOTE
    from gradleak.experiments.common import summary_columns

    rows = [{"batch_size": 2, "sample": 0, "image": i, "identified": 1.0, "converged": False,
             "verdict": "leaked"} for i in range(2)]
    for images in (True, False):
        out = tmp_path / str(images)
        out.mkdir()
        result = ExperimentResult(name="x", title="x", columns=list(rows[0]), rows=rows, setup={},
                                  summary=summarize(rows, ["batch_size"], ["identified"], images=images),
                                  summary_columns=summary_columns(["batch_size"], ["identified"], images=images))
        write_result(result, out)
        md = (out / "results.md").read_text()
        assert MEANS_NOTE in md
        assert (IMAGES_NOTE in md) is images
        assert ("`samples` and `non_converged` count batches" in md) is images
