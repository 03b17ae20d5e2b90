"""Typed attack configs: one per attack, derived from the attack's own declaration (its module's
``SPEC``, gradleak/specs.py), a discriminated union on ``attack``, every field resolved before the
attack starts."""

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
    """What an attack's ``resolve`` may read of the case: whether the update carries the client's
    BN batch statistics, and the attacked model's (parameter tensors, BN layers), None: the
    attack's reference model."""

    bn_statistics_shared: bool
    layers: tuple[int, int] | None


def applicable(attack: str) -> tuple[str, ...]:
    """The flat config fields the image attack ``attack`` reads."""
    return tuple(f for f in FLAT_FIELDS if f in CONFIGS[attack].spec.flags)


def given_flags(values: Mapping[str, Any]) -> tuple[str, ...]:
    """The attack constants given (not None); a constant with a flat default (``init``) or a
    switch (``box``) counts as given when it is not that default."""
    return tuple(name for name in FLAT_FIELDS if values.get(name) is not None
                 and values[name] != FLAT_DEFAULTS.get(name, False if isinstance(values[name], bool) else None))


def check_flags(attack: str, values: Mapping[str, Any], known: tuple[str, ...]) -> None:
    """ConfigError for the first attack constant given that ``attack`` does not read."""
    for name in given_flags(values):
        if name not in known:
            raise ConfigError(f"option --{name.replace('_', '-')} does not apply to attack {attack!r}")


def resolve_attack(values: Mapping[str, Any], *, bn_statistics_shared: bool,
                   portfolio: tuple[str, ...] | None = None,
                   layers: tuple[int, int] | None = None) -> Any:
    """The typed, fully resolved config of the image attack ``values["attack"]`` from the flat
    config values (None: the attack's default). ``bn_statistics_shared``: whether the update
    carries the client's BN batch statistics (GradInversion's default BN prior follows it).
    ``portfolio``: for attack "auto", the optimisation attacks it runs when no closed form explains
    the update (the case chooses them: attacks.auto.auto_portfolio; ``values["fallback"]``, when
    given, narrows it to that one attack); each member reads the flags given that apply to it, and
    a flag no member reads is an error.
    ``layers``: the attacked model's (parameter tensors, BN layers), which an attack's ``resolve``
    may scale its defaults to (GradInversion's preset alphas, IG's alpha_TV); None: the reference
    model."""
    attack = str(values.get("attack"))
    if attack not in CONFIGS:
        raise unknown("attack", attack, CONFIGS)
    if values.get("fallback") is not None and attack != "auto":
        raise ConfigError(f"option --fallback applies to attack 'auto', not to {attack!r}")
    if attack == "auto":
        return _resolve_auto(values, bn_statistics_shared, portfolio, layers)
    known = applicable(attack)
    check_flags(attack, values, known)
    given = {k: values[k] for k in given_flags(values) if k in known}
    given["seed"] = int(values.get("seed", 0))
    spec = CONFIGS[attack].spec
    try:
        if spec.resolve:  # the attack fills the defaults that depend on the case
            # spec.module names a file of gradleak's own attack package (specs.attack_specs), never a
            # name read from a run's input: ``attack`` was checked against CONFIGS above
            module = importlib.import_module(spec.module)
            given = module.resolve(given, Resolution(bn_statistics_shared, layers))
        return CONFIGS[attack](**given)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ConfigError(f"{attack}: {'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from None


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


def config_class(attack: str) -> type[AttackConfigBase]:
    """The typed config class of image attack ``attack`` (UnknownNameError when there is none)."""
    if attack not in CONFIGS:
        raise unknown("attack", attack, CONFIGS)
    return CONFIGS[attack]


__all__ = ["AttackConfigBase", "AutoConfig", "CLOSED_FORM", "CONFIGS", "FLAT_FIELDS", "IMAGE_ATTACK_CONFIGS",
           "ImageAttackConfig", "OPTIMISATION", "OptimisationConfig", "Resolution", "applicable", "check_flags",
           "config_class", "given_flags", "make_config_class", "resolve_attack"]
