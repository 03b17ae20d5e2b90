"""The order search of DLG for text: a greedy, iterated local search over discrete sentences
(swaps, moved runs, replaced tokens, labels, lengths) that lowers the gradient distance."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch


@dataclass
class SearchState:
    """Sentences the search has scored: content ids per sentence, their lengths, labels, distance."""

    ids: torch.Tensor      # [K, n] content: indices into the leaked tokens (restricted) or token ids
    lengths: list[int]     # content tokens per sentence (<= n); the rest is padding
    labels: torch.Tensor   # [K]
    loss: float


Move = tuple  # ("swap", s1, p1, s2, p2) | ("move", s, p, m, q) | ("replace", s, p, c) | ("label", s, c) | ("length", s, n)
MAX_BLOCK = 4  # longest run of tokens a "move" relocates at once
KICK_MOVES = 2  # random moves that perturb a local minimum before the next descent
EXACT = 1e-9  # relative gradient distance below which the sentences explain the update exactly


class MoveList(Sequence):
    """OrderSearch's moves in their fixed order (swaps, moves of a run, replacements, labels,
    lengths: the order of the search's cyclic scan), each decoded from its index when it is
    asked for. Memory O(K n), whatever the count: the list itself, (K n)^2 / 2 swaps alone, held
    800 M tuples for 4096 sentences of 10 positions."""

    def __init__(self, candidates: list[list[int]], k: int, n: int, num_classes: int, lengths: bool):
        self.candidates, self.k, self.n, self.num_classes = candidates, k, n, num_classes
        self.slots = k * n
        # the runs of m = 1..MAX_BLOCK tokens: per m, the (p, q) pairs' counts per p in order
        self.blocks: list[tuple[int, int, np.ndarray]] = []  # (m, pairs per sentence, prefix counts per p)
        for m in range(1, min(MAX_BLOCK, n - 1) + 1):
            w = n - m + 1
            per_p = [sum(1 for q in (p - 1, p, p + 1) if 0 <= q < w) if m == 1 else 1 for p in range(w)]
            prefix = np.concatenate([[0], np.cumsum([w - e for e in per_p])]).astype(np.int64)
            self.blocks.append((m, int(prefix[-1]), prefix))
        self.offsets = np.concatenate([[0], np.cumsum([len(c) for c in candidates])]).astype(np.int64)
        sizes = [self.slots * (self.slots - 1) // 2, sum(k * c for _, c, _ in self.blocks), int(self.offsets[-1]),
                 k * num_classes, k * n if lengths else 0]
        self.starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, index: int) -> Move:  # type: ignore[override]
        i = int(index)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("move index out of range")
        kind = next(j for j in range(5) if i < self.starts[j + 1])
        t = i - self.starts[kind]
        n = self.n
        if kind == 0:  # swap slots u < v: row u holds S - 1 - u pairs
            s = self.slots

            def row(u: int) -> int:  # the index of row u's first pair
                return u * (2 * s - u - 1) // 2
            u = max(0, ((2 * s - 1) - math.isqrt(max(0, (2 * s - 1) ** 2 - 8 * t))) // 2)
            while u > 0 and row(u) > t:
                u -= 1
            while row(u + 1) <= t:
                u += 1
            v = u + 1 + (t - row(u))
            return ("swap", *divmod(u, n), *divmod(v, n))
        if kind == 1:  # move a run of m tokens of sentence a from p to q
            for m, count, prefix in self.blocks:
                if t < self.k * count:
                    a, r = divmod(t, count)
                    p = int(np.searchsorted(prefix, r, side="right")) - 1
                    q = r - int(prefix[p])
                    for e in sorted({p - 1, p, p + 1} if m == 1 else {p}):  # skip the excluded targets
                        if 0 <= e <= q:
                            q += 1
                    return ("move", a, p, m, q)
                t -= self.k * count
        if kind == 2:  # replace the token at slot (a, p) by one of its candidates
            slot = int(np.searchsorted(self.offsets, t, side="right")) - 1
            return ("replace", *divmod(slot, n), self.candidates[slot][t - int(self.offsets[slot])])
        if kind == 3:
            return ("label", *divmod(t, self.num_classes))
        a, m = divmod(t, n)
        return ("length", a, m + 1)


class OrderSearch:
    """Greedy search over discrete sentences that lowers the gradient distance.

    Moves: swap two content positions (within or across sentences); move a run of 1 to
    MAX_BLOCK tokens elsewhere in its sentence (the others shift; a pretrained model's gradients
    can prefer "hunter two is my password" to every single swap of it); replace a position's
    token by another candidate; change a sentence's label; (K > 1) change a sentence's length,
    the longest staying L. The move list
    is scanned cyclically and every move that lowers the distance is kept at once; the search
    stops after a full cycle without improvement or after ``budget`` scored sentences.
    """

    def __init__(self, score: Callable[[torch.Tensor, list[int], torch.Tensor], float],
                 candidates: list[list[int]], k: int, n: int, num_classes: int, budget: int, lengths: bool):
        self.score, self.candidates, self.budget, self.evaluations = score, candidates, budget, 0
        self.n = n
        self.moves = MoveList(candidates, k, n, num_classes, lengths)

    def apply(self, st: SearchState, move: Move) -> tuple[torch.Tensor, list[int], torch.Tensor] | None:
        """The sentences after ``move``, or None where it is not applicable or changes nothing."""
        kind = move[0]
        ids, lengths, labels = st.ids, st.lengths, st.labels
        if kind == "swap":
            _, a, p, b, q = move
            if p >= lengths[a] or q >= lengths[b] or ids[a, p] == ids[b, q]:
                return None
            ids = ids.clone()
            ids[a, p], ids[b, q] = st.ids[b, q], st.ids[a, p]
        elif kind == "move":
            _, a, p, m, q = move
            n = lengths[a]
            if p + m > n or q + m > n:
                return None
            row = ids[a].tolist()
            block, rest = row[p:p + m], row[:p] + row[p + m:n]
            new = rest[:q] + block + rest[q:] + row[n:]
            if new == row:
                return None
            ids = ids.clone()
            ids[a] = torch.tensor(new, dtype=ids.dtype)
        elif kind == "replace":
            _, a, p, c = move
            if p >= lengths[a] or int(ids[a, p]) == c:
                return None
            ids = ids.clone()
            ids[a, p] = c
        elif kind == "label":
            _, a, c = move
            if int(labels[a]) == c:
                return None
            labels = labels.clone()
            labels[a] = c
        else:
            _, a, m = move
            new = list(lengths)
            new[a] = m
            if m == lengths[a] or max(new) != self.n:
                return None
            lengths = new
        return ids, lengths, labels

    def _descend(self, state: SearchState, on_better: Callable[[SearchState], None]) -> SearchState:
        """First-improvement local search, cyclic over the moves, to a local minimum."""
        i, since = 0, 0
        total = len(self.moves)
        while since < total and self.evaluations < self.budget and state.loss > self.stop_loss:
            move = self.moves[i % total]
            i += 1
            since += 1
            cand = self.apply(state, move)
            if cand is None:
                continue
            self.evaluations += 1
            loss = self.score(*cand)
            if loss < state.loss:
                state = SearchState(cand[0], cand[1], cand[2], loss)
                since = 0
                on_better(state)
        return state

    def run(self, state: SearchState, on_accept: Callable[[SearchState], None], *, generator: torch.Generator,
            stop_loss: float = 0.0) -> SearchState:
        """Local search, then (iterated local search) while budget remains and the distance is
        above ``stop_loss``: kick the best sentences with KICK_MOVES random moves and descend
        again, keeping the best. ``on_accept`` sees every new best."""
        self.stop_loss = stop_loss
        best = state

        def better(st: SearchState) -> None:
            nonlocal best
            if st.loss < best.loss:
                best = st
                on_accept(st)
        self._descend(state, better)
        while self.evaluations < self.budget and best.loss > stop_loss:
            kicked: SearchState | None = best
            for _ in range(KICK_MOVES):
                for _try in range(20):  # a random applicable move
                    move = self.moves[int(torch.randint(len(self.moves), (1,), generator=generator))]
                    cand = self.apply(kicked, move)
                    if cand is not None:
                        kicked = SearchState(cand[0], cand[1], cand[2], float("inf"))
                        break
            if kicked is best:
                break
            self.evaluations += 1
            kicked.loss = self.score(kicked.ids, kicked.lengths, kicked.labels)
            better(kicked)
            self._descend(kicked, better)
        return best


__all__ = ["EXACT", "KICK_MOVES", "MAX_BLOCK", "Move", "MoveList", "OrderSearch", "SearchState"]
