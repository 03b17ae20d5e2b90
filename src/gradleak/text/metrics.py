"""Text leakage metrics: the only place (with the pipeline's text case) that sees the true sentences."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from ..errors import ConfigError


def _content(ids: Sequence[int], special: frozenset[int] | set[int]) -> list[int]:
    return [int(i) for i in ids if int(i) not in special]


def position_matches(truth: Sequence[int], recovered: Sequence[int]) -> int:
    """Positions where both sequences hold the same token (compared up to the shorter one)."""
    return sum(1 for a, b in zip(truth, recovered, strict=False) if a == b)


def token_accuracy(truth: Sequence[Sequence[int]], recovered: Sequence[Sequence[int]]) -> float:
    """Position-wise accuracy over a batch of paired content-token sequences."""
    total = sum(len(t) for t in truth)
    if total == 0:
        return float("nan")
    return sum(position_matches(t, r) for t, r in zip(truth, recovered, strict=False)) / total


def token_set_scores(truth: Sequence[Sequence[int]], recovered: Sequence[Sequence[int]] | set[int]) -> tuple[float, float]:
    """(precision, recall) of the distinct recovered tokens against the batch's distinct tokens."""
    t = {int(i) for s in truth for i in s}
    r = {int(i) for i in recovered} if isinstance(recovered, set) else {int(i) for s in recovered for i in s}
    precision = len(t & r) / len(r) if r else float("nan")
    recall = len(t & r) / len(t) if t else float("nan")
    return precision, recall


# Values of one chunk of the position-wise comparison in pair_sentences ([rows, K, positions]).
PAIR_CHUNK_VALUES = 1 << 24


def _padded(seqs: Sequence[Sequence[int]], fill: int, width: int) -> np.ndarray:
    out = np.full((len(seqs), width), fill, dtype=np.int64)
    for i, s in enumerate(seqs):
        row = [int(v) for v in s[:width]]
        out[i, :len(row)] = row
    return out


def _shared_tokens(truth: Sequence[Sequence[int]], recovered: Sequence[Sequence[int]]) -> np.ndarray:
    """[K, K]: the distinct tokens truth[i] and recovered[j] share (sparse incidence products)."""
    from scipy.sparse import csr_matrix

    vocab: dict[int, int] = {}

    def incidence(seqs: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
        rows, cols = [], []
        for i, s in enumerate(seqs):
            for t in {int(v) for v in s}:
                rows.append(i)
                cols.append(vocab.setdefault(t, len(vocab)))
        return rows, cols

    tr, tc = incidence(truth)
    rr, rc = incidence(recovered)
    shape = (len(truth), max(1, len(vocab)))
    a = csr_matrix((np.ones(len(tr)), (tr, tc)), shape=shape)
    b = csr_matrix((np.ones(len(rr)), (rr, rc)), shape=(len(recovered), shape[1]))
    return np.asarray((a @ b.T).todense())


def pair_sentences(truth: Sequence[Sequence[int]], recovered: Sequence[Sequence[int]]) -> list[int]:
    """perm with recovered[perm[i]] paired to truth[i], maximising position-wise matches
    (ties: the most shared tokens in any order), exact reconstructions always with their sentence.
    Vectorised (numpy, in chunks of rows): K^2 pairs of a large batch cost seconds, not a Python
    loop per pair."""
    k = len(truth)
    if len(recovered) != k:
        raise ConfigError(f"{len(recovered)} reconstructed sentences for {k} true ones")
    if k == 0:
        return []
    width = min(max(len(t) for t in truth), max(len(r) for r in recovered))
    gain = 1e-3 * _shared_tokens(truth, recovered)
    if width > 0:
        t_pad, r_pad = _padded(truth, -1, width), _padded(recovered, -2, width)  # padding never matches
        step = max(1, PAIR_CHUNK_VALUES // (k * width))
        for s in range(0, k, step):
            gain[s:s + step] += (t_pad[s:s + step, None, :] == r_pad[None, :, :]).sum(-1)
    # an exact reconstruction is always paired with its sentence: a bonus above what any other
    # assignment could gain (a pair gains at most width + 1e-3 x shared tokens < width + 1, so
    # k (width + 1) outweighs any reassignment of all k pairs)
    for i, t in enumerate(truth):
        for j, r in enumerate(recovered):
            if list(t) == list(r):
                gain[i, j] += k * (width + 1)
    rows, cols = linear_sum_assignment(-gain)
    perm = [0] * k
    for i, j in zip(rows, cols, strict=True):
        perm[int(i)] = int(j)
    return perm


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    from sacrebleu.metrics import BLEU

    return float(BLEU(effective_order=True).corpus_score(list(hypotheses), [list(references)]).score)


def sentence_bleu(hypothesis: str, reference: str) -> float:
    import sacrebleu

    return float(sacrebleu.sentence_bleu(hypothesis, [reference]).score)


def rouge(hypothesis: str, reference: str) -> dict[str, float]:
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"])
    return {k: float(v.fmeasure) for k, v in scorer.score(reference, hypothesis).items()}


@dataclass
class TextEvaluation:
    token_accuracy: float
    token_set_precision: float
    token_set_recall: float
    bleu: float
    rouge1: float
    rouge2: float
    rougeL: float
    label_accuracy: float
    per_sentence: list[dict[str, Any]] = field(default_factory=list)
    perm: list[int] = field(default_factory=list)
    exact_sentences: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"token_accuracy": self.token_accuracy, "token_set_precision": self.token_set_precision,
                "token_set_recall": self.token_set_recall, "bleu": self.bleu, "rouge1": self.rouge1,
                "rouge2": self.rouge2, "rougeL": self.rougeL, "label_accuracy": self.label_accuracy,
                "exact_sentences": self.exact_sentences, "per_sentence": self.per_sentence}


def evaluate_text(truth_ids: Sequence[Sequence[int]], truth_labels: Sequence[int], recovered_ids: Sequence[Sequence[int]],
                  recovered_labels: Sequence[int], tokenizer: Any, *, sentences: Sequence[str] = (),
                  token_set: set[int] | None = None) -> TextEvaluation:
    """Score reconstructions ([CLS] ... [SEP] ids per sentence) against the truth.

    ``token_set``: score precision/recall on this set of ids instead of the reconstructed
    sentences' tokens (the bag-of-words attack's output). ``tokenizer``: decode(ids) -> str,
    tokens(ids) -> word pieces, special_ids."""
    special = tokenizer.special_ids
    t_content = [_content(s, special) for s in truth_ids]
    r_content = [_content(s, special) for s in recovered_ids]
    perm = pair_sentences(t_content, r_content)
    r_paired = [r_content[j] for j in perm]
    labels_paired = [int(recovered_labels[j]) for j in perm]
    acc = token_accuracy(t_content, r_paired)
    if token_set is not None:
        precision, recall = token_set_scores(t_content, {i for i in token_set if i not in special})
    else:
        precision, recall = token_set_scores(t_content, r_paired)
    refs = [tokenizer.decode(s) for s in t_content]
    hyps = [tokenizer.decode(s) for s in r_paired]
    rows: list[dict[str, Any]] = []
    rouges = []
    for i, (t, r) in enumerate(zip(t_content, r_paired, strict=True)):
        t_set = set(t)
        rg = rouge(hyps[i], refs[i])
        rouges.append(rg)
        rows.append({
            "index": i, "original": sentences[i] if i < len(sentences) else refs[i], "reference": refs[i],
            "recovered": hyps[i], "matched_slot": perm[i],
            "exact": list(t) == list(r),
            "token_accuracy": position_matches(t, r) / len(t) if t else float("nan"),
            "bleu": sentence_bleu(hyps[i], refs[i]), **rg,
            "label_true": int(truth_labels[i]), "label_restored": labels_paired[i],
            "tokens_true": tokenizer.tokens(t), "tokens_recovered": tokenizer.tokens(r),
            "match": [bool(j < len(r) and r[j] == x) for j, x in enumerate(t)],
            "recovered_in_set": [x in t_set for x in r],
        })
    k = len(rows)
    return TextEvaluation(
        token_accuracy=acc, token_set_precision=precision, token_set_recall=recall, bleu=bleu(hyps, refs),
        rouge1=sum(r["rouge1"] for r in rouges) / k, rouge2=sum(r["rouge2"] for r in rouges) / k,
        rougeL=sum(r["rougeL"] for r in rouges) / k,
        label_accuracy=sum(int(a == b) for a, b in zip(truth_labels, labels_paired, strict=False)) / k,
        per_sentence=rows, perm=perm, exact_sentences=sum(int(r["exact"]) for r in rows))


__all__ = ["TextEvaluation", "bleu", "evaluate_text", "pair_sentences", "rouge", "sentence_bleu",
           "token_accuracy", "token_set_scores"]
