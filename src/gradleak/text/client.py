"""Text clients: what leaves the device for a private batch of sentences, and the text hooks of
the update-file API (gradleak.fl.files reads and writes the files of every modality)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from ..config import MAX_SEED
from ..errors import ConfigError, ModelMismatchError, UpdateFileError
from ..fl.files import (FLOAT_DTYPES, UpdateFiles, check_meta_bounds, read_tensor, register_update_files,
                        tensor_shape_dtype)
from ..fl.threats import ThreatModel, aggregate
from ..fl.unroll import local_sgd
from ..fl.update import SharedUpdate, UpdateMeta
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
# A text update or truth file is read and written by gradleak.fl.files (save_update, load_update,
# save_truth, load_truth), the same calls as an image one's; these are the text modality's hooks.
def _check_text_meta(meta: UpdateMeta, path: Path) -> None:
    check_meta_bounds(meta, path, image=False)


def _text_model(f, p: Path, meta: UpdateMeta, user_model: str | None) -> tuple[TextModel, torch.nn.Module]:  # noqa: ANN001
    """The text update's model, from its name, classes and ``model_kwargs.seed``; its positions
    must be the metadata's ``input_shape`` (what a truth file's length is checked against)."""
    seed = meta.model_kwargs.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        shown = f"an integer of {seed.bit_length()} bits" if isinstance(seed, int) and abs(seed) > 10**30 \
            else one_line(repr(seed), 40)
        raise UpdateFileError(f"{p}: metadata model_kwargs.seed {shown} is not an integer in 0..{MAX_SEED}")
    model = build_text_model(meta.model, num_classes=meta.num_classes, seed=seed)
    if tuple(meta.input_shape) != (model.max_length, 1, 1):
        raise ModelMismatchError(f"{p}: metadata input_shape {list(meta.input_shape)} does not fit model "
                                 f"{model.name} (sentences of at most {model.max_length} tokens: "
                                 f"[{model.max_length}, 1, 1])")
    return model, model.module


def _text_truth_record(batch: TextBatch) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    tensors = {"input_ids": batch.input_ids.contiguous(), "attention_mask": batch.attention_mask.contiguous(),
               "labels": batch.labels.contiguous()}
    return tensors, {"sentences": json.dumps(list(batch.sentences)), "source": batch.source}


def _read_text_truth(p: Path, f, md: dict[str, str], meta: UpdateMeta | None,  # noqa: ANN001
                     model: TextModel | None) -> TextBatch:
    """A text truth; with ``meta``, fitting that update (its batch, its classes, and sentences no
    longer than its model's ``input_shape[0]`` tokens, as --text sentences are: checked on the
    header, before any tensor is read); with ``model`` (the update's), every token id one of its
    tokenizer's."""
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
    _check_token_rows(p, ids, mask, model.tokenizer.vocab_size if model is not None else None)
    if meta is not None and (labels.min() < 0 or labels.max() >= meta.num_classes):
        raise UpdateFileError(f"{p}: truth labels outside 0..{meta.num_classes - 1}")
    return TextBatch(sentences=sentences, input_ids=ids, attention_mask=mask, labels=labels,
                     source=md.get("source", ""))


def _check_token_rows(p: Path, ids: torch.Tensor, mask: torch.Tensor, vocab_size: int | None) -> None:
    """The ids are decoded by the tokenizer and compared with the attack's: each must be one of
    the vocabulary's (a negative id overflows the tokenizer), the mask 1s then 0s per sentence."""
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or (vocab_size is not None and high >= vocab_size):
        bad = low if low < 0 else high
        where = f"0..{vocab_size - 1}" if vocab_size is not None else "0 or more"
        raise UpdateFileError(f"{p}: truth token id {bad} is outside the vocabulary ({where})")
    if (not bool(((mask == 0) | (mask == 1)).all()) or not bool((mask[:, 1:] <= mask[:, :-1]).all())
            or not bool((mask[:, 0] == 1).all())):
        raise UpdateFileError(f"{p}: truth attention_mask must be 1 for each token ([CLS] first) then 0 for padding")


#: The text modality's update and truth files (registered with gradleak.fl.files on import).
TEXT_FILES = register_update_files(UpdateFiles(
    modality="text", update_format=TEXT_FORMAT, truth_format=TEXT_TRUTH_FORMAT, update_name="text update",
    version_name="text update", check_meta=_check_text_meta, build_model=_text_model, format_version=FORMAT_VERSION,
    batch_type=TextBatch, truth_record=_text_truth_record, truth_kind="text truth",
    truth_keys=("input_ids", "attention_mask", "labels"), truth_holds="input_ids, attention_mask and labels",
    read_truth=_read_text_truth))


__all__ = ["TEXT_FILES", "TEXT_FORMAT", "TEXT_TRUTH_FORMAT", "batch_loss", "per_sentence_gradients", "text_dpsgd",
           "text_fedavg", "text_fedsgd", "text_share"]
