"""What each modality (``--modality NAME``) declares, importable without torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import UnknownNameError


def _no_lines(metrics: Mapping[str, Any]) -> list[str]:
    return []


@dataclass(frozen=True, eq=False)
class Modality:
    """One modality's declaration (see the module's notes in docs/).

    plugin:         the module whose import registers its case builder (``pipeline.case.modality``).
    share, report:  ``module:function`` of ``gradleak share``'s client (config -> Case) and of the
                    renderer of a run folder's report.html (folder -> path).
    attack_kind, model_kind: the catalog kinds (catalog.KINDS) its --attack and --model names are.
    model_extra:    what --model may be besides a name (said in the unknown-name error).
    data_sources:   --data may name a data source (catalog.SOURCES); else --data is its own file.
    own_fields:     config fields only it reads: given with another modality, an error.
    refuses:        config fields it cannot honour, with the error for a value other than the default.
    default_attack: its attack when --attack is not given (None: the config's default).
    run_prefix:     the default run folder's name is this + the attack.
    files:          its answer's file in the run folder (named in the console's last line).
    summary_keys:   metrics.json keys of the console summary, in order.
    no_value:       how the summary shows a key without a value.
    data_label:     the summary title's data (None: metrics.json's ``data``).
    summary_lines:  its own lines under the summary (metrics -> lines).
    verdict_family: the convergence line (attacks/verdict.py) all its attacks are held to (None:
                    each attack's own).
    measures:       what its answers are scored in against the truth: "images" (PSNR, SSIM, images
                    identified) or "tokens" (token accuracy, sentences rebuilt); outcome.py's rules.
    nothing:        how a verdict says that nothing leaked.
    portfolio_keys: metrics.json keys recorded for each answer of ``auto``'s portfolio (with the truth).
    """

    name: str
    plugin: str
    share: str
    report: str
    attack_kind: str
    model_kind: str
    files: str
    summary_keys: tuple[str, ...]
    measures: str
    nothing: str
    model_extra: str = ""
    data_sources: bool = False
    own_fields: tuple[str, ...] = ()
    refuses: Mapping[str, str] = field(default_factory=dict)
    default_attack: str | None = None
    run_prefix: str = ""
    no_value: str = "n/a"
    data_label: str | None = None
    summary_lines: Callable[[Mapping[str, Any]], list[str]] = _no_lines
    verdict_family: str | None = None
    portfolio_keys: tuple[str, ...] = ("psnr_mean", "ssim_mean")

    def check_names(self, *, attack: str | None = None, model: str | None = None) -> None:
        """Unknown --attack / --model names, with a "did you mean" (catalog.py, no torch). A
        ``package.module:callable`` model is left to the model builder."""
        from .catalog import check

        if attack is not None:
            check(self.attack_kind, attack)
        if model is not None and ":" not in model:
            check(self.model_kind, model, self.model_extra)

    def check_config(self, cfg: Any) -> None:
        """ValueError for a config field this modality would ignore: one that only another
        modality reads, or one it refuses (``cfg`` is a config.AttackConfig)."""
        for other in MODALITIES.values():
            for name in other.own_fields if other is not self else ():
                if getattr(cfg, name):
                    raise ValueError(f"--{name.replace('_', '-')} needs --modality {other.name}")
        _check_case_flags(self.name, cfg)
        for name, why in self.refuses.items():
            if getattr(cfg, name) != type(cfg).model_fields[name].get_default(call_default_factory=True):
                raise ValueError(why)

    def share_client(self, cfg: Any) -> Any:
        """``gradleak share``'s case: the simulated client ``cfg`` describes (imports torch)."""
        return _load(self.share)(cfg)

    def render_report(self, folder: Path) -> Path:
        """report.html of a run folder of this modality; returns its path (imports the renderer)."""
        return _load(self.report)(folder)


def _check_case_flags(modality: str, cfg: Any) -> None:
    """ValueError for a flag that fills in a run's case (specs.flag_cases: GradInversion's --preset
    imagenet) of another modality's attacks, given to ``modality``: its case would not be this one's."""
    from .specs import COMMON_BY_MODALITY, attack_specs, flag_cases

    for other in (m for m in COMMON_BY_MODALITY if m != modality):
        for flag in flag_cases(other):
            if getattr(cfg, flag) != type(cfg).model_fields[flag].get_default(call_default_factory=True):
                names = " and ".join(s.name for s in attack_specs(other).values() if flag in s.cases)
                raise ValueError(f"--{flag.replace('_', '-')} applies to {names}, {'an' if other[0] in 'aeiou' else 'a'} "
                                 f"{other} attack")


def _load(ref: str) -> Callable[..., Any]:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def _sentence_lines(metrics: Mapping[str, Any]) -> list[str]:
    """A text run's sentences under its summary: each original beside what came back."""
    sentences = metrics.get("per_sentence") or []
    lines = []
    for r in sentences:
        lines += [f"  original : {r['original']}", f"  recovered: {r['recovered']}"]
    if not sentences:
        lines += [f"  recovered: {sentence}" for sentence in metrics.get("recovered_sentences", [])]
    return lines


IMAGE = Modality(
    name="image", plugin="gradleak.pipeline.image", share="gradleak.pipeline.image:simulate_client",
    report="gradleak.report:render_report", attack_kind="attack", model_kind="model",
    model_extra=" or package.module:callable", data_sources=True, files="reconstruction.png",
    summary_keys=("psnr_mean", "zero_psnr_mean", "above_zero_image", "ssim_mean", "mse_mean", "label_accuracy",
                  "fft2d_mean", "rpsnr_mean", "lpips_mean",
                  "iip", "gradient_distance", "iterations", "wall_seconds"),
    no_value="n/a (no ground truth)", measures="images", nothing="rebuilt nothing recognisable")

TEXT = Modality(
    name="text", plugin="gradleak.pipeline.text", share="gradleak.pipeline.text:share_text_client",
    report="gradleak.text.report:render_text_report", attack_kind="text attack", model_kind="text model",
    own_fields=("text",), refuses={"server": "--server applies to image models (the imprint block reads images)",
                                  **dict.fromkeys(("local_epochs", "local_optimizer", "local_momentum", "local_nesterov",
                                                   "local_weight_decay", "local_betas", "local_eps", "local_augment",
                                                   "local_crop_padding"),
                                                  "--local-epochs, --local-optimizer and their constants, and "
                                                  "--local-augment apply to the image modality (the text client "
                                                  "trains with plain SGD over --local-steps)")},
    # a text run's default attack is DLG (text/attacks/dlg.py); "auto" is text's own chooser (text/attacks/auto.py)
    default_attack="dlg", run_prefix="text-", files="reconstruction.json",
    summary_keys=("token_accuracy", "token_set_precision", "token_set_recall", "bleu", "rouge1", "rougeL",
                  "label_accuracy", "gradient_distance", "iterations", "wall_seconds"),
    data_label="text", summary_lines=_sentence_lines, verdict_family="text", measures="tokens",
    nothing="recovered no text", portfolio_keys=("rouge1", "rougeL", "token_accuracy", "exact_sentences"))

#: The declared modalities by name; the first is what a record that names none is (image runs'
#: metrics.json has no "modality").
MODALITIES: dict[str, Modality] = {m.name: m for m in (IMAGE, TEXT)}


def register_modality(modality: Modality) -> Modality:
    """Declare a modality (its plug-in module registers its case builder under the same name)."""
    MODALITIES[modality.name] = modality
    return modality


def modality_named(name: str) -> Modality:
    """The declared modality ``name`` (UnknownNameError naming the known ones)."""
    try:
        return MODALITIES[name]
    except (KeyError, TypeError):
        raise UnknownNameError(f"unknown modality {name!r}; known: {', '.join(sorted(MODALITIES))}") from None


def recorded_modality(name: object) -> Modality:
    """The modality a record names (metrics.json's ``modality``, an Evidence's): the default
    (image, whose runs record none) for a name no modality declares."""
    found = MODALITIES.get(name) if isinstance(name, str) else None
    return found if found is not None else next(iter(MODALITIES.values()))


__all__ = ["IMAGE", "MODALITIES", "Modality", "TEXT", "modality_named", "recorded_modality", "register_modality"]
