"""The attacker's simulation of a text client (dummy sentences -> the update they would produce)
and the distances measured with it: the truth's own, and which tensors an answer was matched on."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..attacks.objectives import squared_l2
from ..fl.threats import ThreatModel
from ..fl.unroll import local_sgd
from ..fl.update import SharedUpdate
from .leak import TextReconstruction
from .models import TextModel


_ROWS = "<word-embedding rows>"  # the unroll's name for W[rows] (no parameter name has "<")


class TextSimulator:
    """The attacker's simulation of the client: dummy inputs -> the update they would produce.

    ``rows``: token ids whose embedding rows are variables (restricted mode): inputs are then
    probabilities [K, L, len(rows)] over those tokens, the embeddings P @ W[rows], and the rows
    W[rows] of the shared update are matched too. ``rows=None``: inputs are free embeddings
    [K, L, dim]; the word-embedding gradient is not matched (free vectors do not touch W).

    FedAvg is unrolled functionally (local steps over the dummy batch in the fixed order 0..K-1,
    as the image attacks assume); aggregate averages N simulated clients.
    """

    def __init__(self, model: TextModel, update: SharedUpdate, *, rows: list[int] | None,
                 dtype: torch.dtype, device: torch.device):
        self.model, self.dtype, self.device = model, dtype, device
        trainable = [n for n, p in model.module.named_parameters() if p.requires_grad]
        self.params = {n: update.global_weights[n].to(device=device, dtype=dtype) for n in trainable}
        self.buffers = {n: b.to(device) for n, b in model.module.named_buffers()}
        self.threat = ThreatModel.from_record(update.meta.threat)
        self.batch_size = update.meta.batch_size
        self.clients = self.threat.clients if self.threat.name == "aggregate" else 1
        self.client_batch = self.batch_size // self.clients
        w = model.word_embedding
        self.rows = rows
        self.names = [n for n in trainable if n != w]
        target = [update.gradients[n].to(device=device, dtype=dtype) for n in self.names]
        if rows is not None:
            idx = torch.tensor(rows, dtype=torch.long, device=device)
            self.row_index = idx
            target.append(update.gradients[w].to(device=device, dtype=dtype)[idx])
        self.target = target
        if self.threat.client_threat == "fedavg":
            self.steps = self.threat.local_schedule(self.client_batch, None)  # the fixed order 0..K-1

    def _embed(self, inputs: torch.Tensor, w_rows: torch.Tensor | None) -> torch.Tensor:
        return inputs @ w_rows if w_rows is not None else inputs

    def _client(self, inputs: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor,
                create_graph: bool) -> list[torch.Tensor]:
        base = {n: p for n, p in self.params.items()}
        w_rows = None
        if self.rows is not None:
            w_rows = self.params[self.model.word_embedding][self.row_index].clone().requires_grad_(True)
        params = {n: base[n].clone().requires_grad_(True) for n in self.names}
        full = {**base, **params}
        variables = list(params.values()) + ([w_rows] if w_rows is not None else [])
        if self.threat.client_threat == "fedsgd":
            logits = self.model.logits(full, self.buffers, self._embed(inputs, w_rows), mask)
            loss = _loss(logits, labels)
            return list(torch.autograd.grad(loss, variables, create_graph=create_graph))
        named = dict(params) if w_rows is None else {**params, _ROWS: w_rows}

        def loss(cur: dict[str, torch.Tensor], inp: torch.Tensor, m: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            weights = {**base, **{n: cur[n] for n in self.names}}
            return _loss(self.model.logits(weights, self.buffers, self._embed(inp, cur.get(_ROWS)), m), y)
        # The client's local steps (fl.unroll), the graph kept through every step, as the image attacks do.
        run = local_sgd(named, loss, (inputs, mask, labels), self.steps, self.threat.local_lr, mode="graph")
        return list(run.update().values())

    def __call__(self, inputs: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor, *,
                 create_graph: bool = True) -> list[torch.Tensor]:
        """inputs [K, L, len(rows)] probabilities (restricted) or [K, L, dim] embeddings;
        mask [K, L]; labels [K] ints or [K, C] probabilities -> tensors in target order."""
        with torch.enable_grad():
            if self.clients == 1:
                return self._client(inputs, mask, labels, create_graph)
            k = self.client_batch
            parts = [self._client(inputs[i * k:(i + 1) * k], mask[i * k:(i + 1) * k], labels[i * k:(i + 1) * k],
                                  create_graph) for i in range(self.clients)]
            return [sum(p[j] for p in parts) / self.clients for j in range(len(self.target))]

    def distance(self, inputs: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> float:
        """Squared L2 gradient distance of fixed inputs (no graph kept)."""
        got = self(inputs, mask, labels, create_graph=False)
        return float(squared_l2([g.detach() for g in got], self.target))


def truth_relative_distance(model: TextModel, update: SharedUpdate, truth_ids: torch.Tensor, mask: torch.Tensor,
                            labels: torch.Tensor, bag_ids: list[int] | None) -> float | None:
    """How well the client's true sentences explain the (defended) update, on the text DLG
    attacks' own measure (``TextDLG.score`` over their final sentences: the squared l2 gradient
    distance over the tensors they match, relative to the update's squared norm), in float64.

    ``bag_ids``: the content tokens the attack restricted itself to (its simulator then also
    matches those rows of the word-embedding gradient, with [CLS]'s and [SEP]'s; a true token
    outside them still moves the other tensors, and its own row is not matched); None: free
    embeddings (the word-embedding gradient not matched). None when the update has no norm."""
    tok = model.tokenizer
    truth_ids, mask, labels = truth_ids.cpu(), mask.cpu(), labels.cpu()   # the simulation runs on the CPU
    real = sorted(set(truth_ids[mask.bool()].tolist()))
    rows = None if bag_ids is None else [tok.cls_id, tok.sep_id, *bag_ids]
    matched = None if rows is None else len(rows)
    if rows is not None:
        rows = rows + [t for t in real if t not in rows]   # the truth's other tokens: simulated, not matched
    sim = TextSimulator(model, update, rows=rows, dtype=torch.float64, device=torch.device("cpu"))
    ids = torch.where(mask.bool(), truth_ids, torch.full_like(truth_ids, tok.sep_id))  # padding: masked
    if rows is None:
        inputs = update.global_weights[model.word_embedding].to("cpu", torch.float64)[ids]
    else:
        index = {t: i for i, t in enumerate(rows)}
        inputs = F.one_hot(ids.clone().apply_(lambda t: index[t]), len(rows)).to(torch.float64)
    got = [g.detach() for g in sim(inputs, mask, labels, create_graph=False)]
    target = list(sim.target)
    if matched is not None:
        got[-1], target[-1] = got[-1][:matched], target[-1][:matched]
    scale = float(sum(float(t.pow(2).sum()) for t in target))
    return float(squared_l2(got, target)) / scale if scale > 0 else None


def matched_tensors(model: TextModel, update: SharedUpdate,
                    recon: "TextReconstruction") -> dict[str, list[int] | None] | None:
    """The shared tensors a text answer's relative distance was measured on (the noise floor is
    computed on the same ones, defenses/floor.py): text DLG, TAG and LAMP match every shared tensor
    but the word-embedding matrix, and of it only the rows of [CLS], [SEP] and the leaked words when
    restricted to the bag (TextSimulator); bow and dager match nothing (None: their verdict reads no
    distance)."""
    if "restricted_to_bag" not in recon.extra:
        return None
    w = model.word_embedding
    out: dict[str, list[int] | None] = {n: None for n in update.gradients if n != w}
    if recon.extra["restricted_to_bag"]:
        tok = model.tokenizer
        out[w] = [tok.cls_id, tok.sep_id, *(t for t in recon.bag.token_ids if t not in tok.special_ids)]
    return out


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels)  # labels: [K] classes or [K, C] probabilities



__all__ = ["TextSimulator", "matched_tensors", "truth_relative_distance"]
