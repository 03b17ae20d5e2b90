"""Text clients: what leaves the device for a private batch of sentences, and its file format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from pydantic import TypeAdapter, ValidationError
from safetensors.torch import save

from ..config import MAX_SEED
from ..errors import ConfigError, ModelMismatchError, NonFiniteError, UpdateFileError
from ..fl.files import (FLOAT_DTYPES, check_meta_bounds, check_update_header, open_safetensors, open_truth,
                        read_tensor, tensor_shape_dtype)
from ..fl.threats import ThreatModel, aggregate
from ..fl.unroll import local_sgd
from ..fl.update import SharedUpdate, UpdateMeta, atomic_write_bytes, is_finite_dict
from ..paths import loads_json, one_line
from .data import TextBatch
from .models import TextModel, build_text_model

TEXT_FORMAT = "gradleak.text-update"
TEXT_TRUTH_FORMAT = "gradleak.text-truth"
FORMAT_VERSION = "1"
TEXT_THREATS = ("fedsgd", "fedavg", "aggregate")


def trainable(model: TextModel) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.module.named_parameters() if p.requires_grad}


def batch_loss(model: TextModel, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
               input_ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of token ids [K, L] with mask [K, L] and labels [K]; the ids are
    embedded with ``params[model.word_embedding]`` (so its gradient is the embedding layer's)."""
    embeds = F.embedding(input_ids, params[model.word_embedding])
    return F.cross_entropy(model.logits(params, buffers, embeds, mask), labels)


def text_meta(model: TextModel, batch_size: int, loss: float, threat: dict) -> UpdateMeta:
    """Public metadata. ``input_shape`` is (max tokens per sentence, 1, 1) for text models; mean
    and std are empty. Sentence lengths are not recorded (the update itself leaks the longest)."""
    return UpdateMeta(model=model.name, num_classes=model.num_classes, input_shape=(model.max_length, 1, 1),
                      mean=(), std=(), batch_size=batch_size, loss=float(loss),
                      model_kwargs={"modality": "text", **model.kwargs}, threat=threat)


def _global(model: TextModel) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    weights = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    params = {n: p.detach().clone() for n, p in trainable(model).items()}
    buffers = {n: b.detach().clone() for n, b in model.module.named_buffers()}
    return weights, params, buffers


def text_fedsgd(model: TextModel, batch: TextBatch) -> SharedUpdate:
    """FedSGD: the gradient of the batch's mean loss w.r.t. every trainable parameter."""
    weights, params, buffers = _global(model)
    live = {n: p.requires_grad_(True) for n, p in params.items()}
    loss = batch_loss(model, live, buffers, batch.input_ids, batch.attention_mask, batch.labels)
    grads = torch.autograd.grad(loss, list(live.values()))
    meta = text_meta(model, batch.size, float(loss.detach()), {"name": "fedsgd"})
    return SharedUpdate(gradients={n: g.detach() for n, g in zip(live, grads, strict=True)}, global_weights=weights,
                        meta=meta)


def text_fedavg(model: TextModel, batch: TextBatch, threat: ThreatModel, *, private_seed: int) -> SharedUpdate:
    """FedAvg: ``threat.local_steps`` SGD steps over mini-batches of ``threat.local_batch_size``
    sentences (order from ``private_seed``, not recorded); shares W_S - W_0."""
    weights, params, buffers = _global(model)

    def loss(live: dict[str, torch.Tensor], input_ids: torch.Tensor, mask: torch.Tensor,
             labels: torch.Tensor) -> torch.Tensor:
        return batch_loss(model, live, buffers, input_ids, mask, labels)
    # McMahan et al. 2017, Algorithm 1 (ClientUpdate), as fl.threats.fedavg: W <- W - eta * grad L(W; b).
    run = local_sgd(params, loss, (batch.input_ids, batch.attention_mask, batch.labels),
                    threat.local_schedule(batch.size, private_seed), threat.local_lr, mode="client")
    meta = text_meta(model, batch.size, run.mean_loss, threat.record(batch.size))
    return SharedUpdate(gradients=run.update(), global_weights=weights, meta=meta)


def per_sentence_gradients(model: TextModel, batch: TextBatch) -> list[dict[str, torch.Tensor]]:
    """One gradient dict per sentence (each sentence alone, trimmed to its own length)."""
    _, params, buffers = _global(model)
    out = []
    for k, n in enumerate(batch.lengths):
        live = {name: p.clone().requires_grad_(True) for name, p in params.items()}
        loss = batch_loss(model, live, buffers, batch.input_ids[k:k + 1, :n], batch.attention_mask[k:k + 1, :n],
                          batch.labels[k:k + 1])
        grads = torch.autograd.grad(loss, list(live.values()))
        out.append({name: g.detach() for name, g in zip(live, grads, strict=True)})
    return out


def text_dpsgd(model: TextModel, batch: TextBatch, defense, generator: torch.Generator) -> SharedUpdate:  # noqa: ANN001
    """DP-SGD (Abadi et al.): per-sentence gradients clipped to L2 norm ``clip`` over all
    parameters, summed, N(0, (noise * clip)^2) added per entry, divided by K; as
    :func:`gradleak.defenses.dpsgd_gradient` does for images."""
    from ..defenses.base import record_defense
    from ..defenses.dpsgd import CLIP_EPS
    from ..defenses.noise import gaussian_like

    base = text_fedsgd(model, batch)
    summed: dict[str, torch.Tensor] | None = None
    for grads in per_sentence_gradients(model, batch):
        norm = torch.stack([g.norm(2) for g in grads.values()]).norm(2)
        factor = min(1.0, float(defense.clip / (norm + CLIP_EPS)))
        clipped = {n: g * factor for n, g in grads.items()}
        summed = clipped if summed is None else {n: summed[n] + clipped[n] for n in summed}
    assert summed is not None
    std = defense.noise * defense.clip
    out = {n: ((s + gaussian_like(s, std, generator).to(s.dtype)) if std > 0 else s) / batch.size
           for n, s in summed.items()}
    return base.replace(gradients=out, meta=record_defense(base.meta, defense.spec))


def split_text_batch(batch: TextBatch, clients: int) -> list[TextBatch]:
    if batch.size % clients:
        raise ConfigError(f"a batch of {batch.size} sentences cannot be split evenly over {clients} clients")
    k = batch.size // clients
    return [TextBatch(sentences=batch.sentences[i * k:(i + 1) * k], input_ids=batch.input_ids[i * k:(i + 1) * k],
                      attention_mask=batch.attention_mask[i * k:(i + 1) * k], labels=batch.labels[i * k:(i + 1) * k],
                      source=batch.source) for i in range(clients)]


def text_share(model: TextModel, batch: TextBatch, threat: ThreatModel, *, defenses: Sequence[str] = (),
               seed: int = 0) -> SharedUpdate:
    """What the server receives for ``batch`` under ``threat``, each client's update defended
    (``defenses``: spec strings) before any aggregation. The clients' private shuffling seed is
    derived from ``seed`` and never recorded."""
    from ..defenses import apply_defenses, parse_defenses, split_defenses

    parsed = parse_defenses(list(defenses)) if defenses else []
    client_side, rest = split_defenses(parsed) if parsed else (None, [])
    if client_side is not None and threat.client_threat != "fedsgd":
        raise ConfigError("dpsgd is applied to FedSGD gradients; use it with --threat fedsgd (or --inner fedsgd)")
    gen = torch.Generator().manual_seed(seed)
    private_seed = seed * 100_003 + 17

    def one_client(b: TextBatch, private: int) -> SharedUpdate:
        if client_side is not None:
            up = text_dpsgd(model, b, client_side, gen)
        elif threat.client_threat == "fedavg":
            up = text_fedavg(model, b, threat, private_seed=private)
        else:
            up = text_fedsgd(model, b)
        if rest:
            up = apply_defenses(up, rest, gen)
        if threat.name != "aggregate":
            up.meta.threat = threat.record(b.size)
        return up

    if threat.name != "aggregate":
        return one_client(batch, private_seed)
    parts = split_text_batch(batch, threat.clients)
    return aggregate([one_client(p, private_seed + 7919 * i) for i, p in enumerate(parts)], threat)


# --------------------------------------------------------------------------- files
def text_update_bytes(update: SharedUpdate) -> bytes:
    """The safetensors bytes of a text update (tensors under grad/ and weights/; metadata JSON)."""
    tensors = {f"grad/{k}": v.detach().cpu().contiguous() for k, v in update.gradients.items()}
    tensors.update({f"weights/{k}": v.detach().cpu().contiguous() for k, v in update.global_weights.items()})
    md = {"format": TEXT_FORMAT, "format_version": FORMAT_VERSION,
          "meta": json.dumps(update.meta.to_dict(), allow_nan=False)}
    return save(tensors, metadata=md)


def text_truth_bytes(batch: TextBatch) -> bytes:
    """The safetensors bytes of the client's true sentences (for later evaluation only)."""
    tensors = {"input_ids": batch.input_ids.contiguous(), "attention_mask": batch.attention_mask.contiguous(),
               "labels": batch.labels.contiguous()}
    md = {"format": TEXT_TRUTH_FORMAT, "sentences": json.dumps(list(batch.sentences)), "source": batch.source}
    return save(tensors, metadata=md)


def save_text_update(update: SharedUpdate, path: str | Path) -> None:
    """Write a text update atomically (tensors under grad/ and weights/; metadata JSON)."""
    atomic_write_bytes(path, text_update_bytes(update))


def save_text_truth(batch: TextBatch, path: str | Path) -> None:
    """Write the client's true sentences (for later evaluation only), atomically."""
    atomic_write_bytes(path, text_truth_bytes(batch))


def _text_meta(f, path: Path) -> UpdateMeta:  # noqa: ANN001
    md = f.metadata() or {}
    fmt = md.get("format")
    if fmt == "gradleak.shared-update":
        raise UpdateFileError(f"{path} is an image update; attack it without --modality text")
    if fmt != TEXT_FORMAT:
        raise UpdateFileError(f"{path} is a safetensors file but not a gradleak text update (format={one_line(repr(fmt), 60)})")
    if md.get("format_version") != FORMAT_VERSION:
        raise UpdateFileError(f"{path}: unsupported text update format version {one_line(repr(md.get('format_version')), 60)}")
    # every JSON failure (syntax, deep nesting, an integer of too many digits) is one line
    raw = loads_json(md.get("meta", ""), f"{path}: metadata", error=UpdateFileError)
    try:
        meta = TypeAdapter(UpdateMeta).validate_python(raw, strict=False)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UpdateFileError(f"{path}: metadata field {'.'.join(str(x) for x in err['loc'])!r}: {err['msg']}") from None
    check_meta_bounds(meta, path, image=False)
    return meta


def load_text_update(path: str | Path) -> tuple[SharedUpdate, TextModel]:
    """Load and validate a text update; rebuild its model with the global weights loaded."""
    p = Path(path)
    with open_safetensors(p, "update") as f:
        meta = _text_meta(f, p)
        kwargs = meta.model_kwargs
        seed = kwargs.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
            shown = f"an integer of {seed.bit_length()} bits" if isinstance(seed, int) and abs(seed) > 10**30 \
                else one_line(repr(seed), 40)
            raise UpdateFileError(f"{p}: metadata model_kwargs.seed {shown} is not an integer in 0..{MAX_SEED}")
        model = build_text_model(meta.model, num_classes=meta.num_classes, seed=seed)
        if tuple(meta.input_shape) != (model.max_length, 1, 1):  # what a truth file's length is checked against
            raise ModelMismatchError(f"{p}: metadata input_shape {list(meta.input_shape)} does not fit model "
                                     f"{model.name} (sentences of at most {model.max_length} tokens: "
                                     f"[{model.max_length}, 1, 1])")
        state = model.module.state_dict()
        params = trainable(model)
        check_update_header(f, p, meta.model, state, params)
        weights = {k: read_tensor(f, f"weights/{k}", p) for k in state}
        grads = {k: read_tensor(f, f"grad/{k}", p) for k in params}
    for what, tensors in (("weights", weights), ("gradient", grads)):
        bad = is_finite_dict(tensors)
        if bad is not None:
            raise NonFiniteError(f"{p}: {what} tensor {bad!r} holds NaN or Inf")
    model.module.load_state_dict({k: v.to(state[k].dtype) for k, v in weights.items()})
    grads = {k: v.to(params[k].dtype) for k, v in grads.items()}
    return SharedUpdate(gradients=grads, global_weights=weights, meta=meta), model


def load_text_truth(path: str | Path, meta: UpdateMeta | None = None, *, vocab_size: int | None = None) -> TextBatch:
    """Load a text truth file; if ``meta`` is given, check that it fits that update (its batch,
    its classes, and sentences no longer than its model's ``input_shape[0]`` tokens, as --text
    sentences are: checked on the header, before any tensor is read); with ``vocab_size`` (the
    update's model's tokenizer), every token id must be one of its ids."""
    with open_truth(path, TEXT_TRUTH_FORMAT, {"input_ids", "attention_mask", "labels"}, kind="text truth",
                    holds="input_ids, attention_mask and labels") as (p, f, md):
        ishape, idt = tensor_shape_dtype(f, "input_ids")
        mshape, mdt = tensor_shape_dtype(f, "attention_mask")
        lshape, ldt = tensor_shape_dtype(f, "labels")
        if (len(ishape) != 2 or mshape != ishape or lshape != (ishape[0],)
                or any(dt in FLOAT_DTYPES or dt == "BOOL" for dt in (idt, mdt, ldt))):
            raise UpdateFileError(f"{p}: input_ids and attention_mask must be [K, L] integers and labels [K]")
        if ishape[0] < 1 or ishape[1] < 1:
            raise UpdateFileError(f"{p}: a text truth file holds at least one sentence of one token")
        if meta is not None and ishape[0] != meta.batch_size:
            raise ModelMismatchError(f"{p}: truth holds {ishape[0]} sentences but the update a batch of {meta.batch_size}")
        if meta is not None and ishape[1] > meta.input_shape[0]:
            raise ModelMismatchError(f"{p}: truth sentences of {ishape[1]} tokens; model {meta.model} takes at most "
                                     f"{meta.input_shape[0]} ([CLS] and [SEP] included)")
        ids, mask, labels = (read_tensor(f, k, p).long() for k in ("input_ids", "attention_mask", "labels"))
        sentences = loads_json(md.get("sentences", "[]"), f"{p}: metadata sentences", error=UpdateFileError)
        if not isinstance(sentences, list):
            raise UpdateFileError(f"{p}: metadata sentences are not a JSON list")
        sentences = tuple(str(s) for s in sentences)
    if len(sentences) != ishape[0]:
        raise UpdateFileError(f"{p}: {len(sentences)} sentences for {ishape[0]} token rows")
    # The ids are decoded by the tokenizer and compared with the attack's: each must be one of
    # the vocabulary's (a negative id overflows the tokenizer), the mask 1s then 0s per sentence.
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or (vocab_size is not None and high >= vocab_size):
        bad = low if low < 0 else high
        where = f"0..{vocab_size - 1}" if vocab_size is not None else "0 or more"
        raise UpdateFileError(f"{p}: truth token id {bad} is outside the vocabulary ({where})")
    if (not bool(((mask == 0) | (mask == 1)).all()) or not bool((mask[:, 1:] <= mask[:, :-1]).all())
            or not bool((mask[:, 0] == 1).all())):
        raise UpdateFileError(f"{p}: truth attention_mask must be 1 for each token ([CLS] first) then 0 for padding")
    if meta is not None and (labels.min() < 0 or labels.max() >= meta.num_classes):
        raise UpdateFileError(f"{p}: truth labels outside 0..{meta.num_classes - 1}")
    return TextBatch(sentences=sentences, input_ids=ids, attention_mask=mask, labels=labels,
                     source=md.get("source", ""))


__all__ = ["TEXT_FORMAT", "TEXT_TRUTH_FORMAT", "batch_loss", "load_text_truth", "load_text_update",
           "per_sentence_gradients", "save_text_truth", "save_text_update", "text_dpsgd", "text_fedavg",
           "text_truth_bytes", "text_update_bytes",
           "text_fedsgd", "text_share"]
