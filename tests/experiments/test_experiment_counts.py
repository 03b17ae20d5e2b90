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
