"""LAMP, "Extracting Text from Gradients with Language Model Priors" (Balunovic, Dimitrov,
Jovanovic and Vechev, NeurIPS 2022): continuous optimisation of the dummy sentences alternated with
discrete steps that reorder their tokens, each reordering scored by the gradient distance plus a
language model's log-perplexity (Alg. 1)."""

from __future__ import annotations

# The attack's declaration (gradleak/specs.py reads it without importing this module).
SPEC = {
    "name": "lamp",
    "modality": "text",
    "summary": "LAMP (Balunovic et al. 2022): cosine gradient matching alternated with reorderings scored by a language-model prior",
    "kind": "optimisation",
    "converged_below": 1e-4,   # the text line (attacks/verdict.py)
    "needs": "the gradients (or update) of a text classifier",
    "flags": {"iterations": None, "lr": None, "optimizer": None, "dtype": None, "labels": None,
              "search_evaluations": None,
              "lm_weight": ["float>=0", 0.2, "LAMP: alpha_lm, the weight of the language-model prior's "
                            "log-perplexity beside the gradient distance in the discrete steps"],
              "discrete_every": ["int[1,100000]", None, "LAMP: continuous steps between two discrete steps"],
              "discrete_candidates": ["int[1,10000]", None, "LAMP: random reorderings scored per sentence "
                                      "in each discrete step"]},
    "model_defaults": {
        "tiny-transformer": {"iterations": 200, "lr": 0.1, "optimizer": "adam", "dtype": "float64",
                             "search_evaluations": 0, "lm_weight": 0.2, "discrete_every": 20,
                             "discrete_candidates": 16},
        "minilm": {"iterations": 100, "lr": 0.1, "optimizer": "adam", "dtype": "float32", "search_evaluations": 0,
                   "lm_weight": 0.2, "discrete_every": 20, "discrete_candidates": 16},
    },
    "default_note": {"labels": "bias for one sentence, else soft"},
    "resolve": True,
    # the flags every sweep cell identity hashes even unset (gradleak/specs.py); frozen, never extended
    "hashed_flags": ["iterations", "lr", "optimizer", "dtype", "labels", "search_evaluations"],
}

import time
from typing import Any

import torch

from ...attacks.objectives import cosine
from ...engine import Engine, StateHooks
from ...fl.update import SharedUpdate
from ..configs import text_config_class
from ..leak import TextObserver, TextReconstruction
from ..search import FreeRelaxation, Relaxation, TextDLG, dlg_text
from ..models import TextModel
from ..prior import BigramPrior, stdlib_prior
from .dlg import resolve  # the same label rule as dlg

# the typed config of this attack, derived from its SPEC (text/configs.py)
TextLAMPConfig = text_config_class(SPEC["name"])

__all__ = ["SPEC", "LampRun", "TRANSFORMS", "resolve", "run", "transform"]

INIT_SAMPLES = 8      # Alg. 1 line 1: random draws, the lowest L_rec kept (the paper: 500)
REG_WEIGHT = 1.0      # alpha_reg of the embedding-length regulariser (free embeddings only)
TRANSFORMS = ("swap", "move-token", "move-span", "prefix-to-end")


def transform(n: int, gen: torch.Generator) -> tuple[str, list[int]]:
    """One of LAMP's four transformations of n >= 2 positions, drawn uniformly with its
    parameters: (its name, the new order as a permutation of range(n)), never the identity."""
    order = list(range(n))
    kind = TRANSFORMS[int(torch.randint(len(TRANSFORMS), (1,), generator=gen))]

    def draw(hi: int) -> int:  # uniform in [0, hi)
        return int(torch.randint(hi, (1,), generator=gen))
    if kind == "swap":
        i = draw(n)
        j = (i + 1 + draw(n - 1)) % n
        order[i], order[j] = order[j], order[i]
    elif kind == "prefix-to-end":
        r = 1 + draw(n - 1)
        order = order[r:] + order[:r]
    else:  # move a span of m tokens (one token: m = 1) from i to slot q of the rest
        m = 1 if kind == "move-token" else 1 + draw(n - 1)
        i = draw(n - m + 1)
        span, rest = order[i:i + m], order[:i] + order[i + m:]
        q = draw(len(rest))     # uniform over the len(rest) + 1 slots other than i (where it came from)
        q += q >= i
        order = rest[:q] + span + rest[q:]
    return kind, order


class LampRun(TextDLG):
    """One LAMP run: DLG for text's run (text/search.py) with LAMP's objective, initialisation
    and discrete steps (Alg. 1)."""

    def __init__(self, relax: Relaxation, length: int, y_soft: torch.Tensor | None, fixed_labels: torch.Tensor | None,
                 observer: TextObserver | None, *, prior: BigramPrior, lm_weight: float, every: int,
                 candidates: int, seed: int, gen: torch.Generator):
        super().__init__(relax, length, y_soft, fixed_labels, observer)
        self.prior, self.lm_weight, self.every, self.candidates, self.seed = prior, lm_weight, every, candidates, seed
        self.free = isinstance(relax, FreeRelaxation)
        if self.free:
            w = relax.w  # type: ignore[attr-defined]
            self.mean_norm = float(w[relax.allowed].norm(dim=-1).mean())  # type: ignore[attr-defined]
        self.steps = {"discrete_steps": 0, "accepted": 0, "scored": 0}
        self.accepted_kinds = dict.fromkeys(TRANSFORMS, 0)
        start = time.perf_counter()
        self._initialise(gen)
        self.setup_seconds = time.perf_counter() - start

    def state_hooks(self) -> StateHooks:
        """The discrete steps' counters travel with the loop's snapshots (a resumed run counts on)."""
        def get() -> dict[str, Any]:
            return {"steps": dict(self.steps), "accepted_kinds": dict(self.accepted_kinds)}

        def put(state: dict[str, Any]) -> None:
            self.steps.update({k: int(v) for k, v in state["steps"].items()})
            self.accepted_kinds.update({k: int(v) for k, v in state["accepted_kinds"].items()})
        return StateHooks(get, put)

    # ---- L_rec, L_reg, L_lm
    def rec(self, variable: torch.Tensor | None = None, create_graph: bool = True) -> torch.Tensor:
        """L_rec: LAMP's cosine gradient distance of the dummy sentences ``variable``."""
        got = self.sim(self.relax.inputs(variable), self.mask, self.target_labels(), create_graph=create_graph)
        return cosine(got, self.sim.target)

    def objective(self) -> torch.Tensor:
        loss = self.rec()
        if self.free:  # L_reg: the dummy embeddings' mean length against the vocabulary's
            lengths = self.relax.variable.norm(dim=-1).mean()
            loss = loss + REG_WEIGHT * (lengths - self.mean_norm) ** 2
        return loss

    def lm(self, ids: torch.Tensor) -> list[float]:
        """L_lm of each sentence's tokens ``ids`` [K, n] (relaxation indices), [CLS] and [SEP] added."""
        tok = self.relax.tok
        return [self.prior.nll([tok.cls_id, *self.relax.token_ids(row), tok.sep_id]) for row in ids.tolist()]

    def _initialise(self, gen: torch.Generator) -> None:
        """Alg. 1 line 1: the draw with the lowest L_rec among INIT_SAMPLES (the relaxation's own included)."""
        with torch.no_grad():
            draws = [self.relax.variable.detach().clone()] + [self.relax.fresh(gen) for _ in range(INIT_SAMPLES - 1)]
            scores = [float(self.rec(d, create_graph=False)) for d in draws]
            self.relax.variable.copy_(draws[min(range(len(draws)), key=scores.__getitem__)])

    # ---- the discrete step
    def after_step(self, t: int) -> None:
        if (t + 1) % self.every or self.relax.n_content < 2:
            return
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + t)   # the same moves on a resumed run
        x = self.relax.variable
        ids = self.relax.current_ids()          # the nearest tokens; a reordering reorders them
        lm = self.lm(ids)
        current = float(self.rec(x.detach(), create_graph=False)) + self.lm_weight * sum(lm) / len(lm)
        self.steps["discrete_steps"] += 1
        for a in range(self.relax.k):
            best: tuple[float, list[int], str, float] | None = None
            for _ in range(self.candidates):
                kind, order = transform(self.relax.n_content, gen)
                cand = x.detach().clone()
                cand[a] = x.detach()[a, order]
                lm_a = self.prior.nll([self.relax.tok.cls_id, *self.relax.token_ids(ids[a, order].tolist()),
                                       self.relax.tok.sep_id])
                lm_mean = (sum(lm) - lm[a] + lm_a) / len(lm)
                score = float(self.rec(cand, create_graph=False)) + self.lm_weight * lm_mean
                self.steps["scored"] += 1
                if score < current and (best is None or score < best[0]):
                    best = (score, order, kind, lm_a)
            if best is not None:
                current, order, kind, lm[a] = best
                x[a] = x[a, order].clone()
                ids[a] = ids[a, order].clone()
                self.steps["accepted"] += 1
                self.accepted_kinds[kind] += 1

    def extra(self) -> dict[str, Any]:
        return {"lamp": {**self.steps, "accepted_by_transform": dict(self.accepted_kinds),
                         "lm_weight": self.lm_weight, "discrete_every": self.every,
                         "discrete_candidates": self.candidates, "init_samples": INIT_SAMPLES,
                         "distance": "cosine", "prior": "kneser-ney bigram, standard-library docstrings",
                         "prior_tokens": self.prior.tokens, "free_embeddings": self.free}}


def run(config: TextLAMPConfig, update: SharedUpdate, model: TextModel, engine: Engine) -> TextReconstruction:
    start = time.perf_counter()
    prior = stdlib_prior(model.tokenizer)   # built once per process (~4 s), counted in the run that built it
    prior_seconds = time.perf_counter() - start
    runs: list[LampRun] = []

    def make_run(relax: Relaxation, length: int, y_soft: torch.Tensor | None, fixed_labels: torch.Tensor | None,
                 observer: TextObserver | None) -> LampRun:
        gen = torch.Generator().manual_seed(config.seed + 11)
        runs.append(LampRun(relax, length, y_soft, fixed_labels, observer, prior=prior,
                            lm_weight=float(config.lm_weight), every=int(config.discrete_every),
                            candidates=int(config.discrete_candidates), seed=int(config.seed), gen=gen))
        return runs[-1]
    rec = dlg_text(update, model, config, engine, restrict=True, make_run=make_run, name="lamp")
    # the whole cost: the prior's construction and the initial draws too
    setup = prior_seconds + sum(r.setup_seconds for r in runs)
    rec.wall_seconds += setup
    rec.extra["lamp"]["setup_seconds"] = round(setup, 3)
    return rec
