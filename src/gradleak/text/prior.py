"""LAMP's language-model prior (Balunovic et al., NeurIPS 2022, Sec. 4.2): L_lm(t), the
log-perplexity of a candidate sentence t under an auxiliary language model (the paper uses GPT-2),
which LAMP's discrete step adds to the gradient distance to choose among reorderings."""

from __future__ import annotations

import ast
import functools
import re
import sysconfig
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import ConfigError
from .models import WordPieceTokenizer

DISCOUNT = 0.75        # Kneser-Ney's absolute discount D
UNIFORM_SHARE = 0.01   # the uniform distribution's share in P_cont
MIN_SENTENCES = 1000   # fewer docstring sentences than this: no usable prior (a Python without its sources)
SKIPPED_PARTS = frozenset({"test", "tests", "idlelib", "site-packages", "__pycache__"})
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(" ".join(text.split())) if s.strip()]


def held_out_sentences() -> frozenset[str]:
    """Every sentence of ``pydoc_data.topics`` (the held-out sentences' source), split the same way."""
    import pydoc_data.topics as topics
    return frozenset(_sentences(" ".join(topics.topics[k] for k in sorted(topics.topics))))


def stdlib_docstring_sentences(root: Path | None = None) -> list[str]:
    """The standard library's docstrings (module, class, function), in file order, as sentences,
    without any sentence of the held-out source."""
    root = Path(sysconfig.get_paths()["stdlib"]) if root is None else root
    docs: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if SKIPPED_PARTS & set(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    docs.append(doc)
    held = held_out_sentences()
    return [s for s in _sentences(" ".join(docs)) if s not in held]


class BigramPrior:
    """An interpolated Kneser-Ney bigram model over token ids (see the module's notes in docs/).
    ``nll(ids)``: the mean negative log-probability per transition of ``[CLS] ... [SEP]`` (LAMP's
    L_lm, a log-perplexity in nats)."""

    def __init__(self, sentences: Sequence[Sequence[int]], vocab_size: int):
        if not sentences:
            raise ValueError("a bigram prior needs at least one sentence")
        self.vocab_size = v = int(vocab_size)
        prev = np.concatenate([np.asarray(s[:-1], dtype=np.int64) for s in sentences])
        nxt = np.concatenate([np.asarray(s[1:], dtype=np.int64) for s in sentences])
        self.keys, counts = np.unique(prev * v + nxt, return_counts=True)
        self.counts = counts.astype(np.float64)
        self.context = np.bincount(prev, minlength=v).astype(np.float64)                # c(v)
        self.followers = np.bincount(self.keys // v, minlength=v).astype(np.float64)    # N1+(v .)
        preceders = np.bincount(self.keys % v, minlength=v).astype(np.float64)          # N1+(. w)
        self.p_cont = (1 - UNIFORM_SHARE) * preceders / preceders.sum() + UNIFORM_SHARE / v
        self.tokens = int(len(prev))

    def log_prob(self, prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        """log P(nxt | prev), elementwise."""
        key = prev.astype(np.int64) * self.vocab_size + nxt
        pos = np.minimum(np.searchsorted(self.keys, key), len(self.keys) - 1)
        c = np.where(self.keys[pos] == key, self.counts[pos], 0.0)
        cv = self.context[prev]
        seen = cv > 0
        denom = np.where(seen, cv, 1.0)
        p = np.where(seen, np.maximum(c - DISCOUNT, 0.0) / denom
                     + DISCOUNT * self.followers[prev] / denom * self.p_cont[nxt], self.p_cont[nxt])
        return np.log(p)

    def nll(self, ids: Sequence[int]) -> float:
        a = np.asarray(ids, dtype=np.int64)
        if len(a) < 2:
            return 0.0
        return float(-self.log_prob(a[:-1], a[1:]).mean())


@functools.lru_cache(maxsize=2)
def stdlib_prior(tokenizer: WordPieceTokenizer) -> BigramPrior:
    """The bigram prior over ``tokenizer``'s ids from the standard library's docstrings (built once
    per process and tokenizer)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    sentences = stdlib_docstring_sentences(root)
    if len(sentences) < MIN_SENTENCES:
        raise ConfigError(f"LAMP's language-model prior is counted from the standard library's .py sources, and "
                          f"{root} holds {len(sentences)} docstring sentence(s) (at least {MIN_SENTENCES} needed): "
                          "this Python ships without its sources; use another text attack")
    encoded = tokenizer.encode_batch(sentences)
    return BigramPrior([ids for ids in encoded if len(ids) >= 2], tokenizer.vocab_size)


__all__ = ["BigramPrior", "held_out_sentences", "stdlib_docstring_sentences", "stdlib_prior"]
