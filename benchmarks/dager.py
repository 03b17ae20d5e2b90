"""Issue 42, item 2: gradleak's DAGER (text/attacks/dager.py) on MiniLM, FedSGD, the default beam
width (128), batches of 1-16 sentences from two held-out sources, 3 batches each (seeds 0-2): CPython's
documentation (``text.data.python_docs_sentences``, 88 sentences, the pool the experiments draw from
by other seeds) and a source gradleak never used, the docstrings of torch/nn/modules (189 sentences,
longer on average: ``torch_docs_sentences`` below); past 16 (where it stops), one batch of 24 and one
of 32 from the first.

Per batch: the sentences recovered exactly (after optimal pairing), those the attack verified in
block 1's span (a verified sentence is exact by the test: no false verification may occur), ROUGE-1/2/L,
the ranks of blocks 0 and 1 against the token count, the tokens pinned to one position (step 1b), the
verified sentences peeled from the ledger (step 2c), the deflations of the search's spans and their
last ranks (step 2d), the passes, the splice's jobs, the candidates per position (min, max), the
sentences scored, why it is not exact, and the wall time on this CPU (2 threads).

    .venv/bin/python benchmarks/dager.py        # ~26 min on 2 cores; writes benchmarks/dager.json

Measured 2026-11-28 (dager.json, with the pins, the ledger and the deflation): every sentence exact
at K = 1-16 from both sources, 3 batches each: 48/48 and 48/48 at 16 (173-226 tokens a batch);
24 of 24 at 24 (293 tokens) and 32 of 32 at 32 (380 tokens, block 1's rank 380 of the width 384:
the full span holds nearly every vector, so the first sentences are found slowly; 14 passes, 10
min; that row was recomputed with ``--sizes 32`` after the pass cap became K + 1: at the old cap
of 10 the passes ran out with 3 missing, 29 of 32); no sentence the attack verified was wrong (242 of 242). 0.7-2.5 min a
batch of 16, 10 min the batch of 32 (another job shared the 2 cores during the python-docs batches
of 4-16: their times are upper bounds). Block 1's rank equals the token count in every batch.
Earlier runs of this file (git history of dager.json): before the deflation (pins and ledger only)
44/48 and 39/48 at 16 (batches at 12 and 10), 19/24, 1/32; before the lookahead, the splice, the
pins and the ledger (widths 128 and 512) 10/12, 10/24 and 8/48 at 4, 8, 16.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def torch_docs_sentences() -> list[str]:
    """A second held-out source, never used by gradleak: the declarative sentences of the docstrings
    in torch/nn/modules (torch is pinned: the same on every machine), filtered as
    python_docs_sentences filters CPython's documentation (16-90 characters, letters, spaces,
    commas, apostrophes and hyphens, a capital first and a full stop last), each once."""
    import importlib.util
    import re
    root = Path(importlib.util.find_spec("torch").origin).parent / "nn" / "modules"
    docs = " ".join(d for f in sorted(root.glob("*.py")) for d in re.findall(r'"""(.*?)"""', f.read_text(), flags=re.S))
    return list(dict.fromkeys(s.strip() for s in re.split(r"(?<=[.!?])\s+", " ".join(docs.split()))
                              if 16 <= len(s.strip()) <= 90 and re.fullmatch(r"[A-Z][A-Za-z ,'\-]+\.", s.strip())))


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(description="DAGER on MiniLM (issue 42); writes benchmarks/dager.json")
    parser.add_argument("--sizes", default=None, help="recompute only the rows of these batch sizes (e.g. 32), "
                        "keeping the file's other rows; each recomputed row records its date")
    args = parser.parse_args(argv)
    from gradleak.text import run_text_attack
    from gradleak.text.client import text_fedsgd
    from gradleak.text.data import python_docs_sentences, text_batch
    from gradleak.text.metrics import evaluate_text
    from gradleak.text.models import build_text_model
    torch.set_num_threads(2)
    model = build_text_model("minilm", num_classes=2)
    pools = {"python-docs": list(python_docs_sentences()), "torch-nn-docstrings": torch_docs_sentences()}
    # 3 batches per size from each source; past 16 (where it stops), one batch of the first source
    plan = [(src, k, seed) for src in pools for k in (1, 2, 4, 8, 16) for seed in range(3)]
    plan += [("python-docs", k, 0) for k in (24, 32)]
    sizes = None if args.sizes is None else {int(x) for x in args.sizes.split(",")}
    if sizes is not None:
        plan = [p for p in plan if p[1] in sizes]
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S%z")
    rows = []
    for src, k, seed in plan:
        batch = text_batch(pools[src], model, k, seed)
        update = text_fedsgd(model, batch)
        t0 = time.perf_counter()
        recon = run_text_attack("dager", update, model, beam_width=128)
        wall = time.perf_counter() - t0
        m = evaluate_text(batch.token_ids(), batch.labels.tolist(), recon.token_ids, recon.labels.tolist(),
                          model.tokenizer)
        truth = {tuple(s) for s in batch.token_ids()}
        e = recon.extra
        row = {"source": src, "batch_size": k, "beam_width": 128, "seed": seed, "tokens": sum(batch.lengths),
               "exact": m.exact_sentences, "verified": e["verified"],
               "false_verified": sum(1 for s in recon.token_ids[:e["verified"]] if tuple(s) not in truth),
               "rouge1": m.rouge1, "rouge2": m.rouge2, "rougeL": m.rougeL,
               "rank_layer0": e["rank_layer0"], "rank_layer1": e["rank_layer1"], "bag": e["bag"],
               "pinned": e["pinned"], "peeled": e["peeled"], "deflated": e["deflated"],
               "search_ranks": e["search_ranks"], "beam_passes": e["beam_passes"],
               "splice_jobs": e["splice_jobs"], "spliced": e["spliced"],
               "candidates_per_position": [min(e["candidates_per_position"]), max(e["candidates_per_position"])],
               "sentences_evaluated": e["sentences_evaluated"], "why_not_exact": e["why_not_exact"],
               "wall_seconds": round(wall, 2)}
        if sizes is not None:
            row["date"] = now
        rows.append(row)
        print(json.dumps(row), flush=True)
    if sizes is not None:   # the other rows as the file has them
        out = json.loads((HERE / "dager.json").read_text())
        new = {(r["source"], r["batch_size"], r["seed"]): r for r in rows}
        out["rows"] = [new.pop((r["source"], r["batch_size"], r["seed"]), r) for r in out["rows"]] + list(new.values())
        out.setdefault("recomputed", []).append({"date": now, "sizes": sorted(sizes)})
        (HERE / "dager.json").write_text(json.dumps(out, indent=1) + "\n")
        return 0
    out = {"date": now, "torch": torch.__version__,
           "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "threads": 2,
           "python": platform.python_version(), "model": "minilm (d = 384), FedSGD, 2 classes",
           "sentences": {src: f"{len(p)} sentences" for src, p in pools.items()},
           "sources": {"python-docs": "pydoc_data.topics (text.data.python_docs_sentences)",
                       "torch-nn-docstrings": "torch/nn/modules docstrings (torch_docs_sentences above)"},
           "rows": rows}
    (HERE / "dager.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
