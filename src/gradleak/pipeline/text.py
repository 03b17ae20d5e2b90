"""The text modality: sentences -> client (threat model) -> shared update -> defenses, or a text
update file; judged by token accuracy, token-set precision/recall, BLEU and ROUGE after pairing
the sentences, and the restored labels. Fields that only make sense for images are refused."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from ..config import AttackConfig
from ..errors import ConfigError
from ..modalities import TEXT
from ..fl.files import load_truth, load_update, truth_bytes, update_bytes
from ..text.client import text_share
from ..text.configs import TEXT_FLAT_FIELDS, resolve_text_attack
from ..text.data import TextBatch, read_sentences, text_batch
from ..text.simulate import matched_tensors, truth_relative_distance
from ..text.metrics import evaluate_text, pair_sentences, token_accuracy, token_set_scores
from ..text.models import DEFAULT_TEXT_MODEL, build_text_model
from .case import Case, Observer, defended_file_update, file_values, modality, threat_model
from .record import jsonable, versions

# The text modality's declaration (modalities.py reads it without importing this module; see
# modalities.Modality for the keys): share, report and summary_lines name functions of this module.
# Its default attack is DLG (text/attacks/dlg.py); "auto" is text's own chooser (text/attacks/auto.py).
MODALITY_SPEC = {
    "name": "text", "summary": "sentences: token accuracy, BLEU and ROUGE against the truth",
    "share": "share_text_client", "report": "render_text_report", "attack_kind": "text attack",
    "model_kind": "text model", "own_fields": ["text"],
    "refuses": [[["server"], "--server applies to image models (the imprint block reads images)"],
                [["local_epochs", "local_optimizer", "local_momentum", "local_nesterov", "local_weight_decay",
                  "local_betas", "local_eps", "local_augment", "local_crop_padding"],
                 "--local-epochs, --local-optimizer and their constants, and --local-augment apply to the image "
                 "modality (the text client trains with plain SGD over --local-steps)"]],
    "default_attack": "dlg", "run_prefix": "text-", "files": "reconstruction.json",
    "summary_keys": ["token_accuracy", "token_set_precision", "token_set_recall", "bleu", "rouge1", "rougeL",
                     "label_accuracy", "gradient_distance", "iterations", "wall_seconds"],
    "data_label": "text", "summary_lines": "sentence_lines", "verdict_family": "text", "measures": "tokens",
    "update_format": "gradleak.text-update",
    "nothing": "recovered no text", "portfolio_keys": ["rouge1", "rougeL", "token_accuracy", "exact_sentences"],
}


def render_text_report(folder: Path) -> Path:
    """report.html of a text run folder (the renderer imported only when a report is written)."""
    from ..text.report import render_text_report as render

    return render(folder)


def sentence_lines(metrics: dict[str, Any]) -> list[str]:
    """A text run's sentences under its summary: each original beside what came back."""
    sentences = metrics.get("per_sentence") or []
    lines = []
    for r in sentences:
        lines += [f"  original : {r['original']}", f"  recovered: {r['recovered']}"]
    if not sentences:
        lines += [f"  recovered: {sentence}" for sentence in metrics.get("recovered_sentences", [])]
    return lines

# AttackConfig fields a text run reads; any other field set to a non-default value is an error.
# The attack's own constants (TEXT_FLAT_FIELDS) are checked against the chosen attack when it is
# resolved (text/configs.py).
TEXT_FIELDS = frozenset({
    "modality", "attack", "model", "data", "text", "batch_size", "seed", "model_seed", "num_classes", "threat",
    "local_steps", "local_batch_size", "local_lr", "clients", "inner", "defense", "update", "truth", "out", "device",
    "threads", "log_every", "progress", "checkpoint_every", "divergence_retries", *TEXT_FLAT_FIELDS,
})
SHARE_TEXT_FIELDS = frozenset({"modality", "model", "data", "text", "batch_size", "seed", "model_seed", "num_classes",
                               "threat", "local_steps", "local_batch_size", "local_lr", "clients", "inner", "defense",
                               "device"})


def check_text_config(cfg: AttackConfig, allowed: frozenset[str] = TEXT_FIELDS) -> None:
    """Options that a text run would silently ignore are errors."""
    for name, info in AttackConfig.model_fields.items():
        if name in allowed or name not in cfg.model_fields_set:
            continue
        default = info.get_default(call_default_factory=True)
        if getattr(cfg, name) != default:
            raise ConfigError(f"option --{name.replace('_', '-')} does not apply to --modality text")
    if cfg.truth and not cfg.update:
        raise ConfigError("--truth needs --update (a truth file belongs to an update file)")
    if cfg.update and (cfg.text or _data_path(cfg)):
        raise ConfigError("--update attacks a file: do not give --text or --data with it")


def _data_path(cfg: AttackConfig) -> str | None:
    """--data for text is a .txt file; the image default (a source name) means "not given"."""
    if "data" not in cfg.model_fields_set or cfg.data == AttackConfig.model_fields["data"].default:
        return None
    return cfg.data


def text_model_name(cfg: AttackConfig) -> str:
    if "model" not in cfg.model_fields_set or cfg.model == AttackConfig.model_fields["model"].default:
        return DEFAULT_TEXT_MODEL
    return cfg.model


def simulate_text_client(cfg: AttackConfig) -> "TextCase":
    """Read the sentences, draw the batch (N clients x --batch-size under ``aggregate``), build
    the global model and compute what the server receives."""
    threat = threat_model(cfg)
    model = build_text_model(text_model_name(cfg), num_classes=cfg.num_classes, seed=cfg.model_seed)
    sentences, source = read_sentences(cfg.text, _data_path(cfg))
    size = cfg.batch_size
    if cfg.text and "batch_size" not in cfg.model_fields_set:
        size = len(sentences) // threat.clients or 1  # --text sentences are the batch unless told otherwise
    batch = text_batch(sentences, model, size * threat.clients, cfg.seed, source=source)
    update = text_share(model, batch, threat, defenses=cfg.defense, seed=cfg.seed)
    return TextCase(update=update, model=model, truth=batch, data=source)


# With --update the text file decides these (case.file_values); the client's own choices may not be given.
TEXT_UPDATE_DECIDES = ("model", "batch_size", "num_classes", "threat", "local_steps", "local_batch_size", "local_lr",
                       "clients", "inner")
TEXT_CLIENT_ONLY = ("model_seed",)


def text_file_values(cfg: AttackConfig, meta: Any) -> dict[str, Any]:
    values = file_values(cfg, meta, TEXT_UPDATE_DECIDES, TEXT_CLIENT_ONLY)
    return {k: values[k] for k in TEXT_UPDATE_DECIDES}


def load_text_case(cfg: AttackConfig) -> "TextCase":
    assert cfg.update is not None
    update, model = load_update(cfg.update, modality="text")
    text_file_values(cfg, update.meta)
    truth = load_truth(cfg.truth, update.meta, model=model) if cfg.truth else None
    return TextCase(update=defended_file_update(cfg, update), model=model, truth=truth,
                    data=truth.source if truth is not None else "")


@modality("text")
def build_text_case(cfg: AttackConfig) -> "TextCase":
    check_text_config(cfg)
    return load_text_case(cfg) if cfg.update else simulate_text_client(cfg)


class TokenAccuracyObserver(Observer):
    """Token accuracy (sentences paired) of the attack's current tokens against the truth."""

    def __init__(self, truth: TextBatch, special: frozenset[int]):
        super().__init__()
        self.truth = [[i for i in s if i not in special] for s in truth.token_ids()]
        self.special = special

    def __call__(self, iteration: int, token_ids: list[list[int]]) -> None:
        rec = [[i for i in s if i not in self.special] for s in token_ids]
        perm = pair_sentences(self.truth, rec)
        self.points[iteration] = token_accuracy(self.truth, [rec[j] for j in perm])


@dataclass
class TextCase(Case):
    history_columns: ClassVar[tuple[str, ...]] = ("phase", "token_accuracy")
    kind: ClassVar[str] = "text update"
    spec = TEXT

    def attack_config(self, cfg: AttackConfig) -> Any:
        if cfg.attack == "bow":  # read off the update: nothing is observed, checkpointed or recovered
            for name in ("log_every", "checkpoint_every", "divergence_retries"):
                if getattr(cfg, name) != AttackConfig.model_fields[name].default:
                    raise ConfigError(f"--{name.replace('_', '-')} does not apply to text attack 'bow' "
                                      f"(it optimises nothing)")
        return resolve_text_attack(cfg.model_dump(), self.model, int(self.update.meta.batch_size))

    def observer(self) -> TokenAccuracyObserver | None:
        return TokenAccuracyObserver(self.truth, self.model.tokenizer.special_ids) if self.truth is not None else None

    def recorded_config(self, cfg: AttackConfig) -> dict[str, Any]:
        if cfg.update:
            return text_file_values(cfg, self.update.meta)
        clients = cfg.clients if cfg.threat == "aggregate" else 1
        return {"model": self.model.name, "batch_size": self.update.meta.batch_size // clients}

    def metrics(self, cfg: AttackConfig, recon: Any, device: torch.device) -> dict[str, Any]:
        meta = self.update.meta
        tok = self.model.tokenizer
        bag = recon.bag
        metrics: dict[str, Any] = {
            "modality": "text", "attack": cfg.attack, "model": meta.model, "data": self.data or "text",
            "batch_size": meta.batch_size, "iterations": recon.iterations, "wall_seconds": round(recon.wall_seconds, 3),
            "token_accuracy": None, "token_set_precision": None, "token_set_recall": None, "bleu": None,
            "rouge1": None, "rouge2": None, "rougeL": None, "exact_sentences": None, "label_accuracy": None,
            "per_sentence": [],
            "recovered_sentences": [tok.decode(s) for s in recon.token_ids],
            "labels_restored": recon.labels.tolist(), "label_method": recon.label_method,
            "bag_of_words": {"size": len(bag.token_ids), "exact": bag.exact, "length": bag.length,
                             "tokens": tok.tokens(bag.token_ids), "token_ids": bag.token_ids},
            "threat": meta.threat, "defenses": list(meta.defenses), "seed": cfg.seed, "update": meta.to_dict(),
        }
        if self.truth is not None:
            truth = self.truth
            token_set = set(bag.token_ids) if cfg.attack == "bow" else None
            ev = evaluate_text(truth.token_ids(), truth.labels.tolist(), recon.token_ids, recon.labels.tolist(), tok,
                               sentences=truth.sentences, token_set=token_set)
            metrics.update(ev.to_dict())
            special = tok.special_ids
            t = [[i for i in s if i not in special] for s in truth.token_ids()]
            metrics["bow_precision"], metrics["bow_recall"] = token_set_scores(
                t, {i for i in bag.token_ids if i not in special})
            if "dlg_token_ids" in recon.extra:
                before = evaluate_text(truth.token_ids(), truth.labels.tolist(), recon.extra["dlg_token_ids"],
                                       recon.labels.tolist(), tok)
                metrics["token_accuracy_dlg"] = before.token_accuracy
            if cfg.attack == "bow":  # no order: position-wise scores are not what it claims
                for k in ("token_accuracy", "bleu", "rouge2", "rougeL", "exact_sentences"):
                    metrics[k] = None
            elif "restricted_to_bag" in recon.extra:
                # How well the true sentences explain the (defended) update, on the attack's own
                # measure: an answer that fits worse is an optimisation failure (outcome.py)
                bag_ids = [t for t in bag.token_ids if t not in special] if recon.extra["restricted_to_bag"] else None
                metrics["truth_relative_distance"] = truth_relative_distance(
                    self.model, self.update, truth.input_ids, truth.attention_mask, truth.labels, bag_ids)
        metrics["versions"] = versions(device)
        return metrics

    def matched(self, recon: Any) -> dict[str, list[int] | None] | None:
        """The shared tensors the text attack's distance is measured on (text.simulate.matched_tensors)."""
        return matched_tensors(self.model, self.update, recon)

    def write_files(self, folder: Path, recon: Any) -> None:
        tok = self.model.tokenizer
        (folder / "reconstruction.json").write_text(json.dumps(jsonable({
            "sentences": [tok.decode(s) for s in recon.token_ids], "token_ids": recon.token_ids,
            "tokens": [tok.tokens(s) for s in recon.token_ids], "labels": recon.labels.tolist(),
            "bag_of_words": recon.bag.token_ids}), indent=2, ensure_ascii=False) + "\n")

    def file_bytes(self) -> tuple[bytes, bytes | None]:
        return update_bytes(self.update, modality="text"), truth_bytes(self.truth) if self.truth is not None else None


def share_text_client(cfg: AttackConfig) -> "TextCase":
    """``gradleak share --modality text``: the simulated client (only the client's flags apply)."""
    check_text_config(cfg, SHARE_TEXT_FIELDS)
    return simulate_text_client(cfg)


__all__ = ["SHARE_TEXT_FIELDS", "TEXT_FIELDS", "TextCase", "TokenAccuracyObserver", "build_text_case",
           "check_text_config", "load_text_case", "share_text_client", "simulate_text_client"]
