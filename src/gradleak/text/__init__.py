"""Token-level leakage: rebuild a client's sentences from the gradients of a language model."""

from ..catalog import TEXT_ATTACKS
from .configs import TEXT_ATTACK_CONFIGS, run_text_attack, text_attack_names, text_config_class
from .leak import BagOfWords, TextReconstruction, bag_of_words
from .client import text_share
from .data import TextBatch, read_sentences, text_batch
from .metrics import evaluate_text
from .models import (TEXT_MODELS, TextModel, build_text_model, describe_text_models, register_text_model,
                     text_model_names)

__all__ = ["BagOfWords", "TEXT_ATTACKS", "TEXT_ATTACK_CONFIGS", "TEXT_MODELS", "TextBatch", "TextModel",
           "TextReconstruction", "bag_of_words", "build_text_model", "describe_text_models", "evaluate_text",
           "read_sentences", "register_text_model", "run_text_attack", "text_attack_names", "text_batch", "text_config_class", "text_model_names", "text_share"]
