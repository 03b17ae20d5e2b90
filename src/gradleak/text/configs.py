"""Typed text-attack configs, derived from the text attacks' own ``SPEC`` declarations, a
discriminated union on ``attack``, every field resolved before the attack starts by the one
resolution of both modalities (attacks/configs.py: resolve_config, with the text attacks'
per-model defaults and TextResolution). :func:`run_text_attack` is the Python API's way in: the
same resolution and engine as the CLI."""

from __future__ import annotations

from typing import Annotated, Any, Mapping, Union

from pydantic import Field

from ..attacks.configs import TEXT_ATTACK_CONFIGS, TEXT_FLAT_FIELDS, AttackConfigBase, config_class, resolve_config
from ..catalog import TEXT_ATTACKS
from ..engine import Engine
from ..errors import ConfigError
from ..fl.update import SharedUpdate
from .leak import TextObserver, TextReconstruction, TextResolution
from .models import TextModel

TextAttackConfig = Annotated[Union[tuple(TEXT_ATTACK_CONFIGS.values())],  # type: ignore[valid-type]
                             Field(discriminator="attack")]


def text_attack_names() -> list[str]:
    return list(TEXT_ATTACKS)


def resolve_text_attack(values: Mapping[str, Any], model: TextModel, batch_size: int) -> Any:
    """The typed, resolved config of text attack ``values["attack"]``: flags given, else the
    model's defaults, then the attack's own rule (labels "bias" for one sentence, else soft)."""
    return resolve_config("text", values, TextResolution(model.name, batch_size), model=model.name)


def text_config_class(attack: str) -> type[AttackConfigBase]:
    """The typed config class of text attack ``attack`` (UnknownNameError when there is none)."""
    return config_class(attack, "text")


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
           "text_attack_names", "text_config_class"]
