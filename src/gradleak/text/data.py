"""Sentences: from ``--text`` (repeatable) or a UTF-8 .txt file (one sentence a line), tokenised
and batched reproducibly by seed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from ..errors import DataError, InputFileError
from ..paths import read_text_file
from .models import TextModel

MAX_FILE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class TextBatch:
    """A client's private batch of K sentences (ground truth).

    input_ids:      [K, L] int64 token ids ``[CLS] ... [SEP]``, right-padded with [PAD] to the
                    longest sentence L.
    attention_mask: [K, L] int64, 1 for tokens, 0 for padding.
    labels:         [K] int64 classes.
    """

    sentences: tuple[str, ...]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    source: str = ""

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def lengths(self) -> list[int]:
        """Tokens per sentence, [CLS] and [SEP] included."""
        return [int(n) for n in self.attention_mask.sum(dim=1)]

    def token_ids(self) -> list[list[int]]:
        """Each sentence's ids without padding ([CLS] and [SEP] included)."""
        return [self.input_ids[k, :n].tolist() for k, n in enumerate(self.lengths)]


def read_sentences(texts: Sequence[str] | None = None, path: str | Path | None = None) -> tuple[list[str], str]:
    """The sentences given (``texts``), or read from ``path`` (one a line, blank lines skipped).

    Returns (sentences, source name). Raises DataError for a missing, unreadable or empty file,
    an empty sentence, or both inputs at once.
    """
    if texts and path is not None:
        raise DataError("give sentences either with --text or with --data FILE.txt, not both")
    if texts:
        out = [str(t) for t in texts]
        for i, s in enumerate(out):
            if not s.strip():
                raise DataError(f"--text number {i + 1} is empty")
        return [s.strip() for s in out], "text"
    if path is None:
        raise DataError("no sentences: give --text \"...\" (repeatable) or --data FILE.txt")
    p = Path(path)
    try:  # a folder, device or pipe is named as such and never read
        raw = read_text_file(p, "text file", max_bytes=MAX_FILE_BYTES)
    except InputFileError as exc:
        raise DataError(f"{exc} (expected a UTF-8 .txt file, one sentence a line)") from None
    if "\x00" in raw:
        raise DataError(f"text file {p} is binary, not text")
    sentences = [line.strip() for line in raw.splitlines() if line.strip()]
    if not sentences:
        raise DataError(f"text file {p} holds no sentences")
    return sentences, p.name


def text_batch(sentences: Sequence[str], model: TextModel, batch_size: int, seed: int, *,
               source: str = "", num_classes: int | None = None) -> TextBatch:
    """K = ``batch_size`` sentences drawn without replacement by ``seed`` (kept in their given
    order, so K = N gives the sentences as given), tokenised with the model's tokenizer; labels
    drawn from the same seed."""
    n = len(sentences)
    if batch_size < 1:
        raise DataError("batch size must be >= 1")
    if batch_size > n:
        raise DataError(f"batch size {batch_size} is larger than the {n} sentence(s) given")
    gen = torch.Generator().manual_seed(seed)
    idx = sorted(torch.randperm(n, generator=gen)[:batch_size].tolist()) if batch_size < n else list(range(n))
    chosen = [sentences[i] for i in idx]
    tok = model.tokenizer
    encoded = [tok.encode(s) for s in chosen]
    for s, ids in zip(chosen, encoded, strict=True):
        content = [i for i in ids if i not in (tok.cls_id, tok.sep_id)]
        if not content:
            raise DataError(f"sentence {s!r} has no tokens")
        if len(ids) > model.max_length:
            short = s if len(s) <= 40 else s[:37] + "..."
            raise DataError(f"sentence {short!r} has {len(ids)} tokens; model {model.name} takes at most "
                            f"{model.max_length} ([CLS] and [SEP] included)")
    length = max(len(ids) for ids in encoded)
    input_ids = torch.full((batch_size, length), tok.pad_id, dtype=torch.long)
    mask = torch.zeros((batch_size, length), dtype=torch.long)
    for k, ids in enumerate(encoded):
        input_ids[k, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[k, :len(ids)] = 1
    classes = num_classes or model.num_classes
    labels = torch.randint(classes, (batch_size,), generator=gen)
    return TextBatch(sentences=tuple(chosen), input_ids=input_ids, attention_mask=mask, labels=labels,
                     source=source)


def python_docs_sentences(min_chars: int = 16, max_chars: int = 90) -> tuple[str, ...]:
    """Declarative English sentences from CPython's own documentation (``pydoc_data.topics``, in
    every Python installation: offline, and never used to tune gradleak's text attacks): letters,
    spaces, commas, apostrophes and hyphens, a capital first and a full stop last, ``min_chars`` to
    ``max_chars`` characters, each once, in the order they first occur. The set follows the Python
    version's documentation (the same on every machine with the same Python)."""
    import re

    import pydoc_data.topics as topics
    text = " ".join(topics.topics[k] for k in sorted(topics.topics))
    out = dict.fromkeys(s.strip() for s in re.split(r"(?<=[.!?])\s+", text)
                        if min_chars <= len(s.strip()) <= max_chars
                        and re.fullmatch(r"[A-Z][A-Za-z ,'\-]+\.", s.strip()))
    return tuple(out)


__all__ = ["TextBatch", "python_docs_sentences", "read_sentences", "text_batch"]
