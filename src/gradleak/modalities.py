"""The modalities (``--modality NAME``): each declares itself with a ``MODALITY_SPEC`` literal in
its own module (pipeline/<name>.py), read here without importing it (no torch)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError, UnknownNameError


def _no_lines(metrics: Mapping[str, Any]) -> list[str]:
    return []


@dataclass(frozen=True, eq=False)
class Modality:
    """One modality's declaration (see the module's notes in docs/).

    summary:        what it attacks, in a line.
    plugin:         its declaring module, whose import registers its case builder (``pipeline.case.modality``).
    share, report:  ``module:function`` of ``gradleak share``'s client (config -> Case) and of the
                    renderer of a run folder's report.html (folder -> path), functions of ``plugin``.
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
    summary_lines:  its own lines under the summary (metrics -> lines; imports ``plugin`` when called).
    verdict_family: the convergence line (attacks/verdict.py) all its attacks are held to (None:
                    each attack's own).
    measures:       what its answers are scored in against the truth: "images" (PSNR, SSIM, images
                    identified) or "tokens" (token accuracy, sentences rebuilt); outcome.py's rules.
    nothing:        how a verdict says that nothing leaked.
    portfolio_keys: metrics.json keys recorded for each answer of ``auto``'s portfolio (with the truth).
    update_format:  the metadata ``format`` of its update files (fl/files.py names the modality of a
                    file attacked as another one's from it, without importing the modality).
    """

    name: str
    summary: str
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
    update_format: str | None = None

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


def from_declaration(declared: Any) -> Modality:
    """The Modality a ``MODALITY_SPEC`` declares (a specs.Declaration): its callables are functions
    of its module (the plug-in that registers its case builder), imported only when called."""
    values, module = dict(declared.values), declared.module
    lines = values.pop("summary_lines", None)
    refuses = {f: why for fields, why in values.pop("refuses", []) for f in fields}
    values.pop("default", None)
    tuples = {k: tuple(values[k]) for k in ("summary_keys", "own_fields", "portfolio_keys") if k in values}
    refs = {k: f"{module}:{values[k]}" for k in ("share", "report")}
    return Modality(**{**values, **tuples, **refs}, plugin=module, refuses=refuses,
                    summary_lines=_no_lines if lines is None else _lazy(f"{module}:{lines}"))


def _lazy(ref: str) -> Callable[..., Any]:
    """``module:function``, imported when first called."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return _load(ref)(*args, **kwargs)
    return call


def _declared() -> dict[str, Modality]:
    """The modalities their modules declare (specs.declarations, read without importing them),
    the one a record naming none is first."""
    from .specs import declarations

    found = declarations("modality")
    first = [d for d in found.values() if d.get("default")]
    if len(first) != 1:
        raise ConfigError(f"one modality must be the default, not {len(first)}: "
                          f"{', '.join(d.name for d in first) or 'none'}")
    return {d.name: from_declaration(d) for d in (*first, *(d for d in found.values() if d not in first))}


#: The declared modalities by name; the first is what a record that names none is (image runs'
#: metrics.json has no "modality").
MODALITIES: dict[str, Modality] = _declared()
IMAGE, TEXT = MODALITIES["image"], MODALITIES["text"]  # the two gradleak ships, named for their cases


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
