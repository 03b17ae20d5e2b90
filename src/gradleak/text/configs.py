"""Typed text-attack configs, derived from the text attacks' own ``SPEC`` declarations, a
discriminated union on ``attack``, every field resolved before the attack starts.
:func:`run_text_attack` is the Python API's way in: the same resolution and engine as the CLI."""

from __future__ import annotations

import importlib
from typing import Annotated, Any, Mapping, Union

from pydantic import Field, ValidationError

from ..attacks.configs import AttackConfigBase, make_config_class
from ..catalog import TEXT_ATTACKS, unknown
from ..engine import Engine
from ..errors import ConfigError
from ..fl.update import SharedUpdate
from ..specs import attack_specs
from .leak import TextObserver, TextReconstruction, TextResolution
from .models import TextModel

TEXT_ATTACK_CONFIGS: dict[str, type[AttackConfigBase]] = {name: make_config_class(spec)
                                                          for name, spec in attack_specs("text").items()}
TextAttackConfig = Annotated[Union[tuple(TEXT_ATTACK_CONFIGS.values())],  # type: ignore[valid-type]
                             Field(discriminator="attack")]
# The flat (CLI) names of the text attacks' constants, in their declared order.
TEXT_FLAT_FIELDS = tuple(dict.fromkeys(f for spec in attack_specs("text").values() for f in spec.flags))


def text_attack_names() -> list[str]:
    return list(TEXT_ATTACKS)


def text_applicable(attack: str) -> tuple[str, ...]:
    """The flat config fields the text attack ``attack`` reads."""
    return tuple(f for f in TEXT_FLAT_FIELDS if f in TEXT_ATTACK_CONFIGS[attack].spec.flags)


def resolve_text_attack(values: Mapping[str, Any], model: TextModel, batch_size: int) -> Any:
    """The typed, resolved config of text attack ``values["attack"]``: flags given, else the
    model's defaults, then the attack's own rule (labels "bias" for one sentence, else soft)."""
    attack = str(values.get("attack"))
    if attack not in TEXT_ATTACK_CONFIGS:
        raise unknown("text attack", attack, TEXT_ATTACKS)
    known = text_applicable(attack)
    for name in TEXT_FLAT_FIELDS:
        if values.get(name) is not None and name not in known:
            raise ConfigError(f"option --{name.replace('_', '-')} does not apply to text attack {attack!r}")
    spec = TEXT_ATTACK_CONFIGS[attack].spec
    defaults = spec.defaults_for(model.name)
    # the flag given, else the model's default, else the flag's own declared default
    resolved: dict[str, Any] = {k: values[k] if values.get(k) is not None else
                                defaults.get(k, spec.flags[k].default) for k in known}
    if spec.resolve:
        # spec.module names a file of gradleak's own text attack package (specs.attack_specs), never a
        # name read from a run's input: ``attack`` was checked against TEXT_ATTACK_CONFIGS above
        resolved = importlib.import_module(spec.module).resolve(resolved, TextResolution(model.name, batch_size))
    try:
        return TEXT_ATTACK_CONFIGS[attack](seed=int(values.get("seed", 0)), **resolved)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ConfigError(f"text {attack}: {'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from None


def text_config_class(attack: str) -> type[AttackConfigBase]:
    """The typed config class of text attack ``attack`` (UnknownNameError when there is none)."""
    if attack not in TEXT_ATTACK_CONFIGS:
        raise unknown("text attack", attack, TEXT_ATTACKS)
    return TEXT_ATTACK_CONFIGS[attack]


def run_text_attack(attack: str | AttackConfigBase, update: SharedUpdate, model: TextModel,
                    observer: TextObserver | None = None, *, engine: Engine | None = None, seed: int = 0,
                    device: str = "cpu", log_every: int = 10, progress: bool = False,
                    **constants: Any) -> TextReconstruction:
    """Run a text attack on ``update`` the way the CLI does: ``attack`` its typed config
    (TEXT_ATTACK_CONFIGS), or its name with ``seed`` and the ``constants`` to set as flat flags
    (the others: the model's defaults, resolved from its SPEC), run by an Engine (``device``,
    ``log_every``, ``progress``; IEEE float32 on CUDA). ConfigError for a constant no text attack
    reads."""
    if isinstance(attack, AttackConfigBase):
        config = attack
    else:
        for name in constants:
            if name not in TEXT_FLAT_FIELDS:
                raise ConfigError(f"text attack {attack!r}: no text attack reads the constant {name!r}")
        given = {k: v for k, v in constants.items() if v is not None}
        config = resolve_text_attack({**given, "attack": attack, "seed": seed}, model, int(update.meta.batch_size))
    if engine is None:
        engine = Engine(device=device, observer=observer, log_every=log_every, progress=progress)
    return engine.run(config, update, model)


__all__ = ["TEXT_ATTACK_CONFIGS", "TEXT_FLAT_FIELDS", "TextAttackConfig", "resolve_text_attack", "run_text_attack",
           "text_applicable", "text_attack_names", "text_config_class"]
