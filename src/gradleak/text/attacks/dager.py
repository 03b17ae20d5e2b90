"""DAGER (Petrov et al., NeurIPS 2024), for the encoders gradleak attacks: exact sentences read
off the low rank of the attention layers' gradients, each one verified, no optimisation."""

from __future__ import annotations

# The attack's declaration (gradleak/specs.py reads it without importing this module).
SPEC = {
    "name": "dager",
    "modality": "text",
    "summary": "DAGER (Petrov et al. 2024): tokens and sentences verified against the attention gradients' span",
    "kind": "closed-form",
    # no optimisation: judged on whether every sentence was verified in the span (analytic)
    "converged_below": None,
    "needs": "the exact gradient (FedSGD, or one local step) of a transformer whose batch has fewer tokens "
             "than its width",
    "flags": {"beam_width": ["int[1,100000]", 128, "DAGER: prefixes the sentence search keeps per position "
                                                   "(the splice keeps at most 16)"]},
}

import time
from typing import Any

import torch

from ...engine import Engine
from ...errors import GradleakError
from ...fl.threats import ThreatModel
from ...fl.update import SharedUpdate
from ..configs import text_config_class
from ..leak import BagOfWords, TextReconstruction, bag_of_words, bias_labels
from ..search import progress_bar
from ..models import TextModel

# the typed config of this attack, derived from its SPEC (text/configs.py)
TextDAGERConfig = text_config_class(SPEC["name"])

__all__ = ["SPEC", "TAU", "dager", "run", "span_basis"]

TAU = 1e-4          # relative residual below which an input lies in the span (both tests)
CHUNK = 1024        # candidate sentences per forward pass
PASSES = 10         # beam passes at most, or K + 1 for a larger batch (a pass runs only while the last one, or the
                    # splice after it, verified new sentences: K + 1 is the most that can find something)
LOOKAHEAD = 3       # positions 1..LOOKAHEAD: a prefix's new token is scored with the best next token after it
LOOKAHEAD_ROWS = 4  # x beam width: the rows (lowest plain residual first) that get the lookahead score
SPLICE_JOBS = 6     # step 2b: prefix re-searches per sentence still missing after the beam passes
SPLICE_WIDTH = 16   # step 2b: prefixes a re-search keeps per position
PEEL = 1e-4         # step 2c: relative residual below which a verified sentence explains a gradient row
FIT = 1e-5          # step 2c: error of a subtracted contribution, relative to it (measured ~2e-6: the
                    # attacker's float32 recomputation against the client's); a row left below it
                    # is explained (its token leaves the candidates), and pins after a peel allow it
PIN = 1e-7          # step 1b: |cos(word-embedding gradient row, its LayerNorm input at p)| below which
                    # (plus 2 eps / variance, the LayerNorm's eps term) a token's every occurrence is at
                    # p (measured on MiniLM, K = 1-16, 15 batches: <= 3.5e-8 where it is, >= 5.9e-7 for
                    # tokens at two or more positions; the tiny transformer, eps 1e-5: <= 2.2e-6, >= 2.5e-4)


def attention_gradient(update: SharedUpdate, model: TextModel, layer: int) -> torch.Tensor:
    """Block ``layer``'s [dW_Q; dW_K; dW_V] as one float64 matrix [3 dim, dim] (its rows span the
    block's inputs)."""
    return torch.cat([update.gradients[n].reshape(-1, update.gradients[n].shape[-1])
                      for n in model.attention_weights(layer)]).to("cpu", torch.float64)


def span_basis(update: SharedUpdate, model: TextModel, layer: int) -> tuple[torch.Tensor, int]:
    """An orthonormal basis [dim, r] of the row space of block ``layer``'s [dW_Q; dW_K; dW_V]
    (float64), r at the largest gap of the singular values (Sec. 3: the rank is the number of
    distinct inputs while it is below the width)."""
    return row_basis(attention_gradient(update, model, layer))


def row_basis(m: torch.Tensor) -> tuple[torch.Tensor, int]:
    """An orthonormal basis [cols, r] of ``m``'s row space, r at the largest gap of its singular values."""
    _, s, vh = torch.linalg.svd(m, full_matrices=False)
    gaps = s[:-1] / s[1:].clamp_min(1e-300)
    r = int(gaps.argmax()) + 1 if len(s) > 1 else 1
    return vh[:r].T.contiguous(), r


def _residual(z: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    z = z.double()
    return (z - (z @ basis) @ basis.T).norm(dim=-1) / z.norm(dim=-1).clamp_min(1e-300)


class _Spans:
    """The two span tests on the attacker's copy of the model (the global weights)."""

    def __init__(self, model: TextModel, update: SharedUpdate):
        self.model = model
        self.params = {n: update.global_weights[n].to("cpu", torch.float32)
                       for n, _ in model.module.named_parameters()}
        self.basis0, self.rank0 = span_basis(update, model, 0)
        self.basis1, self.rank1 = span_basis(update, model, 1)
        # what the filter and the search test against: the full spans, or after step 2d the spans of
        # the inputs of the sentences not yet peeled (``deflate``)
        self.search0, self.search1 = self.basis0, self.basis1
        self.search_ranks = (self.rank0, self.rank1)
        self.evaluated = 0

    def deflate(self, block0: torch.Tensor, block1: torch.Tensor, expected: int) -> bool:
        """Step 2d: search against the row spans of what is left of blocks 0 and 1's gradients once
        the verified sentences' own contributions are subtracted, when block 1's rank there is the
        ``expected`` one (its full rank less the peeled sentences' tokens: the subtraction was
        right); otherwise the spans stay as they were. Returns whether they changed."""
        if expected < 1:
            return False
        basis1, rank1 = row_basis(block1)
        if rank1 != expected:
            return False
        basis0, rank0 = row_basis(block0)
        self.search0, self.search1, self.search_ranks = basis0, basis1, (rank0, rank1)
        return True

    @torch.no_grad()
    def in_full_span(self, sentences: list[tuple[int, ...]]) -> list[bool]:
        """Whether each sentence's block-1 inputs lie in block 1's full span (the verification of
        step 3 before any deflation: a sentence verified in a deflated span must pass it too)."""
        if not sentences:
            return []
        search, self.search1 = self.search1, self.basis1
        try:
            return [w < TAU for w in self.sentences([list(x) for x in sentences]).amax(-1).tolist()]
        finally:
            self.search1 = search

    @torch.no_grad()
    def token_filter(self, tokens: list[int], length: int) -> torch.Tensor:
        """Residuals [len(tokens), length] of every token at every position, block 0."""
        ids = torch.tensor(tokens)[:, None].expand(len(tokens), length)
        pos = torch.arange(length)
        # position p of sentence row i holds tokens[i]: block 0's input is per position (no mixing)
        z = self.model.block_inputs(self.params, ids.contiguous(), torch.ones_like(ids), 0)
        return _residual(z, self.search0)[:, pos]

    @torch.no_grad()
    def position_pins(self, tokens: list[int], rows: torch.Tensor, error: torch.Tensor, length: int) -> dict[int, int]:
        """Step 1b (docs notes): token -> the one position p < ``length`` that holds all its
        occurrences still unexplained, for the tokens whose word-embedding gradient row (``rows``
        [len(tokens), dim], float64: the update's, or what verified sentences left of it, step 2c)
        is orthogonal to their normalised embedding sum at p; tokens at several positions are not
        pinned. The LayerNorm's backward makes the gradient at its input orthogonal to the centred,
        normalised input x_hat (sum_i x_hat_i dL/dx_i = 0, up to its eps), and a word embedding's
        row is the sum of those gradients over the token's occurrences. ``error`` [len(tokens)]
        bounds each row's error in norm (the client's float32 rounding, ``PIN`` times the update's
        row, plus what peeling added): the tolerance on |cos| is it over the row's norm, plus the
        eps term. A pin needs one position below it, the next one 10x above it, and p >= 1
        (position 0 is [CLS]'s)."""
        ids = torch.tensor(tokens)[:, None].expand(len(tokens), length).contiguous()
        z = self.model.block_inputs(self.params, ids, torch.ones_like(ids), 0).double()
        norm = self.model.embedding_norm
        x_hat = (z - self.params[norm + "bias"].double()) / self.params[norm + "weight"].double()
        size = rows.norm(dim=-1, keepdim=True).clamp_min(1e-300)
        cos = (x_hat * rows[:, None]).sum(-1).abs() / (x_hat.norm(dim=-1) * size)
        # with the LayerNorm's eps the identity holds up to eps / (variance + eps) of the sum: bounded
        # with the word + position sum's variance (the token-type row, where there is one, aside)
        eps = float(dict(self.model.module.named_modules())[norm.rstrip(".")].eps)
        e = self.params[self.model.word_embedding][tokens][:, None] + self.params[self.model.position_embedding][:length]
        tol = error[:, None] / size + 2 * eps / e.double().var(-1, unbiased=False).clamp_min(1e-300)
        cos[:, 0] = float("inf")
        low, where = cos.topk(2, dim=-1, largest=False) if length > 2 else (cos, cos.argmin(-1, keepdim=True))
        pins = {}
        for i, v in enumerate(tokens):
            pos = int(where[i, 0])
            if float(low[i, 0]) < float(tol[i, pos]) and (length <= 2 or float(low[i, 1]) > 10 * float(tol[i, pos])):
                pins[v] = pos
        return pins

    @torch.no_grad()
    def sentences(self, rows: list[list[int]], masks: list[list[int]] | None = None) -> torch.Tensor:
        """Residuals [len(rows), max length] of block 1's inputs, 0 past a row's end and where
        ``masks`` (optional, 0/1 per position of each row) hides a position from attention (its
        position index is kept: the tokens after it stay at their absolute positions)."""
        out = []
        for a in range(0, len(rows), CHUNK):
            part = rows[a:a + CHUNK]
            ell = max(len(r) for r in part)
            ids = torch.full((len(part), ell), self.model.tokenizer.pad_id, dtype=torch.long)
            mask = torch.zeros(len(part), ell, dtype=torch.long)
            for i, r in enumerate(part):
                ids[i, :len(r)] = torch.tensor(r)
                mask[i, :len(r)] = 1 if masks is None else torch.tensor(masks[a + i])
            res = _residual(self.model.block_inputs(self.params, ids, mask, 1), self.search1) * mask
            out.append(torch.nn.functional.pad(res, (0, max(len(r) for r in rows) - ell)))
        self.evaluated += len(rows)
        return torch.cat(out)


class _Ledger:
    """Step 2c (docs notes): the word-embedding gradient rows of ``tokens`` that the verified
    sentences do not explain. A verified sentence's own contribution is its gradient at the global
    weights w.r.t. its input embeddings, summed per token, for the label under which one factor
    makes it explain at least one of its tokens' rows (relative residual below ``PEEL``: a token
    only this sentence holds), times that factor (the update's scale, e.g. 1 / K for FedSGD's mean);
    it is subtracted from its tokens' rows. A row brought
    to ~0 is a token no missing sentence holds; a row left at one position pins its token there."""

    def __init__(self, spans: _Spans, update: SharedUpdate, tokens: list[int]):
        self.spans, self.tokens = spans, tokens
        self.index = {v: i for i, v in enumerate(tokens)}
        self.rows = update.gradients[spans.model.word_embedding][tokens].to("cpu", torch.float64).clone()
        self.error = PIN * self.rows.norm(dim=-1)   # the client's float32 rounding, then + FIT x each peel
        # step 2d: blocks 0 and 1's attention gradients, less the peeled sentences' own
        self.blocks = [attention_gradient(update, spans.model, layer) for layer in (0, 1)]
        self.buffers = {n: b.detach().to("cpu") for n, b in spans.model.module.named_buffers()}
        self.peeled = 0
        self.peeled_tokens = 0   # block-1 inputs the peeled sentences held (one per token)
        self.deflated = 0        # peels after which the search's spans were deflated (step 2d)
        self.pins: dict[int, int] = {}
        self.waiting: list[tuple[int, ...]] = []   # verified, not peeled yet (every token shared so far)

    def _contribution(self, sentence: tuple[int, ...], label: int) -> tuple[dict[int, torch.Tensor], list[torch.Tensor]]:
        """d loss(sentence, label) at the global weights, float64: token -> w.r.t. its word-embedding
        row, and w.r.t. blocks 0 and 1's [W_Q; W_K; W_V] (as ``attention_gradient`` lays them out)."""
        model = self.spans.model
        names = [n for layer in (0, 1) for n in model.attention_weights(layer)]
        params = dict(self.spans.params)
        for n in names:   # detached copies: the attacker's weights themselves are left untouched
            params[n] = params[n].detach().requires_grad_(True)
        ids = torch.tensor([sentence])
        with torch.enable_grad():
            embeds = torch.nn.functional.embedding(ids, params[model.word_embedding]).requires_grad_(True)
            logits = model.logits(params, self.buffers, embeds, torch.ones_like(ids))
            g, *w = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, torch.tensor([label])),
                                        [embeds, *(params[n] for n in names)])
        out: dict[int, torch.Tensor] = {}
        for p, v in enumerate(sentence):
            out[v] = out.get(v, 0) + g[0, p].double()
        per_block = len(model.attention_weights(0))
        blocks = [torch.cat([x.reshape(-1, x.shape[-1]) for x in w[i:i + per_block]]).double()
                  for i in (0, per_block)]
        return out, blocks

    def peel(self, sentence: tuple[int, ...]) -> bool:
        """Subtract a verified sentence's contribution; False (nothing changed) when no label and
        factor explain one of its rows exactly (each of its tokens is also another sentence's, so
        far): it waits, and is tried again after every peel that succeeds."""
        if not self._subtract(sentence):
            self.waiting.append(sentence)
            return False
        progress = True
        while progress and self.waiting:   # a peel may leave a waiting sentence's token to it alone
            progress = False
            for s in list(self.waiting):
                if self._subtract(s):
                    self.waiting.remove(s)
                    progress = True
        return True

    def _subtract(self, sentence: tuple[int, ...]) -> bool:
        best: tuple[dict[int, torch.Tensor], list[torch.Tensor], list[float]] | None = None
        for label in range(self.spans.model.num_classes):
            c, blocks = self._contribution(sentence, label)
            fits = []
            for v, cv in c.items():
                i = self.index.get(v)
                if i is None or float(self.rows[i].norm()) <= float(self.error[i]):
                    continue
                a = float(self.rows[i] @ cv) / max(float(cv @ cv), 1e-300)
                if float((self.rows[i] - a * cv).norm()) < PEEL * float(self.rows[i].norm()):
                    fits.append(a)
            if fits and (best is None or len(fits) > len(best[2])):
                best = (c, blocks, fits)
        if best is None:
            return False
        c, blocks, fits = best
        a = sorted(fits)[len(fits) // 2]
        for v, cv in c.items():
            if v in self.index:
                self.rows[self.index[v]] -= a * cv
                self.error[self.index[v]] += FIT * abs(a) * float(cv.norm())
        for mine, theirs in zip(self.blocks, blocks, strict=True):
            mine -= a * theirs
        self.peeled += 1
        self.peeled_tokens += len(sentence)
        return True

    def deflate(self) -> bool:
        """Step 2d: the search's spans become those of the sentences not peeled yet, when block 1's
        rank there is its full rank less the peeled sentences' tokens (``_Spans.deflate``)."""
        done = self.spans.deflate(self.blocks[0], self.blocks[1], self.spans.rank1 - self.peeled_tokens)
        self.deflated += done
        return done

    def candidates(self, passes: torch.Tensor, length: int) -> list[list[int]]:
        """Per position, the tokens block 0 lets through there (``passes`` [tokens, length]), less the
        tokens whose rows the verified sentences explain, each pinned token at its position only."""
        live = self.rows.norm(dim=-1) > self.error
        pins = self.pins = self.spans.position_pins(self.tokens, self.rows, self.error, length)
        return [[v for i, v in enumerate(self.tokens) if passes[i, p] and live[i] and pins.get(v, p) == p]
                for p in range(length)]


def _peel(ledger: _Ledger, verified: dict[tuple[int, ...], float], before: int, candidates: list[list[int]],
          admitted: torch.Tensor, length: int, tried: set[tuple[int, tuple[int, ...]]]
          ) -> tuple[list[list[int]], torch.Tensor]:
    """Steps 2c-2d for the sentences verified after the first ``before``: their contributions leave the
    ledger (and, deflated, the search's spans: block 0's filter, ``admitted``, is taken again); the
    candidates again (unchanged when there is nothing new). Narrower candidates make the splits the
    splice searched worth searching again: ``tried`` is emptied then."""
    new = list(verified)[before:]
    if not any([ledger.peel(sentence) for sentence in new]):
        return candidates, admitted
    tried.clear()
    if ledger.deflate():
        admitted = ledger.spans.token_filter(ledger.tokens, length) < TAU
    return ledger.candidates(admitted, length), admitted


def _so_far(verified: dict[tuple[int, ...], float], rows: list[list[int]], k: int, tok: Any) -> list[list[int]]:
    """The answer so far, for an observer: the verified sentences, then the beam's first rows, as
    many as the batch (an empty [CLS] [SEP] where the pins and the ledger left the beam narrower)."""
    out = [list(s) for s in verified][:k]
    out += [list(r) for r in rows][:k - len(out)]
    return out + [[tok.cls_id, tok.sep_id] for _ in range(k - len(out))]


def _refuse_unless_one_gradient(update: SharedUpdate) -> None:
    threat = ThreatModel.from_record(update.meta.threat)   # an aggregate's clients: client_threat
    if threat.client_threat == "fedavg" and threat.local_steps > 1:
        raise GradleakError("dager needs one gradient (FedSGD, or FedAvg with one local step): after several "
                            "local steps the update's span is not the span of the inputs at one set of weights; "
                            "use the text dlg attack")


def _beam_pass(spans: _Spans, candidates: list[list[int]], length: int, width: int, tok: Any,
               verified: dict[tuple[int, ...], float], closed: dict[tuple[int, ...], float],
               known: set[tuple[int, ...]], step: Any) -> list[list[int]]:
    """One beam search over positions 1..L-1 (docs notes, step 2): fills ``closed`` with every
    closed candidate's largest block-1 residual and ``verified`` with those below ``TAU``; prefixes
    in ``known`` rank after all others. Returns the final beam."""
    beams: list[list[int]] = [[tok.cls_id]]
    cost = torch.zeros(1, dtype=torch.float64)
    for p in range(1, length):
        if tok.sep_id in candidates[p]:   # the beams closed here: verified as whole sentences
            shut = [b + [tok.sep_id] for b in beams if len(b) > 1 and tuple(b + [tok.sep_id]) not in closed]
            if shut:
                for s, w in zip(shut, spans.sentences(shut).amax(-1).tolist(), strict=True):
                    closed[tuple(s)] = w
                    if w < TAU:
                        verified[tuple(s)] = w
        nexts = [v for v in candidates[p] if v != tok.sep_id] if p < length - 1 else []
        rows = [b + [v] for b in beams for v in nexts]
        if not rows:
            break
        res = spans.sentences([r + [tok.sep_id] for r in rows])[:, p]
        if p <= LOOKAHEAD and p + 1 < length - 1:
            res = _lookahead(spans, rows, res, [w for w in candidates[p + 1] if w != tok.sep_id], p,
                             LOOKAHEAD_ROWS * width, tok.sep_id)
        score = cost.repeat_interleave(len(nexts)) + res
        late = torch.tensor([tuple(r) in known for r in rows], dtype=torch.float64) * 1e9
        keep = (score + late).argsort()[:width]
        beams, cost = [rows[int(i)] for i in keep], score[keep]
        step(p, [b + [tok.sep_id] for b in beams])
    return beams


def _lookahead(spans: _Spans, rows: list[list[int]], res: torch.Tensor, nexts: list[int], p: int, limit: int,
               sep: int) -> torch.Tensor:
    """The residual at position p of each row's new token, lowered to the best over one more token
    after it (min over w of [row, w, SEP]): a short prefix closed by [SEP] right away misses most
    of its sentence's context, one more true token gives part of it back (measured on MiniLM, 8
    sentences, positions 1-3: the true token ranked first 62.5 % of the time against 50 %, mean rank
    1.0 against 2.9). Only the ``limit`` rows with the lowest plain residual are extended (the cost
    is rows x next tokens)."""
    if not nexts:
        return res
    top = res.argsort()[:limit].tolist()
    ext = spans.sentences([rows[i] + [w, sep] for i in top for w in nexts])[:, p].reshape(len(top), len(nexts))
    out = res.clone()
    out[top] = torch.minimum(res[top], ext.min(dim=1).values)
    return out


def _explained(split: tuple[int, tuple[int, ...]], verified: dict[tuple[int, ...], float]) -> bool:
    """Whether a verified sentence already holds the split's first two suffix tokens at the same
    absolute positions (the split is then a variant of that sentence's tail)."""
    q, suffix = split
    return any(len(v) > q + 1 and v[q:q + 2] == suffix[:2] for v in verified)


def _splice(spans: _Spans, candidates: list[list[int]], tok: Any, k: int, verified: dict[tuple[int, ...], float],
            closed: dict[tuple[int, ...], float], width: int, step: Any,
            tried: set[tuple[int, tuple[int, ...]]] | None = None) -> tuple[int, int]:
    """Step 2b (docs notes): re-search the prefixes of the closed candidates whose tails look
    true. Every split (q, candidate[q:]) of an unverified closed candidate is scored by the mean
    block-1 residual of its tail alone (positions 1..q-1 hidden from attention, the tail at its
    absolute positions); splits whose first two tail tokens a verified sentence holds at the same
    positions are skipped (``_explained``: variants of that sentence's tail, and now and then a true
    tail that shares two tokens in place with it, which a longer or shorter split of the same
    candidate still offers). In that order, within one budget fixed at the start (``SPLICE_JOBS``
    times the sentences then missing), the prefix is searched again with the tail attached
    (``_complete``, ``width`` prefixes) and the completion verified as any closed sentence is.
    Returns (jobs run, sentences verified)."""
    closed_now = [c for c in closed if c not in verified and len(c) > 3]
    splits = sorted({(q, c[q:]) for c in closed_now for q in range(2, len(c) - 1)})
    tried = set() if tried is None else tried   # splits an earlier call searched: not again
    splits = [sp for sp in splits if not _explained(sp, verified) and sp not in tried]
    if not splits or len(verified) >= k:
        return 0, 0
    rows = [[tok.cls_id] + [tok.pad_id] * (q - 1) + list(tail) for q, tail in splits]
    masks = [[1] + [0] * (q - 1) + [1] * len(tail) for q, tail in splits]
    res = spans.sentences(rows, masks)[:, 1:].sum(-1)
    mean = res / torch.tensor([len(tail) for _, tail in splits], dtype=torch.float64)
    order = sorted(range(len(splits)), key=lambda i: (float(mean[i]), splits[i]))
    budget, ran, found = SPLICE_JOBS * (k - len(verified)), 0, 0
    for i in order:
        if ran >= budget or len(verified) >= k:
            break
        if _explained(splits[i], verified):   # a sentence verified by an earlier job holds this tail
            continue
        ran += 1
        tried.add(splits[i])
        done = _complete(spans, candidates, tok, width, *splits[i])
        step()
        if done is None:
            continue
        sentence, worst = done
        closed.setdefault(sentence, worst)   # an unverified completion is a fallback guess like any other
        if worst < TAU and sentence not in verified:
            verified[sentence] = worst
            found += 1
    return ran, found


def _complete(spans: _Spans, candidates: list[list[int]], tok: Any, width: int, q: int,
              tail: tuple[int, ...]) -> tuple[tuple[int, ...], float] | None:
    """The prefix of positions 1..q-1 in front of ``tail`` (which starts at position q), searched
    left to right with ``width`` prefixes kept: each row is [CLS, prefix, hidden, tail], the
    positions not yet chosen hidden from attention, and ranked by the sum of its block-1 residuals
    (the tail's context is there from the first token on, which the beam's early positions lack).
    Returns the best completion and its largest residual (below ``TAU``: verified), or None when a
    position has no candidate token."""
    beams: list[list[int]] = [[tok.cls_id]]
    for j in range(1, q):
        nexts = [v for v in candidates[j] if v != tok.sep_id]
        if not nexts:
            break
        rows = [b + [v] + [tok.pad_id] * (q - j - 1) + list(tail) for b in beams for v in nexts]
        mask = [1] * (j + 1) + [0] * (q - j - 1) + [1] * len(tail)
        keep = spans.sentences(rows, [mask] * len(rows)).sum(-1).argsort()[:width]
        beams = [rows[int(i)][:j + 1] for i in keep]
    full = [b + list(tail) for b in beams if len(b) == q]
    if not full:
        return None
    worst = spans.sentences(full).amax(-1)
    best = int(worst.argmin())
    return tuple(full[best]), float(worst[best])


def _confirm_in_full_span(spans: _Spans, verified: dict[tuple[int, ...], float]) -> None:
    """Step 3 after a deflation (2d): a sentence verified in a deflated span must lie in the full
    one too, or it is verified no more. Not a formality: the deflated span is the remainder's row
    space up to the subtraction's rounding, tilted by up to ~noise / gap (~1e-3 at a gap of 600x),
    more than ``TAU``; only the full span is the update's own."""
    if spans.search1 is spans.basis1:
        return
    for sentence, ok in zip(list(verified), spans.in_full_span(list(verified)), strict=True):
        if not ok:
            del verified[sentence]


def _why_not_exact(exact_bag: bool, verified: dict[tuple[int, ...], float], found: int, k: int, spans: _Spans,
                   beam_width: int, filtered: list[int], vocab: int) -> str | None:
    """Why the answer is not the exact batch (None when it is): the update, the span test, or the
    search, with the numbers that say which."""
    if not exact_bag:
        return "the update is not exact (noise): the span tests need the gradient's exact low rank"
    if len(verified) > k:   # only k distinct sentences exist: a verification was wrong
        return f"{len(verified)} sentences verified for a batch of {k}: the span test is not conclusive here"
    if sum(map(len, verified)) > spans.rank1:   # one block-1 input per token: rank1 counts the batch's tokens
        return (f"the verified sentences hold {sum(map(len, verified))} tokens, more than block 1's rank "
                f"{spans.rank1}: the span test is not conclusive here")
    if found < k:
        cause = (f"block 1's gradient has rank {spans.rank1}, below block 0's {spans.rank0}: its span misses "
                 "some of the batch's inputs" if spans.rank1 < spans.rank0 else
                 f"beam width {beam_width}; candidates per position (block 0 and the pins) "
                 f"{min(filtered) if filtered else 0}-{max(filtered) if filtered else 0} of {vocab}")
        return (f"{found} of {k} sentences verified ({cause}; a pruned or quantised update breaks the low rank "
                f"too: ranks {spans.rank0}/{spans.rank1})")
    return None


def _filter_tokens(spans: _Spans, update: SharedUpdate, bag: BagOfWords, vocab: list[int],
                   length: int) -> tuple[list[list[int]], Any, "_Ledger | None", int]:
    """Step 1 of DAGER (the position-aware token filter of block 0, then 1b's pins): each
    position's candidates, the filter's pass mask, the ledger and how many tokens it pinned."""
    # 1. the position-aware token filter of block 0 (content tokens and [SEP] at positions 1..L-1).
    # A noisy or pruned update has no exact low rank: nothing to filter or verify (and its bag may be
    # thousands of rows), so no search runs; the guesses are then the bag dealt round-robin.
    if not bag.exact:
        return [[] for _ in range(length)], None, None, 0
    passes = spans.token_filter(vocab, length) < TAU
    # 1b. a token whose occurrences all sit at one position is a candidate there only
    ledger = _Ledger(spans, update, vocab)
    return ledger.candidates(passes, length), passes, ledger, len(ledger.pins)


def _search(spans: _Spans, bag: BagOfWords, step1: tuple, length: int, k: int, beam_width: int, tok: Any,
            progress: bool, observer: Any) -> tuple:
    """Steps 2-3 of DAGER (the beam over positions verified by block 1's span, 2b's splice, 2c's
    peeling): the verified and closed sentences with their residuals, the last beams, the counts."""
    candidates, passes, ledger = step1
    # 2-3. the beam over positions, each prefix closed by [SEP]; closed sentences verified. A further
    # pass (at most cap) runs while it verifies new sentences, the prefixes of the verified ones
    # ranked after every other prefix (the beam's room goes to the sentences still missing)
    verified: dict[tuple[int, ...], float] = {}
    closed: dict[tuple[int, ...], float] = {}   # every closed candidate's max residual (the fallbacks)
    beams: list[list[int]] = []
    passes_run = 0
    ticks = [0]   # the bar's steps so far (its total grows by the splice's budget)

    def tick(bar: Any, task: Any) -> None:
        ticks[0] += 1
        bar.update(task, advance=1, loss=float("nan"))

    cap = max(PASSES, k + 1)   # passes; the bar expects PASSES and grows when more run
    with progress_bar("dager (sentences)", PASSES * (length - 1), progress) as bar:
        task = bar.add_task("dager (sentences)", total=PASSES * (length - 1), loss=float("nan"))
        splice_jobs = spliced = 0
        tried: set[tuple[int, tuple[int, ...]]] = set()
        while bag.exact and passes_run < cap and len(verified) < k:
            if passes_run >= PASSES:   # a pass past the bar's estimate: room for it
                bar.update(task, total=ticks[0] + length - 1)
            before = len(verified)
            known = {s[:i] for s in verified for i in range(2, len(s))}
            beams = _beam_pass(spans, candidates, length, beam_width, tok, verified, closed, known,
                               lambda p, b: (tick(bar, task),
                                             observer(p, _so_far(verified, b, k, tok)) if observer is not None else None))
            passes_run += 1
            # 2c. the new sentences' own gradients leave the ledger: the tokens only they held leave
            # the candidates, tokens now left at one position are pinned there
            candidates, passes = _peel(ledger, verified, before, candidates, passes, length, tried)
            if len(verified) > before and passes_run < cap:
                continue
            # 2b. the pass found nothing new (or was the last): the prefixes of tails that look true,
            # searched again with the tail attached; another pass follows what it verifies. Only where
            # a sentence was verified and block 1's rank is not below block 0's: otherwise (pruning,
            # quantisation, a rank-deficient block 1) nothing verifies and the jobs would be futile
            if not (0 < len(verified) < k and spans.rank1 >= spans.rank0):
                break
            bar.update(task, total=ticks[0] + SPLICE_JOBS * (k - len(verified)) + max(0, PASSES - passes_run) * (length - 1))
            before = len(verified)
            jobs, found = _splice(spans, candidates, tok, k, verified, closed, min(SPLICE_WIDTH, beam_width),
                                  lambda: tick(bar, task), tried)
            splice_jobs, spliced = splice_jobs + jobs, spliced + found
            if not found:
                break
            candidates, passes = _peel(ledger, verified, before, candidates, passes, length, tried)
        bar.update(task, total=ticks[0])
    return verified, closed, beams, passes_run, splice_jobs, spliced


def dager(update: SharedUpdate, model: TextModel, *, beam_width: int = 128, progress: bool = False,
          observer: Any = None) -> TextReconstruction:
    """DAGER on ``update`` (docs notes): verified sentences, then the best unverified ones up
    to the batch size. Never sees the sentences."""
    _refuse_unless_one_gradient(update)
    t0 = time.perf_counter()
    tok = model.tokenizer
    k = int(update.meta.batch_size)
    bag: BagOfWords = bag_of_words(update, model)
    length = bag.length if bag.length is not None and bag.length >= 3 else min(model.max_length, 32)
    # [UNK] and [MASK] may be a sentence's tokens; [PAD] never is, [CLS] and [SEP] have fixed places
    content = [t for t in bag.token_ids if t not in (tok.pad_id, tok.cls_id, tok.sep_id)] or [tok.unk_id]
    spans = _Spans(model, update)

    vocab = [*content, tok.sep_id]
    candidates, passes, ledger, pinned = _filter_tokens(spans, update, bag, vocab, length)
    filtered = [len(c) for c in candidates[1:]]
    verified, closed, beams, passes_run, splice_jobs, spliced = _search(
        spans, bag, (candidates, passes, ledger), length, k, beam_width, tok, progress, observer)

    _confirm_in_full_span(spans, verified)
    found = sorted(verified, key=lambda s: verified[s])[:k]
    guesses = sorted((s for s in closed if s not in verified and len(s) > 2), key=lambda s: closed[s])
    guesses += [tuple(b + [tok.sep_id]) for b in beams if len(b) > 1 and tuple(b + [tok.sep_id]) not in closed]
    sentences = [list(s) for s in found] + [list(s) for s in guesses[:k - len(found)]]
    for i in range(len(sentences), k):   # nothing closed (no [SEP] passed, or no search): the bag, unordered
        sentences.append([tok.cls_id, *(content[i::k] or content[:1]), tok.sep_id])
    labels = bias_labels(update, model) if k == 1 else torch.zeros(k, dtype=torch.long)
    why = _why_not_exact(bag.exact, verified, len(found), k, spans, beam_width, filtered, len(vocab))
    wall = time.perf_counter() - t0
    return TextReconstruction(
        token_ids=sentences, labels=labels, bag=bag,
        history=[{"iteration": 1, "loss": float("nan"), "phase": "dager"}], iterations=1, wall_seconds=wall,
        label_method="bias" if k == 1 else "none",
        extra={"analytic": True, "exact": why is None, "why_not_exact": why,
               "verified": len(found), "verified_max_residual": max(verified[s] for s in found) if found else None,
               "rank_layer0": spans.rank0, "rank_layer1": spans.rank1, "width": model.dim,
               "tokens_in_batch_bound": k * length, "bag": len(content), "sentence_length": length,
               "candidates_per_position": filtered, "pinned": pinned,
               "peeled": ledger.peeled if ledger is not None else 0,
               "deflated": ledger.deflated if ledger is not None else 0, "search_ranks": list(spans.search_ranks),
               "beam_width": beam_width,
               "sentences_evaluated": spans.evaluated, "beam_passes": passes_run, "splice_jobs": splice_jobs,
               "spliced": spliced, "tau": TAU})


def run(config: TextDAGERConfig, update: SharedUpdate, model: TextModel, engine: Engine) -> TextReconstruction:
    return dager(update, model, beam_width=int(config.beam_width), progress=engine.progress,
                 observer=engine.observer)
