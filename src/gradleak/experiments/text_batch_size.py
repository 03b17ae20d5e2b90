"""Text leakage vs batch size: ROUGE-1/2/L and exactly recovered sentences as the batch of
sentences grows, for the text attacks the literature compares (gradleak's DLG for text, TAG, LAMP and
DAGER's exact recovery), on the pretrained MiniLM, every batch reported."""

from __future__ import annotations

import random
from typing import Any

from ..catalog import TEXT_ATTACKS, TEXT_MODELS, unknown
from ..errors import ConfigError
from ..report import save_line_plot
from ..text.data import python_docs_sentences
from .base import ExperimentOptions, ExperimentResult, experiment
from .cells import CellResult, Workspace
from .common import VERDICT_COLUMNS, convergence_notes, series, summarize, summary_columns, verdict_fields

BATCH_SIZES = (1, 2, 4, 8, 16)
SMOKE_BATCH_SIZES = (1, 2)
ATTACKS = ("dlg", "tag", "lamp", "dager")
MODEL = "minilm"
SMOKE_MODEL = "tiny-transformer"
# smoke: a few steps of each optimisation attack (the cells' plumbing, not their quality)
SMOKE_OPTIONS: dict[str, dict[str, Any]] = {"dlg": dict(iterations=10, search_evaluations=20),
                                            "tag": dict(iterations=10),
                                            "lamp": dict(iterations=10, discrete_every=5, discrete_candidates=2)}
VALUES = ("rouge1", "rouge2", "rougeL", "exact_fraction")
# The papers' numbers beside ours (reproduction/text-batch-size/reading.md gives their sources).
PAPERS_NOTE = ("The papers attack BERT-base on CoLA, SST-2 and Rotten Tomatoes with GPU budgets (TAG and LAMP: "
               "thousands of steps, GPT-2 as LAMP's prior; DAGER: exact recovery of batches up to 128 on "
               "decoders); reproduction/text-batch-size/reading.md puts their numbers beside these.")


def batch_sentences(k: int, seed: int) -> list[str]:
    """The K held-out sentences of the batch with this seed (the same for every attack)."""
    pool = python_docs_sentences()
    return random.Random(seed).sample(pool, k)


SPEC = {
    "name": "text-batch-size",
    "summary": ("text leakage vs batch size: ROUGE-1/2/L and exact sentences for DLG, TAG, LAMP and DAGER on MiniLM, "
                "held-out sentences"),
    "modality": "text",
}


@experiment("text-batch-size")
def text_batch_size(opt: ExperimentOptions, ws: Workspace) -> ExperimentResult:
    attacks = opt.attacks or list(ATTACKS)
    sizes = opt.batch_sizes or list(SMOKE_BATCH_SIZES if opt.smoke else BATCH_SIZES)
    _check_options(opt, attacks, sizes)
    batches = opt.batches or opt.samples or (1 if opt.smoke else 3)
    model = opt.model or (SMOKE_MODEL if opt.smoke else MODEL)
    plan: dict[tuple[str, int, int], dict[str, Any]] = {}
    for attack in attacks:
        extra = dict(SMOKE_OPTIONS.get(attack, {})) if opt.smoke else {}
        if opt.iterations and attack != "dager":
            extra["iterations"] = opt.iterations
        for k in sizes:
            for b in range(batches):
                seed = opt.seed + b
                plan[(attack, k, b)] = dict(attack=attack, modality="text", model=model,
                                            text=batch_sentences(k, 1000 * k + seed), seed=seed, **extra)
    cells = ws.run(plan)
    rows = _rows(cells, opt.seed, model)
    by = ["attack", "batch_size"]
    summary = summarize(rows, by, values=VALUES)
    figs = []
    for value, label in (("rouge1", "ROUGE-1"), ("exact_fraction", "sentences recovered exactly")):
        fig = f"{value}_vs_batch_size.png"
        save_line_plot(ws.out / fig, [str(k) for k in sizes],
                       {a: series(rows, "batch_size", sizes, value, attack=a) for a in attacks},
                       xlabel="batch size K (sentences)", ylabel=f"{label}, mean of {batches} batch(es)",
                       title=f"Text leakage vs batch size on {model}")
        figs.append(fig)
    return ExperimentResult(
        name="text-batch-size", title="Text leakage vs batch size",
        columns=["attack", "batch_size", "sample", "rouge1", "rouge2", "rougeL", "exact_sentences", "exact_fraction",
                 "token_accuracy", "label_accuracy", "verified", *VERDICT_COLUMNS, "seed", "model", "iterations",
                 "wall_seconds"],
        rows=rows, figures=figs, summary=summary, summary_columns=summary_columns(by, VALUES),
        setup={"model": f"{model} (sentence classifier, seeded head), one FedSGD gradient of the batch",
               "data": f"K held-out sentences of CPython's documentation per batch ({len(python_docs_sentences())} "
                       "sentences, pydoc_data; never used to tune the attacks), drawn by seed 1000 K + batch seed; "
                       "the same batches for every attack",
               "attacks": {a: "its own defaults for the model (text/attacks/ SPECs)" +
                           (f", smoke: {SMOKE_OPTIONS[a]}" if opt.smoke and a in SMOKE_OPTIONS else "")
                           for a in attacks},
               "batch sizes": sizes, "batches": batches, "seeds": f"{opt.seed}..{opt.seed + batches - 1}",
               "metrics": "ROUGE-1/2/L (rouge-score F-measure) after optimal pairing of recovered to true sentences, "
                          "averaged over the batch; exact = a recovered sentence equal to its true one, token for token",
               "verdict": "outcome.py's text rule: leaked = a sentence recovered exactly or >= 50 % of the tokens in "
                          "place; otherwise inconclusive (a failed attack protects nobody)",
               "smoke": opt.smoke},
        notes=["Every finished cell (one batch attacked by one attack) is a row; the summary's means are over all "
               "of them (a failed cell is listed with its error, never averaged).",
               "dager's `verified` counts the sentences its span test certified (exact by that test); "
               "the others are its unverified guesses.", PAPERS_NOTE]
        + convergence_notes(cells.values()))


def _check_options(opt: ExperimentOptions, attacks: list[str], sizes: list[int]) -> None:
    """Refuse, before any cell runs, unknown text attacks or models, the image-only flags, and a
    batch larger than the held-out pool."""
    for a in attacks:
        if a not in TEXT_ATTACKS:
            raise unknown("text attack", a, TEXT_ATTACKS)
    if opt.model is not None and opt.model not in TEXT_MODELS:
        raise unknown("text model", opt.model, TEXT_MODELS)
    if opt.data is not None or opt.width is not None or opt.trained:
        flag = "--data" if opt.data is not None else "--width" if opt.width is not None else "--trained"
        raise ConfigError(f"{flag} does not apply to experiment 'text-batch-size' (held-out CPython documentation "
                          "sentences on the text models at their own sizes, untrained)")
    pool = len(python_docs_sentences())
    if max(sizes) > pool:
        raise ConfigError(f"batch size {max(sizes)}: the held-out pool has {pool} sentences")


def _rows(cells: dict[tuple[str, int, int], CellResult], seed: int, model: str) -> list[dict[str, Any]]:
    """One row per finished cell (attack, K, batch): its ROUGE, exact sentences and verdict."""
    rows = []
    for (attack, k, b), cell in cells.items():
        if not cell.ok:
            continue
        m = cell.metrics
        exact = m.get("exact_sentences")
        rows.append({"attack": attack, "batch_size": k, "sample": b, "seed": seed + b,
                     "rouge1": m.get("rouge1"), "rouge2": m.get("rouge2"), "rougeL": m.get("rougeL"),
                     "exact_sentences": exact, "exact_fraction": None if exact is None else exact / k,
                     "token_accuracy": m.get("token_accuracy"), "label_accuracy": m.get("label_accuracy"),
                     "verified": m.get("verified"), **verdict_fields(cell, None),
                     "iterations": m.get("iterations"), "wall_seconds": m.get("wall_seconds"), "model": model})
    return rows
