"""Typed attack configs: one per attack, a discriminated union on ``attack``, every field resolved
before the attack starts.

A run's flat config (gradleak.config.AttackConfig, the CLI flags) names the attack and, where the
user gave them, its constants; :func:`resolve_attack` turns that into the attack's own config with
every default filled (DLG's, Inverting Gradients', GradInversion's preset, with its schedule
scaled to the iterations asked for). What ran is that config: config.json and metrics.json record
it field by field, so ``gradleak attack --config RUN/config.json`` reruns the run with identical
numbers. A flag that the chosen attack does not read is an error, never ignored.

Choices: GradInversion's BN prior defaults to "exact" when the update carries the client's BN
batch statistics and to "approx" (the model's running statistics: the paper's Sec. 4 implementation details and Table 4's
"BN approx") when it
does not: what the client shares is decided by the case, never by the attack.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, Literal, Mapping, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..catalog import unknown
from ..errors import ConfigError
from ..fl.update import SharedUpdate
from ..models import ModelSpec
from .base import AttackSettings
from .dlg import DLG_DEFAULTS, DLG_RESTARTS, dlg, idlg
from .engine import Engine, register_attack
from .gradinversion import GradInversionSettings, gradinversion, resolve_settings
from .ig import IG_ALPHA_TV, IG_DEFAULTS, ig_alpha_tv, inverting_gradients
from .reconstruction import Reconstruction
from .labels import LABEL_METHODS

Optimizer = Literal["lbfgs", "adam", "sgd"]
Init = Literal["randn", "rand", "zeros"]
DType = Literal["float32", "float64"]
LabelMethod = Literal[LABEL_METHODS]  # type: ignore[valid-type]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _AttackConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, ge=0)
    init: Init = "randn"
    iterations: int = Field(ge=0)
    lr: float = Field(gt=0, allow_inf_nan=False)
    optimizer: Optimizer
    dtype: DType

    def settings(self, *, device: str = "cpu", log_every: int = 10, progress: bool = False) -> AttackSettings:
        """The attack function's AttackSettings (every field already resolved)."""
        return AttackSettings(iterations=self.iterations, lr=self.lr, optimizer=self.optimizer, init=self.init,
                              dtype=self.dtype, seed=self.seed, device=device, log_every=log_every,
                              progress=progress)


class DLGConfig(_AttackConfig):
    """DLG (Zhu et al. 2019, Algorithm 1): image and soft label by L-BFGS on the squared L2
    gradient distance (for K > 1 images, after a warm-up third of each trial on the relative
    distance + a small TV prior: dlg.PRIOR_FRACTION, PRIOR_TV). ``init``: the first trial's start. ``stall_restarts``: further trials
    (dlg.INIT_PORTFOLIO: the other initialisations in turn) while the best answer so far does not
    explain the update (relative gradient distance above dlg.RESTART_BELOW) after a trial
    that stalled or used its whole budget; the answer is the trial with the smallest gradient
    distance. A run costs up to (stall_restarts + 1) x ``iterations`` L-BFGS steps. ``stop``:
    "settled" ends a start once its objective has settled below the verdict's line (dlg.SETTLE_*),
    "budget" runs every step (DLG's code)."""

    attack: Literal["dlg"] = "dlg"
    iterations: int = Field(DLG_DEFAULTS["iterations"], ge=0)
    lr: float = Field(DLG_DEFAULTS["lr"], gt=0, allow_inf_nan=False)
    optimizer: Optimizer = DLG_DEFAULTS["optimizer"]
    dtype: DType = DLG_DEFAULTS["dtype"]
    stall_restarts: int = Field(DLG_RESTARTS, ge=0)
    stop: Literal["settled", "budget"] = "settled"


class IDLGConfig(DLGConfig):
    """iDLG (Zhao et al. 2020): the label from the classifier gradient's sign, then DLG on the image."""

    attack: Literal["idlg"] = "idlg"  # type: ignore[assignment]


class IGConfig(_AttackConfig):
    """Inverting Gradients (Geiping et al. 2020, Eq. 4): cosine distance + alpha_TV TV, signed
    Adam with step decay, box constraint; ``restarts`` batched restarts."""

    attack: Literal["ig"] = "ig"
    iterations: int = Field(IG_DEFAULTS["iterations"], ge=0)
    lr: float = Field(IG_DEFAULTS["lr"], gt=0, allow_inf_nan=False)
    optimizer: Optimizer = IG_DEFAULTS["optimizer"]
    dtype: DType = IG_DEFAULTS["dtype"]
    restarts: int = Field(1, ge=1)
    labels: LabelMethod = "gradinversion"
    alpha_tv: NonNegative = IG_ALPHA_TV

    def settings(self, **run: Any) -> AttackSettings:
        return replace(super().settings(**run), seeds=self.restarts, labels=self.labels)


class GradInversionConfig(_AttackConfig):
    """GradInversion (Yin et al. 2021): every constant of Eq. 1-12 and Sec. 3.5 (see
    gradinversion.GradInversionSettings for their meaning); ``preset`` names where the values
    not given came from."""

    attack: Literal["gradinversion"] = "gradinversion"
    preset: str = "cpu"
    iterations: int = Field(ge=0)
    lr: float = Field(gt=0, allow_inf_nan=False)
    optimizer: Optimizer = "adam"
    dtype: DType = "float32"
    warmup: int = Field(ge=0)
    alpha_g: NonNegative
    alpha_tv: NonNegative
    alpha_l2: NonNegative
    alpha_bn: NonNegative
    alpha_group: NonNegative
    alpha_n: NonNegative
    seeds: int = Field(ge=1)
    group: Literal["none", "lazy", "registered"]
    bn: Literal["exact", "approx", "none"]
    registration_start: int = Field(ge=0)
    registration_every: int = Field(ge=1)
    registration_steps: int = Field(ge=1)
    labels: LabelMethod
    final: Literal["consensus", "best"]
    box: bool = False

    def gi(self) -> GradInversionSettings:
        """The attack function's GradInversionSettings."""
        values = self.model_dump(exclude={"attack", "preset", "seed", "init", "optimizer", "dtype"})
        return GradInversionSettings(name=self.preset, **values).validate()


class _ClosedFormConfig(BaseModel):
    """A closed-form attack: no optimisation, so no constants (any optimisation flag is refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, ge=0)


class AnalyticConfig(_ClosedFormConfig):
    """Analytic recovery through a fully connected first layer (Phong et al.; attacks/analytic.py)."""

    attack: Literal["analytic"] = "analytic"


class RGAPConfig(_ClosedFormConfig):
    """R-GAP (Zhu and Blaschko, ICLR 2021): the recursive closed-form attack (attacks/rgap.py)."""

    attack: Literal["rgap"] = "rgap"


class ImprintConfig(_ClosedFormConfig):
    """The imprint module of a malicious server (Fowl et al., ICLR 2022; attacks/imprint.py)."""

    attack: Literal["imprint"] = "imprint"


OptimisationConfig = Annotated[Union[DLGConfig, IDLGConfig, IGConfig, GradInversionConfig],
                               Field(discriminator="attack")]


class AutoConfig(_ClosedFormConfig):
    """The attack chooser (attacks/auto.py): the closed-form attacks that apply to the model and
    the threat first (imprint, analytic, R-GAP), then ``portfolio``, the optimisation attacks it
    runs in order (each with every constant resolved) when none of them explains the update."""

    attack: Literal["auto"] = "auto"
    portfolio: tuple[OptimisationConfig, ...] = Field(min_length=1)

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(m.attack for m in self.portfolio)


ImageAttackConfig = Annotated[Union[DLGConfig, IDLGConfig, IGConfig, GradInversionConfig, AnalyticConfig,
                                    RGAPConfig, ImprintConfig, AutoConfig], Field(discriminator="attack")]
IMAGE_ATTACK_CONFIGS: dict[str, type[BaseModel]] = {
    "dlg": DLGConfig, "idlg": IDLGConfig, "ig": IGConfig, "gradinversion": GradInversionConfig,
    "analytic": AnalyticConfig, "rgap": RGAPConfig, "imprint": ImprintConfig, "auto": AutoConfig}
CLOSED_FORM = ("imprint", "analytic", "rgap")  # the order attack "auto" tries them in

# The flat (CLI) names of every attack constant, and the attack field each stands for.
FLAT_FIELDS = ("iterations", "lr", "optimizer", "init", "dtype", "preset", "seeds", "group", "bn", "labels",
               "restarts", "stall_restarts", "stop", "alpha_g", "alpha_tv", "alpha_l2", "alpha_bn", "alpha_group", "alpha_n", "warmup",
               "registration_start", "registration_every", "registration_steps", "final", "search_evaluations", "box")


def applicable(attack: str) -> tuple[str, ...]:
    """The flat config fields the image attack ``attack`` reads."""
    cls = IMAGE_ATTACK_CONFIGS[attack]
    return tuple(f for f in FLAT_FIELDS if f in cls.model_fields)


def given_flags(values: Mapping[str, Any]) -> tuple[str, ...]:
    """The attack constants given (not None); ``init`` and ``box`` count as given when they are
    not their defaults."""
    return tuple(name for name in FLAT_FIELDS if values.get(name) is not None
                 and not (name == "init" and values[name] == "randn") and not (name == "box" and values[name] is False))


def check_flags(attack: str, values: Mapping[str, Any], known: tuple[str, ...]) -> None:
    """ConfigError for the first attack constant given that ``attack`` does not read."""
    for name in given_flags(values):
        if name not in known:
            raise ConfigError(f"option --{name.replace('_', '-')} does not apply to attack {attack!r}")


def resolve_attack(values: Mapping[str, Any], *, bn_statistics_shared: bool,
                   portfolio: tuple[str, ...] | None = None,
                   layers: tuple[int, int] | None = None) -> ImageAttackConfig:
    """The typed, fully resolved config of the image attack ``values["attack"]`` from the flat
    config values (None: the attack's default). ``bn_statistics_shared``: whether the update
    carries the client's BN batch statistics (GradInversion's default BN prior follows it).
    ``portfolio``: for attack "auto", the optimisation attacks it runs when no closed form explains
    the update (the case chooses them: attacks.auto.auto_portfolio; ``values["fallback"]``, when
    given, narrows it to that one attack); each member reads the flags given that apply to it, and
    a flag no member reads is an error.
    ``layers``: the attacked model's (parameter tensors, BN layers), which GradInversion's preset
    alphas (gradinversion.per_layer) and IG's default alpha_TV (ig.ig_alpha_tv) are scaled to;
    None: the reference model."""
    attack = str(values.get("attack"))
    if attack not in IMAGE_ATTACK_CONFIGS:
        raise unknown("attack", attack, IMAGE_ATTACK_CONFIGS)
    if values.get("fallback") is not None and attack != "auto":
        raise ConfigError(f"option --fallback applies to attack 'auto', not to {attack!r}")
    if attack == "auto":
        return _resolve_auto(values, bn_statistics_shared, portfolio, layers)
    known = applicable(attack)
    check_flags(attack, values, known)
    given = {k: values[k] for k in known if values.get(k) is not None and not (k == "box" and values[k] is False)}
    given["seed"] = int(values.get("seed", 0))
    if attack == "ig" and "alpha_tv" not in given:
        given["alpha_tv"] = ig_alpha_tv(layers)  # the authors' value, per layer of the model (ig.py)
    try:
        if attack == "gradinversion":
            return _resolve_gradinversion(given, bn_statistics_shared, layers)
        return IMAGE_ATTACK_CONFIGS[attack](**given)  # type: ignore[return-value]
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


def _resolve_gradinversion(given: dict[str, Any], bn_statistics_shared: bool,
                           layers: tuple[int, int] | None) -> GradInversionConfig:
    preset = given.get("preset", "cpu")
    # The preset per layer of the model, then --iterations (which scales the registration
    # schedule and caps the warm-up, resolve_settings), then every constant given explicitly.
    base = resolve_settings(AttackSettings(preset=preset, iterations=given.get("iterations")), layers=layers)
    values = {**base.to_dict(), **{k: v for k, v in given.items() if k not in ("preset",)}}
    values.pop("name")
    if "bn" not in given and values["bn"] == "exact" and not bn_statistics_shared:
        values["bn"] = "approx"
    if values["bn"] == "exact" and not bn_statistics_shared:
        raise ConfigError("--bn exact needs an update that carries the client's BN batch statistics "
                          "(simulate the client with --share-bn-statistics, or use --bn approx)")
    cfg = GradInversionConfig(preset=preset, **values)
    cfg.gi()  # GradInversion's own checks (modes, label method)
    return cfg


# ---------------------------------------------------------------- each attack, registered by its config
def _run_settings(engine: Engine) -> dict[str, Any]:
    return {"device": str(engine.device), "log_every": engine.log_every, "progress": engine.progress}


@register_attack(DLGConfig)
def _dlg(cfg: DLGConfig, update: SharedUpdate, model: ModelSpec, engine: Engine) -> Reconstruction:
    return dlg(update, model, cfg.settings(**_run_settings(engine)), restarts=cfg.stall_restarts, engine=engine,
               stop=cfg.stop)


@register_attack(IDLGConfig)
def _idlg(cfg: IDLGConfig, update: SharedUpdate, model: ModelSpec, engine: Engine) -> Reconstruction:
    return idlg(update, model, cfg.settings(**_run_settings(engine)), restarts=cfg.stall_restarts, engine=engine,
               stop=cfg.stop)


@register_attack(IGConfig)
def _ig(cfg: IGConfig, update: SharedUpdate, model: ModelSpec, engine: Engine) -> Reconstruction:
    return inverting_gradients(update, model, cfg.settings(**_run_settings(engine)), alpha_tv=cfg.alpha_tv,
                               engine=engine)


@register_attack(GradInversionConfig)
def _gradinversion(cfg: GradInversionConfig, update: SharedUpdate, model: ModelSpec, engine: Engine) -> Reconstruction:
    return gradinversion(update, model, cfg.settings(**_run_settings(engine)), gi=cfg.gi(), engine=engine)


__all__ = ["AnalyticConfig", "AutoConfig", "CLOSED_FORM", "DLGConfig", "ImprintConfig", "RGAPConfig",
           "OptimisationConfig", "FLAT_FIELDS", "GradInversionConfig", "IDLGConfig", "IGConfig", "IMAGE_ATTACK_CONFIGS",
           "ImageAttackConfig", "applicable", "check_flags", "given_flags", "resolve_attack"]
