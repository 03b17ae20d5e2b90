"""One text attack run, end to end: sentences -> client (threat model) -> shared update ->
defenses -> attack -> evaluation -> run folder (metrics.json, config.json, history.csv,
reconstruction.json, report.html), written atomically like the image runs.

Routed from ``gradleak attack --modality text`` and ``gradleak share --modality text``; the
config is the same :class:`gradleak.config.AttackConfig` (fields that only make sense for images
are rejected when set).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import AttackConfig
from ..errors import ConfigError, GradleakError
from ..fl.threats import ThreatModel
from ..fl.update import SharedUpdate
from ..paths import StagedDir
from ..runtime import resolve_device
from .attacks import TEXT_ATTACKS, TextAttackSettings, TextReconstruction, run_text_attack
from .client import load_text_truth, load_text_update, save_text_truth, save_text_update, text_share
from .data import TextBatch, read_sentences, text_batch
from .metrics import evaluate_text, pair_sentences, token_accuracy
from .models import DEFAULT_TEXT_MODEL, TextModel, build_text_model

# AttackConfig fields a text run reads; any other field set to a non-default value is an error.
TEXT_FIELDS = frozenset({
    "modality", "attack", "model", "data", "text", "batch_size", "seed", "model_seed", "num_classes", "threat",
    "local_steps", "local_batch_size", "local_lr", "clients", "inner", "defense", "iterations", "lr", "optimizer",
    "dtype", "labels", "update", "truth", "out", "device", "threads", "log_every", "progress",
})
SHARE_TEXT_FIELDS = frozenset({"modality", "model", "data", "text", "batch_size", "seed", "model_seed", "num_classes",
                               "threat", "local_steps", "local_batch_size", "local_lr", "clients", "inner", "defense",
                               "device"})


@dataclass
class TextCase:
    """The attacker's inputs (update, model) and, kept apart, the truth (None when unknown)."""

    update: SharedUpdate
    model: TextModel
    truth: TextBatch | None
    data: str = ""


@dataclass
class TextRunResult:
    run_dir: Path | None
    metrics: dict[str, Any]
    reconstruction: TextReconstruction
    history: list[dict[str, Any]] = field(default_factory=list)


def check_text_config(cfg: AttackConfig, allowed: frozenset[str] = TEXT_FIELDS) -> None:
    """Options that a text run would silently ignore are errors."""
    for name, info in AttackConfig.model_fields.items():
        if name in allowed or name not in cfg.model_fields_set:
            continue
        default = info.get_default(call_default_factory=True)
        if getattr(cfg, name) != default:
            raise ConfigError(f"option --{name.replace('_', '-')} does not apply to --modality text")
    if cfg.attack not in TEXT_ATTACKS:
        raise GradleakError(f"unknown text attack {cfg.attack!r}; known: {', '.join(TEXT_ATTACKS)}")
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


def threat_of(cfg: AttackConfig) -> ThreatModel:
    return ThreatModel(name=cfg.threat, local_steps=cfg.local_steps, local_batch_size=cfg.local_batch_size,
                       local_lr=cfg.local_lr, clients=cfg.clients if cfg.threat == "aggregate" else 1, inner=cfg.inner)


def simulate_text_client(cfg: AttackConfig) -> TextCase:
    """Read the sentences, draw the batch (N clients x --batch-size under ``aggregate``), build
    the global model and compute what the server receives."""
    threat = threat_of(cfg)
    model = build_text_model(text_model_name(cfg), num_classes=cfg.num_classes, seed=cfg.model_seed)
    sentences, source = read_sentences(cfg.text, _data_path(cfg))
    size = cfg.batch_size
    if cfg.text and "batch_size" not in cfg.model_fields_set:
        size = len(sentences) // threat.clients or 1  # --text sentences are the batch unless told otherwise
    batch = text_batch(sentences, model, size * threat.clients, cfg.seed, source=source)
    update = text_share(model, batch, threat, defenses=cfg.defense, seed=cfg.seed)
    return TextCase(update=update, model=model, truth=batch, data=source)


def load_text_case(cfg: AttackConfig) -> TextCase:
    assert cfg.update is not None
    update, model = load_text_update(cfg.update)
    truth = load_text_truth(cfg.truth, update.meta) if cfg.truth else None
    if cfg.defense:
        from ..defenses import apply_defenses, parse_defenses

        update = apply_defenses(update, parse_defenses(cfg.defense), torch.Generator().manual_seed(cfg.seed))
    return TextCase(update=update, model=model, truth=truth, data=truth.source if truth is not None else "")


def text_settings(cfg: AttackConfig, device: torch.device) -> TextAttackSettings:
    return TextAttackSettings(iterations=cfg.iterations, lr=cfg.lr, optimizer=cfg.optimizer, dtype=cfg.dtype,
                              seed=cfg.seed, device=str(device), log_every=cfg.log_every, progress=cfg.progress,
                              labels=cfg.labels)


class TokenAccuracyObserver:
    """Scores the attack's current tokens against the truth it holds (the attack never sees it)."""

    def __init__(self, truth: TextBatch, special: frozenset[int]):
        self.truth = [[i for i in s if i not in special] for s in truth.token_ids()]
        self.special = special
        self.points: dict[int, float] = {}

    def __call__(self, iteration: int, token_ids: list[list[int]]) -> None:
        rec = [[i for i in s if i not in self.special] for s in token_ids]
        perm = pair_sentences(self.truth, rec)
        self.points[iteration] = token_accuracy(self.truth, [rec[j] for j in perm])


def _default_out(attack: str) -> Path:
    import time

    base = Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-text-{attack}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def run_text(cfg: AttackConfig, *, write: bool = True) -> TextRunResult:
    """Run one text attack as configured; write the run folder (atomically) unless ``write`` is False."""
    check_text_config(cfg)
    device = resolve_device(cfg.device)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(cfg.out) if cfg.out else _default_out(cfg.attack)
    stage = StagedDir(out) if write else None  # the output is checked and staged before the attack
    try:
        case = load_text_case(cfg) if cfg.update else simulate_text_client(cfg)
        tok = case.model.tokenizer
        observer = TokenAccuracyObserver(case.truth, tok.special_ids) if case.truth is not None else None
        recon = run_text_attack(cfg.attack, case.update, case.model, text_settings(cfg, device), observer)
        metrics = build_text_metrics(cfg, case, recon, device)
        history = [dict(h) for h in recon.history]
        if observer is not None:
            for h in history:
                if int(h["iteration"]) in observer.points:
                    h["token_accuracy"] = observer.points[int(h["iteration"])]
        result = TextRunResult(run_dir=None, metrics=metrics, reconstruction=recon, history=history)
        if write:
            resolved = cfg.model_copy(update={
                "out": str(out), "model": case.model.name, "batch_size": case.update.meta.batch_size
                // (cfg.clients if cfg.threat == "aggregate" else 1),
                **{k: v for k, v in recon.extra.get("resolved", {}).items()
                   if k in TEXT_FIELDS and getattr(cfg, k) is None}})
            result.run_dir = write_text_run_dir(out, resolved, metrics, history, recon, case, stage=stage)
    except BaseException:
        if stage is not None:
            stage.discard()
        raise
    return result


def build_text_metrics(cfg: AttackConfig, case: TextCase, recon: TextReconstruction, device: torch.device) -> dict[str, Any]:
    from ..runner import versions

    meta = case.update.meta
    tok = case.model.tokenizer
    bag = recon.bag
    metrics: dict[str, Any] = {
        "modality": "text", "attack": cfg.attack, "model": meta.model, "data": case.data or "text",
        "batch_size": meta.batch_size, "iterations": recon.iterations, "wall_seconds": round(recon.wall_seconds, 3),
        "token_accuracy": None, "token_set_precision": None, "token_set_recall": None, "bleu": None,
        "rouge1": None, "rouge2": None, "rougeL": None, "label_accuracy": None, "per_sentence": [],
        "recovered_sentences": [tok.decode(s) for s in recon.token_ids],
        "labels_restored": recon.labels.tolist(), "label_method": recon.label_method,
        "bag_of_words": {"size": len(bag.token_ids), "exact": bag.exact, "length": bag.length,
                         "tokens": tok.tokens(bag.token_ids), "token_ids": bag.token_ids},
        "threat": meta.threat, "defenses": list(meta.defenses), "seed": cfg.seed, "update": meta.to_dict(),
    }
    metrics.update({k: v for k, v in recon.extra.items() if isinstance(v, (int, float, str, bool, type(None)))})
    metrics["settings"] = recon.extra.get("resolved", {})
    if case.truth is not None:
        truth = case.truth
        token_set = set(bag.token_ids) if cfg.attack == "bow" else None
        ev = evaluate_text(truth.token_ids(), truth.labels.tolist(), recon.token_ids, recon.labels.tolist(), tok,
                           sentences=truth.sentences, token_set=token_set)
        metrics.update(ev.to_dict())
        bow_p, bow_r = _bag_scores(truth, bag.token_ids, tok.special_ids)
        metrics["bow_precision"], metrics["bow_recall"] = bow_p, bow_r
        if "dlg_token_ids" in recon.extra:
            before = evaluate_text(truth.token_ids(), truth.labels.tolist(), recon.extra["dlg_token_ids"],
                                   recon.labels.tolist(), tok)
            metrics["token_accuracy_dlg"] = before.token_accuracy
        if cfg.attack == "bow":  # no order: position-wise scores are not what it claims
            for k in ("token_accuracy", "bleu", "rouge2", "rougeL"):
                metrics[k] = None
    metrics["versions"] = versions(device)
    return metrics


def _bag_scores(truth: TextBatch, bag: list[int], special: frozenset[int]) -> tuple[float, float]:
    from .metrics import token_set_scores

    t = [[i for i in s if i not in special] for s in truth.token_ids()]
    return token_set_scores(t, {i for i in bag if i not in special})


def _history_csv(history: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["iteration", "loss", "phase", "token_accuracy"])
    for h in history:
        acc = h.get("token_accuracy")
        w.writerow([int(h["iteration"]), repr(float(h["loss"])), h.get("phase", ""), "" if acc is None else f"{acc:.4f}"])
    return buf.getvalue()


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


def write_text_run_dir(out: Path, cfg: AttackConfig, metrics: dict[str, Any], history: list[dict[str, Any]],
                       recon: TextReconstruction, case: TextCase, *, stage: StagedDir | None = None) -> Path:
    """Write every file into a hidden staging folder (made up front by the caller, or here),
    then rename it into place."""
    from .report import render_text_report

    stage = stage if stage is not None else StagedDir(out)
    tmp = stage.path
    try:
        tok = case.model.tokenizer
        (tmp / "config.json").write_text(json.dumps(cfg.model_dump(mode="json"), indent=2) + "\n")
        (tmp / "history.csv").write_text(_history_csv(history))
        (tmp / "reconstruction.json").write_text(json.dumps(_jsonable({
            "sentences": [tok.decode(s) for s in recon.token_ids], "token_ids": recon.token_ids,
            "tokens": [tok.tokens(s) for s in recon.token_ids], "labels": recon.labels.tolist(),
            "bag_of_words": recon.bag.token_ids}), indent=2, ensure_ascii=False) + "\n")
        (tmp / "metrics.json").write_text(json.dumps(_jsonable(metrics), indent=2, ensure_ascii=False) + "\n")
        render_text_report(tmp)
        return stage.commit()
    except BaseException:
        stage.discard()
        raise


def share_text(cfg: AttackConfig, out: Path, truth_path: Path | None) -> str:
    """``gradleak share --modality text``: write the update (and truth) files; returns a summary line."""
    check_text_config(cfg, SHARE_TEXT_FIELDS)
    case = simulate_text_client(cfg)
    save_text_update(case.update, out)
    if truth_path is not None and case.truth is not None:
        save_text_truth(case.truth, truth_path)
    meta = case.update.meta
    return (f"wrote {out}: {meta.threat.get('name')} text update of model {meta.model}, batch {meta.batch_size}, "
            f"loss {meta.loss:.4f}" + (f", defenses {', '.join(meta.defenses)}" if meta.defenses else "")
            + (f"; truth in {truth_path}" if truth_path else ""))


def print_text_summary(metrics: dict[str, Any], run_dir: Path | None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{metrics['attack']} on {metrics['model']} (text, batch {metrics['batch_size']})")
    table.add_column("metric")
    table.add_column("value")
    for key in ("token_accuracy", "token_set_precision", "token_set_recall", "bleu", "rouge1", "rougeL",
                "label_accuracy", "gradient_distance", "iterations", "wall_seconds"):
        if key in metrics:
            v = metrics[key]
            if v is None:
                text = "n/a"
            elif isinstance(v, float):
                text = f"{v:.3e}" if v != 0 and abs(v) < 1e-2 else f"{v:.3f}"
            else:
                text = str(v)
            table.add_row(key, text)
    console = Console()
    console.print(table)
    rows = metrics.get("per_sentence") or []
    for r in rows:
        console.print(f"  original : {r['original']}", markup=False, highlight=False)
        console.print(f"  recovered: {r['recovered']}", markup=False, highlight=False)
    if not rows:
        for s in metrics.get("recovered_sentences", []):
            console.print(f"  recovered: {s}", markup=False, highlight=False)
    if run_dir is not None:
        console.print(f"run folder: {run_dir}  (report.html, metrics.json, reconstruction.json)")


__all__ = ["TextCase", "TextRunResult", "build_text_metrics", "check_text_config", "load_text_case",
           "print_text_summary", "run_text", "share_text", "simulate_text_client", "write_text_run_dir"]
