"""Typed text-attack configs (a discriminated union on ``attack``), resolved before the attack
starts from the flat run config and the model's defaults (attacks.DEFAULTS), and registered with
the engine like the image attacks (attacks/configs.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Mapping, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..engine import Engine, register_attack
from ..errors import ConfigError, GradleakError
from ..fl.update import SharedUpdate
from .attacks import DEFAULTS, TEXT_ATTACKS, TextAttackSettings, TextReconstruction, run_text_attack
from .models import TextModel


class TextBOWConfig(BaseModel):
    """The bag of words only: the token set from the word-embedding gradient (no optimisation)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attack: Literal["bow"] = "bow"
    seed: int = Field(0, ge=0)


class TextDLGConfig(BaseModel):
    """DLG for text restricted to the leaked bag of words, then a search over orders."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attack: Literal["dlg"] = "dlg"
    seed: int = Field(0, ge=0)
    iterations: int = Field(ge=0)
    lr: float = Field(gt=0, allow_inf_nan=False)
    optimizer: Literal["adam", "sgd", "lbfgs"]
    dtype: Literal["float32", "float64"]
    labels: Literal["soft", "bias"]
    search_evaluations: int = Field(ge=0)

    def settings(self, engine: Engine) -> TextAttackSettings:
        return TextAttackSettings(iterations=self.iterations, lr=self.lr, optimizer=self.optimizer, dtype=self.dtype,
                                  seed=self.seed, device=str(engine.device), log_every=engine.log_every,
                                  progress=engine.progress, labels=self.labels,
                                  search_evaluations=self.search_evaluations)


class TextDLGFreeConfig(TextDLGConfig):
    """DLG on free token embeddings (nearest tokens), then the search."""

    attack: Literal["dlg-free"] = "dlg-free"  # type: ignore[assignment]


TextAttackConfig = Annotated[Union[TextBOWConfig, TextDLGConfig, TextDLGFreeConfig], Field(discriminator="attack")]
TEXT_ATTACK_CONFIGS: dict[str, type[BaseModel]] = {"bow": TextBOWConfig, "dlg": TextDLGConfig,
                                                   "dlg-free": TextDLGFreeConfig}
TEXT_FLAT_FIELDS = ("iterations", "lr", "optimizer", "dtype", "labels", "search_evaluations")


def text_applicable(attack: str) -> tuple[str, ...]:
    cls = TEXT_ATTACK_CONFIGS[attack]
    return tuple(f for f in TEXT_FLAT_FIELDS if f in cls.model_fields)


def resolve_text_attack(values: Mapping[str, Any], model: TextModel, batch_size: int) -> TextAttackConfig:
    """The typed, resolved config of text attack ``values["attack"]``: flags given, else the
    model's defaults; labels "bias" for one sentence (exact), else soft labels."""
    attack = str(values.get("attack"))
    if attack not in TEXT_ATTACK_CONFIGS:
        raise GradleakError(f"unknown text attack {attack!r}; known: {', '.join(TEXT_ATTACKS)}")
    known = text_applicable(attack)
    for name in TEXT_FLAT_FIELDS:
        if values.get(name) is not None and name not in known:
            raise ConfigError(f"option --{name.replace('_', '-')} does not apply to text attack {attack!r}")
    given = {k: values[k] for k in known if values.get(k) is not None}
    defaults = DEFAULTS.get(model.name, DEFAULTS["tiny-transformer"])
    resolved: dict[str, Any] = {k: given.get(k, defaults.get(k)) for k in known}
    if "labels" in known and resolved.get("labels") is None:
        resolved["labels"] = "bias" if batch_size == 1 else "soft"
    try:
        return TEXT_ATTACK_CONFIGS[attack](seed=int(values.get("seed", 0)), **resolved)  # type: ignore[return-value]
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ConfigError(f"text {attack}: {'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from None


@register_attack(TextBOWConfig)
def _bow(cfg: TextBOWConfig, update: SharedUpdate, model: TextModel, engine: Engine) -> TextReconstruction:
    return run_text_attack("bow", update, model, TextAttackSettings(seed=cfg.seed, device=str(engine.device)),
                           engine.observer)


@register_attack(TextDLGConfig)
@register_attack(TextDLGFreeConfig)
def _dlg(cfg: TextDLGConfig, update: SharedUpdate, model: TextModel, engine: Engine) -> TextReconstruction:
    return run_text_attack(cfg.attack, update, model, cfg.settings(engine), engine.observer, engine=engine)


__all__ = ["TEXT_ATTACK_CONFIGS", "TextAttackConfig", "TextBOWConfig", "TextDLGConfig", "TextDLGFreeConfig",
           "resolve_text_attack", "text_applicable"]
