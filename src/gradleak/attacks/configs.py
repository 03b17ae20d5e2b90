"""Typed attack configs, image and text: one per attack, derived from the attack's own declaration
(its module's ``SPEC``, gradleak/specs.py), a discriminated union on ``attack``, every field
resolved before the attack starts, by one path for both modalities (resolve_config; what differs
between them is data: ModalityConfigs)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Mapping, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from ..catalog import unknown
from ..errors import ConfigError
from ..specs import AttackSpec, annotation, attack_specs, closed_forms, flat_flags

# Flat flags whose flat (CLI) default is a value, not None: they count as given only when they differ.
FLAT_DEFAULTS: dict[str, Any] = {"init": "randn"}


class AttackConfigBase(BaseModel):
    """What every typed attack config has: its attack's name (``attack``), the seed, and the
    spec it was derived from (a class attribute)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    spec: ClassVar[AttackSpec]

    seed: int = Field(0, ge=0)


def make_config_class(spec: AttackSpec) -> type[AttackConfigBase]:
    """The typed config of the attack ``spec`` declares: ``attack``, ``seed`` and one field per flag
    (its type's constraints, its default). Text attacks' classes are named Text...Config."""
    fields: dict[str, Any] = {"attack": (Literal[spec.name], spec.name)}  # type: ignore[valid-type]
    for name, flag in spec.flags.items():
        kind, constraints = annotation(flag.type)
        fields[name] = (kind, Field(flag.default, description=flag.help, **constraints))
    title = "".join(part.capitalize() for part in spec.name.split("-")) + "Config"
    if spec.modality != "image":
        title = spec.modality.capitalize() + title
    cls = create_model(title, __base__=AttackConfigBase, __doc__=spec.summary, **fields)
    cls.spec = spec
    return cls


# Every attack's typed config but the chooser's, by name (attack modules' SPECs).
CONFIGS: dict[str, type[AttackConfigBase]] = {name: make_config_class(spec) for name, spec in attack_specs().items()
                                              if spec.kind != "chooser"}
OPTIMISATION = tuple(name for name, spec in attack_specs().items() if spec.optimisation)
OptimisationConfig = Annotated[Union[tuple(CONFIGS[n] for n in OPTIMISATION)],  # type: ignore[valid-type]
                               Field(discriminator="attack")]


class AutoConfig(AttackConfigBase):
    """The attack chooser (attacks/auto.py): the closed-form attacks that apply to the model and
    the threat first (CLOSED_FORM, in their declared order), then ``portfolio``, the optimisation
    attacks it runs in order (each with every constant resolved) when none of them explains the
    update."""

    attack: Literal["auto"] = "auto"
    portfolio: tuple[OptimisationConfig, ...] = Field(min_length=1)

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(m.attack for m in self.portfolio)


AutoConfig.spec = attack_specs()["auto"]
CONFIGS["auto"] = AutoConfig
IMAGE_ATTACK_CONFIGS = CONFIGS
ImageAttackConfig = Annotated[Union[tuple(CONFIGS.values())], Field(discriminator="attack")]  # type: ignore[valid-type]
CLOSED_FORM = closed_forms()  # the order attack "auto" tries them in
# The flat (CLI) names of every attack constant, image and text (the chooser's --fallback is its
# own): an image attack given one it does not read (a text attack's search budget) refuses it.
FLAT_FIELDS = tuple(name for name in flat_flags() if name != "fallback")


@dataclass(frozen=True)
class Resolution:
    """What an image attack's ``resolve`` may read of the case: whether the update carries the
    client's BN batch statistics, and the attacked model's (parameter tensors, BN layers), None:
    the attack's reference model. (A text attack's reads text.leak.TextResolution.)"""

    bn_statistics_shared: bool
    layers: tuple[int, int] | None


# The text attacks' typed configs (their SPECs under text/attacks/, read without importing them)
# and the flat names of their constants, in their declared order.
TEXT_ATTACK_CONFIGS: dict[str, type[AttackConfigBase]] = {name: make_config_class(spec)
                                                          for name, spec in attack_specs("text").items()}
TEXT_FLAT_FIELDS = tuple(dict.fromkeys(f for spec in attack_specs("text").values() for f in spec.flags))


@dataclass(frozen=True)
class ModalityConfigs:
    """What tells one modality's config resolution from another's, as data: the catalog kind
    its attacks are named by in errors ("text attack": "unknown text attack", "does not apply to
    text attack 'dlg'"), the prefix of a refused value ("text dlg: lr: ..."), its typed configs
    by name, and the flat constants a given one is checked against the attack (an image attack
    refuses a text attack's constant too; a text attack reads only text ones)."""

    kind: str
    prefix: str
    configs: Mapping[str, type[AttackConfigBase]]
    fields: tuple[str, ...]


MODALITY_CONFIGS: dict[str, ModalityConfigs] = {
    "image": ModalityConfigs("attack", "", CONFIGS, FLAT_FIELDS),
    "text": ModalityConfigs("text attack", "text ", TEXT_ATTACK_CONFIGS, TEXT_FLAT_FIELDS),
}


def config_class(attack: str, modality: str = "image") -> type[AttackConfigBase]:
    """The typed config class of ``modality``'s attack ``attack`` (UnknownNameError, naming the
    modality's catalog kind, when there is none)."""
    found = MODALITY_CONFIGS[modality]
    if attack not in found.configs:
        raise unknown(found.kind, attack, found.configs)
    return found.configs[attack]


def applicable(attack: str, modality: str = "image") -> tuple[str, ...]:
    """The flat config fields ``modality``'s attack ``attack`` reads."""
    found = MODALITY_CONFIGS[modality]
    return tuple(f for f in found.fields if f in found.configs[attack].spec.flags)


def given_flags(values: Mapping[str, Any], fields: tuple[str, ...] = FLAT_FIELDS) -> tuple[str, ...]:
    """The attack constants of ``fields`` given (not None); a constant with a flat default
    (``init``) or a switch (``box``) counts as given when it is not that default."""
    return tuple(name for name in fields if values.get(name) is not None
                 and values[name] != FLAT_DEFAULTS.get(name, False if isinstance(values[name], bool) else None))


def check_flags(attack: str, values: Mapping[str, Any], known: tuple[str, ...], modality: str = "image") -> None:
    """ConfigError for the first attack constant given that ``modality``'s attack ``attack`` does
    not read."""
    found = MODALITY_CONFIGS[modality]
    for name in given_flags(values, found.fields):
        if name not in known:
            raise ConfigError(f"option --{name.replace('_', '-')} does not apply to {found.kind} {attack!r}")


def resolve_config(modality: str, values: Mapping[str, Any], resolution: Any, *, model: str | None = None) -> Any:
    """The typed, resolved config of ``modality``'s attack ``values["attack"]`` from the flat
    config values (None: not given), the one path of both modalities: a constant the attack does
    not read is refused; each constant is the one given, else the attacked ``model``'s default
    (its SPEC's model_defaults: the text attacks'; None: the first model's), else the flag's own
    default; then the attack's ``resolve(values, resolution)`` fills what depends on the case
    (``resolution``: the modality's Resolution or TextResolution). A value out of range is a
    ConfigError naming the attack and the field."""
    found = MODALITY_CONFIGS[modality]
    attack = str(values.get("attack"))
    cls = config_class(attack, modality)
    known = applicable(attack, modality)
    check_flags(attack, values, known, modality)
    spec = cls.spec
    given = {**spec.defaults_for(model or ""), **{k: values[k] for k in given_flags(values, found.fields) if k in known},
             "seed": int(values.get("seed", 0))}
    try:
        if spec.resolve:  # the attack fills the defaults that depend on the case
            # spec.module names a file of gradleak's own attack packages (specs.attack_specs), never a
            # name read from a run's input: ``attack`` was checked against the modality's configs above
            given = importlib.import_module(spec.module).resolve(given, resolution)
        return cls(**given)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ConfigError(f"{found.prefix}{attack}: {'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from None


def resolve_attack(values: Mapping[str, Any], *, bn_statistics_shared: bool,
                   portfolio: tuple[str, ...] | None = None,
                   layers: tuple[int, int] | None = None) -> Any:
    """The typed, fully resolved config of the image attack ``values["attack"]`` from the flat
    config values (None: the attack's default), by resolve_config. ``bn_statistics_shared``:
    whether the update carries the client's BN batch statistics (GradInversion's default BN prior
    follows it).
    ``portfolio``: for attack "auto", the optimisation attacks it runs when no closed form explains
    the update (the case chooses them: attacks.auto.auto_portfolio; ``values["fallback"]``, when
    given, narrows it to that one attack); each member reads the flags given that apply to it, and
    a flag no member reads is an error.
    ``layers``: the attacked model's (parameter tensors, BN layers), which an attack's ``resolve``
    may scale its defaults to (GradInversion's preset alphas, IG's alpha_TV); None: the reference
    model."""
    attack = str(values.get("attack"))
    config_class(attack)  # an unknown name before anything else
    if values.get("fallback") is not None and attack != "auto":
        raise ConfigError(f"option --fallback applies to attack 'auto', not to {attack!r}")
    if attack == "auto":
        return _resolve_auto(values, bn_statistics_shared, portfolio, layers)
    return resolve_config("image", values, Resolution(bn_statistics_shared, layers))


def _resolve_auto(values: Mapping[str, Any], bn_statistics_shared: bool, portfolio: tuple[str, ...] | None,
                  layers: tuple[int, int] | None) -> AutoConfig:
    names = (str(values["fallback"]),) if values.get("fallback") else tuple(portfolio or ("idlg",))
    rest = {**values, "fallback": None}
    if len(names) == 1:  # one member reads every flag given (and refuses those it does not read)
        members = [resolve_attack({**rest, "attack": names[0]}, bn_statistics_shared=bn_statistics_shared, layers=layers)]
    else:
        reads = {name: applicable(name) for name in names}
        for flag in given_flags(values):
            if not any(flag in known for known in reads.values()):
                raise ConfigError(f"option --{flag.replace('_', '-')} applies to none of the attacks auto runs "
                                  f"here ({', '.join(names)})")
        members = [resolve_attack({**{k: v for k, v in rest.items() if k not in FLAT_FIELDS or k in reads[name]},
                                   "attack": name}, bn_statistics_shared=bn_statistics_shared, layers=layers)
                   for name in names]
    return AutoConfig(seed=int(values.get("seed", 0)), portfolio=tuple(members))  # type: ignore[arg-type]


__all__ = ["AttackConfigBase", "AutoConfig", "CLOSED_FORM", "CONFIGS", "FLAT_FIELDS", "IMAGE_ATTACK_CONFIGS",
           "ImageAttackConfig", "MODALITY_CONFIGS", "ModalityConfigs", "OPTIMISATION", "OptimisationConfig", "Resolution",
           "TEXT_ATTACK_CONFIGS", "TEXT_FLAT_FIELDS", "applicable", "check_flags", "config_class", "given_flags",
           "make_config_class", "resolve_attack", "resolve_config"]
