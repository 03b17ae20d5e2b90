"""What a text update gives away without optimisation, and the types every text attack shares:
the bag of words (word-embedding gradient rows), the sentence length (position-embedding rows),
the bias rule for one sentence's label and the reconstruction."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..errors import GradleakError
from ..fl.threats import ThreatModel
from ..fl.update import SharedUpdate
from .models import TextModel

# observer(iteration, token ids per sentence [CLS] ... [SEP]); for watching only.
TextObserver = Callable[[int, list[list[int]]], None]
LABEL_MODES = ("soft", "bias")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class TextResolution:
    """What a text attack's ``resolve`` may read of the case: the attacked model's name and the
    update's batch size (text/configs.py)."""

    model: str
    batch_size: int


@dataclass
class BagOfWords:
    """What the word- and position-embedding gradients give away without any optimisation.

    token_ids:  the tokens of the batch, sorted by id (special tokens included).
    row_norms:  L2 norm of each of those gradient rows.
    length:     the longest sentence's token count L ([CLS] and [SEP] included), or None.
    exact:      True when the rows were selected as exactly non-zero (a clean or pruned update);
                False when noise made every row non-zero and the largest rows were kept.
    """

    token_ids: list[int]
    row_norms: list[float]
    length: int | None
    exact: bool


@dataclass
class TextReconstruction:
    """The attack's output: token ids per sentence ([CLS] ... [SEP]), labels [K], progress."""

    token_ids: list[list[int]]
    labels: torch.Tensor
    bag: BagOfWords
    history: list[dict[str, float]] = field(default_factory=list)
    iterations: int = 0
    wall_seconds: float = 0.0
    label_method: str = ""
    extra: dict = field(default_factory=dict)
    # (attack, answer) of the other attacks the text chooser ran on the same update (text/attacks/auto.py)
    alternatives: list[tuple[str, "TextReconstruction"]] = field(default_factory=list, repr=False)


# --------------------------------------------------------------------------- bag of words
def _nonzero_rows(g: torch.Tensor) -> torch.Tensor:
    return g.reshape(g.shape[0], -1).abs().amax(dim=1) > 0


def _noise_threshold(norms: torch.Tensor, dim: int) -> float:
    """A row-norm threshold above pure-noise rows: the median row (most rows carry no token, so
    the median is noise) times 1 + 5 / sqrt(2 dim) (a chi distribution with ``dim`` degrees of
    freedom rarely exceeds that, even over 30,000 rows)."""
    return float(norms.median()) * (1 + 5 / (2 * dim) ** 0.5)


def leaked_length(update: SharedUpdate, model: TextModel) -> tuple[int | None, bool]:
    """(L, exact): 1 + the last non-zero row of the position-embedding gradient. Padded
    positions get exactly zero gradient, so L is the longest sentence's length. When noise made
    every row non-zero, the last row that stands out above the noise is used."""
    g = update.gradients.get(model.position_embedding)
    if g is None:
        return None, False
    nz = _nonzero_rows(g).nonzero().flatten()
    if len(nz) == 0:
        return None, False
    if len(nz) < g.shape[0]:
        return int(nz.max()) + 1, True
    norms = g.reshape(g.shape[0], -1).double().norm(dim=1)
    big = (norms > _noise_threshold(norms, g.shape[1])).nonzero().flatten()
    return (int(big.max()) + 1 if len(big) else None), False


def bag_of_words(update: SharedUpdate, model: TextModel) -> BagOfWords:
    """The batch's token set from the non-zero rows of the word-embedding gradient.

    A batch of K sentences of at most L tokens holds at most K * L distinct tokens. When more
    rows than that are non-zero (noise), the rows standing out above the noise level are kept,
    at most the K * L largest (approximate: weak rows of real tokens may drown)."""
    if model.word_embedding not in update.gradients:
        raise GradleakError(f"the update holds no gradient for the word embedding {model.word_embedding!r}")
    g = update.gradients[model.word_embedding]
    norms = g.reshape(g.shape[0], -1).double().norm(dim=1)
    nz = _nonzero_rows(g)
    length, length_exact = leaked_length(update, model)
    # under noise the length is only a lower bound: allow the model's longest sentences
    budget = update.meta.batch_size * (length if length_exact and length else model.max_length)
    if int(nz.sum()) <= budget:
        ids, exact = nz.nonzero().flatten(), True
    else:
        above = norms > _noise_threshold(norms, g.shape[1])
        top = torch.topk(norms, min(budget, max(1, int(above.sum())))).indices
        ids, exact = top.sort().values, False
    ids = ids.tolist()
    return BagOfWords(token_ids=ids, row_norms=[float(norms[i]) for i in ids], length=length, exact=exact)


def bias_labels(update: SharedUpdate, model: TextModel) -> torch.Tensor:
    """One sentence: the classifier bias gradient is softmax(z) - onehot(y), negative only at y
    (iDLG's observation, exact for any classifier with a bias). FedAvg shares -lr * sum of
    gradients, so the sign is flipped first."""
    g = update.gradients[model.classifier_bias].double()
    if ThreatModel.from_record(update.meta.threat).client_threat == "fedavg":
        g = -g
    return g.argmin().reshape(1)


def bow_attack(update: SharedUpdate, model: TextModel, observer: TextObserver | None = None) -> TextReconstruction:
    """Bag of words only: the token set, no order. The 'sentence' returned for evaluation lists
    the leaked content tokens in id order (token-set metrics are what it is judged on)."""
    t0 = time.perf_counter()
    bag = bag_of_words(update, model)
    tok = model.tokenizer
    content = [t for t in bag.token_ids if t not in tok.special_ids]
    k = update.meta.batch_size
    labels = bias_labels(update, model) if k == 1 else torch.zeros(k, dtype=torch.long)
    # K sentences: the leaked tokens are dealt round-robin (which sentence holds which is unknown)
    rows = [[tok.cls_id, *content[i::k], tok.sep_id] for i in range(k)]
    if observer is not None:
        observer(1, rows)
    wall = time.perf_counter() - t0
    return TextReconstruction(token_ids=rows, labels=labels, bag=bag,
                              history=[{"iteration": 1, "loss": float("nan"), "phase": "bow"}],
                              iterations=1, wall_seconds=wall, label_method="bias" if k == 1 else "none",
                              extra={"sentence_length": bag.length,
                                     # analytic (no optimisation): the verdict is whether the bag is exact
                                     "analytic": True, "exact": bool(bag.exact)})



__all__ = ["BagOfWords", "DTYPES", "LABEL_MODES", "TextObserver", "TextReconstruction", "TextResolution",
           "bag_of_words", "bias_labels", "bow_attack", "leaked_length"]
