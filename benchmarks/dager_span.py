"""Issue 42, item 2 (DAGER, Petrov et al. 2024): where the first layer's span test stops on MiniLM.

DAGER's token filter: the gradient of the first attention layer's Q/K/V weights is
sum_t delta_t z_t^T, so its row space is spanned by the layer's inputs z_t =
LayerNorm(word[v_t] + position[p_t] + type[0]) of the batch's tokens; a candidate (token, position)
belongs to the batch iff its z lies in that span. This measures, on the pretrained MiniLM (d = 384)
with FedSGD updates of real sentences the project was never tuned on (Python's own documentation,
``pydoc_data.topics``, shipped with CPython: declarative sentences of 40-90 characters), for batches
of 1-16 sentences (3 batches each):

* the numerical rank of [dW_Q; dW_K; dW_V] of layer 0 (the largest gap of its singular values)
  against the distinct (token, position) pairs and against |bag| + L (the dimension of
  span{word[v]} + span{position[p]}: LayerNorm is nearly affine on these sums, so every
  combination of a batch token with a batch position lies almost in the span);
* every bag token (the word-embedding gradient's non-zero rows) at every position < L: the
  relative residual ||z - P z|| / ||z|| of the true pairs and of all others; ``margin`` = the
  smallest false residual / the largest true one (> 1: a threshold separates them), and
  ``recall_at_no_false`` = the share of true pairs below the smallest false residual;
* the same with the client computing in float64 (what the test can do when rounding is not the
  limit).

    .venv/bin/python benchmarks/dager_span.py       # ~1 min; writes benchmarks/dager_span.json

Measured 2026-11-27 (dager_span.json): 1 and 2 sentences separate cleanly (margin >= 830 in
float32, every true pair below every false one); 4 sentences in 2 of 3 batches (margin 31-33), the
third not (0.62); 8 and 16 sentences never (margin 0.005-0.38 in float32, 0.55-0.64 in float64,
recall 0.2-0.8). The reason is structural, not rounding: there the rank is |bag| + L - 1 or - 2,
below the distinct pairs. z(v, p) = gamma * (c(word[v]) + c(position[p]) + c(type[0])) / sigma(v, p)
+ beta (c: centring; LayerNorm's only non-linearity is the per-vector scale 1 / sigma), so every
z(v, p) lies in span{gamma c(word[v])} + span{gamma c(position[p])} + span{gamma c(type), beta}, a
space of dimension |bag| + L + 2 at most; once the batch's pairs fill it (tokens recurring at other
positions close the cycles), every bag token passes at every batch position, in any precision.
DAGER's position-aware first-layer filter therefore stops, on an encoder with absolute positions
added before its embedding LayerNorm, at about |bag| + L distinct pairs: 4 sentences of ~13 tokens on
MiniLM. Sentence assembly has to come from deeper layers (where attention mixes the sentence) or
from another signal; gradleak has no DAGER attack yet.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def sentences() -> list[str]:
    import pydoc_data.topics as topics
    text = " ".join(topics.topics.values())
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text)
            if 40 < len(s) < 90 and re.fullmatch(r"[A-Za-z ,'\-]+\.", s.strip())]


def span_basis(grads: dict[str, torch.Tensor], layer: int) -> tuple[torch.Tensor, int, list[float]]:
    pre = f"bert.encoder.layer.{layer}.attention.self."
    m = torch.cat([grads[pre + n + ".weight"] for n in ("query", "key", "value")]).double()
    _, s, vh = torch.linalg.svd(m, full_matrices=False)
    gaps = s[:-1] / s[1:].clamp_min(1e-300)
    r = int(gaps.argmax()) + 1
    return vh[:r].T, r, [float(s[r - 1]), float(s[r])]


def measure(model, batch, dtype: torch.dtype) -> dict:  # noqa: ANN001
    from gradleak.text.client import text_fedsgd
    module = model.module.to(dtype)
    try:
        update = text_fedsgd(model, batch)
    finally:
        model.module.to(torch.float32)
    g = update.gradients
    bag = (g[model.word_embedding].abs().amax(1) > 0).nonzero().flatten()
    length = int((g[model.position_embedding].abs().amax(1) > 0).nonzero().max()) + 1
    basis, rank, edge = span_basis(g, 0)
    emb = module.bert.embeddings
    with torch.no_grad():
        e = (emb.word_embeddings.weight[bag][:, None, :] + emb.position_embeddings.weight[:length][None]
             + emb.token_type_embeddings.weight[0]).to(dtype)
        z = torch.nn.functional.layer_norm(e, e.shape[-1:], emb.LayerNorm.weight.to(dtype),
                                           emb.LayerNorm.bias.to(dtype), emb.LayerNorm.eps).double()
        res = (z - (z @ basis) @ basis.T).norm(dim=-1) / z.norm(dim=-1)
    index = {int(v): i for i, v in enumerate(bag.tolist())}
    truth = {(v, p) for ids in batch.token_ids() for p, v in enumerate(ids)}
    is_true = torch.zeros_like(res, dtype=torch.bool)
    for v, p in truth:
        is_true[index[v], p] = True
    true_max, false_min = float(res[is_true].max()), float(res[~is_true].min())
    return {"rank": rank, "singular_values_at_rank": edge, "distinct_pairs": len(truth), "bag": len(bag),
            "length": length, "bag_plus_length": len(bag) + length, "true_residual_max": true_max,
            "false_residual_min": false_min, "margin": false_min / true_max,
            "recall_at_no_false": float((res[is_true] < false_min).float().mean())}


def main() -> int:
    from gradleak.text.data import text_batch
    from gradleak.text.models import build_text_model
    torch.set_num_threads(2)
    model = build_text_model("minilm", num_classes=2)
    pool = sentences()
    rows = []
    for k in (1, 2, 4, 8, 16):
        for seed in range(3):
            batch = text_batch(pool, model, k, seed)
            row = {"batch_size": k, "seed": seed, "tokens": sum(batch.lengths)}
            for name, dtype in (("float32", torch.float32), ("float64", torch.float64)):
                row[name] = measure(model, batch, dtype)
            rows.append(row)
            f32, f64 = row["float32"], row["float64"]
            print(f"B {k} seed {seed}: tokens {row['tokens']}, pairs {f32['distinct_pairs']}, bag+L "
                  f"{f32['bag_plus_length']}, rank {f32['rank']} | float32 margin {f32['margin']:.3g} recall "
                  f"{f32['recall_at_no_false']:.2f} | float64 rank {f64['rank']} margin {f64['margin']:.3g} recall "
                  f"{f64['recall_at_no_false']:.2f}", flush=True)
    out = {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S%z"), "torch": torch.__version__,
           "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
           "model": "minilm (d = 384), FedSGD, 2 classes, labels drawn by the batch seed",
           "sentences": f"{len(pool)} from pydoc_data.topics (CPython's documentation)", "rows": rows}
    (HERE / "dager_span.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
