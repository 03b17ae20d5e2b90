"""The case: what one attack is run on, built by a modality plug-in."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch

from ..config import AttackConfig, parse_betas
from ..errors import ConfigError, UnknownNameError
from ..fl.threats import ThreatModel
from ..fl.update import SharedUpdate
from ..modalities import Modality, modality_named


@dataclass
class Case(ABC):
    update: SharedUpdate
    model: Any            # models.ModelSpec (image) or text.TextModel
    truth: Any            # data.Batch (image) or text.TextBatch; None when unknown
    data: str = ""

    #: the observed columns of history.csv after iteration and loss
    history_columns: ClassVar[tuple[str, ...]] = ()
    #: the modality's declaration: its summary keys, report, verdict family (modalities.py)
    spec: ClassVar[Modality]

    @abstractmethod
    def attack_config(self, cfg: AttackConfig) -> Any:
        """The typed, fully resolved attack config ``cfg`` asks for on this case."""

    @abstractmethod
    def observer(self) -> Any:
        """What watches the attack (against the truth it holds), or None without a truth. It
        has ``points`` {iteration: value}, ``get_state()`` and ``set_state(dict)``."""

    def matched(self, recon: Any) -> dict[str, list[int] | None] | None:
        """The shared tensors the attack's relative distance was measured on, when not all of
        them (name -> None: the whole tensor, or the rows): the noise floor is then computed on
        those (defenses/floor.py). None: every shared tensor."""
        return None

    def undefended(self) -> "Case":
        """The positive control's case for an update file: the same model and true data shared
        without the defenses (ConfigError where the files do not determine it)."""
        raise ConfigError(f"no positive control for a {type(self).__name__} update file")

    @abstractmethod
    def metrics(self, cfg: AttackConfig, recon: Any, device: torch.device) -> dict[str, Any]:
        """metrics.json's case part: what leaked, scored against the truth when there is one."""

    @abstractmethod
    def recorded_config(self, cfg: AttackConfig) -> dict[str, Any]:
        """The config values this case stands for (an update file's, the model's name, the batch
        size a default resolved to): config.json records them, not the flags' defaults."""

    @abstractmethod
    def write_files(self, folder: Path, recon: Any) -> None:
        """The case's own files in the run folder (reconstruction images / sentences)."""

    def render_report(self, folder: Path) -> None:
        """report.html of the run folder (the modality's renderer)."""
        self.spec.render_report(folder)

    @abstractmethod
    def file_bytes(self) -> tuple[bytes, bytes | None]:
        """The update file's bytes and the truth file's (None without a truth)."""

    def save(self, update_path: Path, truth_path: Path | None, *, force: bool = False,
             names: tuple[str, str] = ("--out", "--truth")) -> None:
        """``gradleak share``: the update file (and the truth file) of this case, written all or
        none (each through a temporary file, renamed into place with SIGINT/SIGTERM held).
        ``force`` False: an existing file is refused (ConfigError "``names[i]`` PATH exists; pass
        --force to replace it") and nothing is written; True replaces them."""
        from ..fl.files import save_shared

        update_data, truth_data = self.file_bytes()
        save_shared(update_data, update_path, truth_data if truth_path is not None else None, truth_path,
                    force=force, names=names)

    #: how the update is named in messages ("update", "text update")
    kind: ClassVar[str] = "update"

    def share_line(self, update_path: Path, truth_path: Path | None) -> str:
        meta = self.update.meta
        return (f"wrote {update_path}: {meta.threat.get('name')} {self.kind} of model {meta.model}, batch "
                f"{meta.batch_size}, loss {meta.loss:.4f}"
                + (f", defenses {', '.join(meta.defenses)}" if meta.defenses else "")
                + (f"; truth in {truth_path}" if truth_path else ""))

    @property
    def observed_key(self) -> str:
        return self.history_columns[-1] if self.history_columns else "observed"


class Observer:
    """Watches an attack's current answer against the truth the case holds (the attack never
    sees it): ``points`` {iteration: score}; resumable runs save and restore them."""

    def __init__(self) -> None:
        self.points: dict[int, float] = {}

    def get_state(self) -> dict[str, Any]:
        return {"points": dict(self.points)}

    def set_state(self, state: dict[str, Any]) -> None:
        from ..engine import StateFileError

        points = state.get("points")
        if not isinstance(points, dict) or not all(isinstance(k, int) and isinstance(v, float) for k, v in points.items()):
            raise StateFileError(f"the saved {type(self).__name__} observations are malformed")
        self.points = dict(points)


# The threat model's flags and the threats they describe: given for another threat (with a value
# other than the default), a flag would be ignored, so it is an error.
THREAT_FLAGS = {"local_steps": "fedavg", "local_batch_size": "fedavg", "local_lr": "fedavg",
                "clients": "aggregate", "inner": "aggregate"}
# The FedAvg client's local training (fl.optim, fl.augment): fedavg flags too; with --update the
# file decides them (a record without them is plain SGD)
LOCAL_TRAINING_FIELDS = ("local_epochs", "local_optimizer", "local_momentum", "local_nesterov", "local_weight_decay",
                         "local_betas", "local_eps", "local_augment", "local_crop_padding")
THREAT_FLAGS.update(dict.fromkeys(LOCAL_TRAINING_FIELDS, "fedavg"))
# flags that apply only with another one: (field, what it needs, is it met)
_NEEDS = (("local_betas", "--local-optimizer adam or adamw", lambda c: c.local_optimizer != "sgd"),
          ("local_eps", "--local-optimizer adam or adamw", lambda c: c.local_optimizer != "sgd"),
          ("local_crop_padding", "--local-augment crop-flip", lambda c: c.local_augment == "crop-flip"),
          ("local_steps", "no --local-epochs (which sets the steps: E x ceil(K / B))", lambda c: c.local_epochs is None))


def threat_model(cfg: AttackConfig) -> ThreatModel:
    """The client's threat model from the config (ConfigError for a flag it would ignore)."""
    fedavg = cfg.threat == "fedavg" or (cfg.threat == "aggregate" and cfg.inner == "fedavg")
    for name, threat in THREAT_FLAGS.items():
        default = AttackConfig.model_fields[name].get_default(call_default_factory=True)
        applies = fedavg if threat == "fedavg" else cfg.threat == "aggregate"
        if not applies and getattr(cfg, name) != default:
            where = "--threat fedavg (or --threat aggregate --inner fedavg)" if threat == "fedavg" \
                else "--threat aggregate"
            raise ConfigError(f"--{name.replace('_', '-')} applies to {where}, not to --threat {cfg.threat}"
                              + (f" --inner {cfg.inner}" if cfg.threat == "aggregate" else ""))
    defaults = {k: AttackConfig.model_fields[k].get_default() for k in LOCAL_TRAINING_FIELDS + ("local_steps",)}
    for name, needs, met in _NEEDS:
        if getattr(cfg, name) != defaults[name] and not met(cfg):
            raise ConfigError(f"--{name.replace('_', '-')} applies with {needs}")
    steps = cfg.local_steps if cfg.local_epochs is None else \
        ThreatModel.epoch_steps(cfg.batch_size, cfg.local_batch_size, cfg.local_epochs)
    if steps > ThreatModel.MAX_LOCAL_STEPS:
        raise ConfigError(f"--local-epochs {cfg.local_epochs} over {cfg.batch_size} samples are {steps} local steps, "
                          f"more than {ThreatModel.MAX_LOCAL_STEPS}")
    return ThreatModel(name=cfg.threat, local_steps=steps, local_batch_size=cfg.local_batch_size,
                       local_lr=cfg.local_lr, clients=cfg.clients if cfg.threat == "aggregate" else 1,
                       inner=cfg.inner, local_epochs=cfg.local_epochs, local_optimizer=cfg.local_optimizer,
                       local_momentum=cfg.local_momentum, local_nesterov=cfg.local_nesterov,
                       local_weight_decay=cfg.local_weight_decay, local_betas=parse_betas(cfg.local_betas),
                       local_eps=cfg.local_eps, local_augment=cfg.local_augment,
                       local_crop_padding=cfg.local_crop_padding)


def file_values(cfg: AttackConfig, meta: Any, decides: tuple[str, ...], client_only: tuple[str, ...]) -> dict[str, Any]:
    """The client-describing config values an update file stands for (its public metadata).
    With --update the file decides the fields ``decides``: given values must agree with the file;
    fields it does not record (the client's private choices, ``client_only``) may not be given
    at all; config.json then records the file's values (no flag is ignored). Raises
    ConfigError naming the first given flag that contradicts the file or does not apply."""
    rec = meta.threat if isinstance(meta.threat, dict) else {}
    name = str(rec.get("name", "fedsgd"))
    clients = int(rec.get("clients", 1)) if name == "aggregate" else 1
    inner = str(rec.get("inner", "fedsgd")) if name == "aggregate" else "fedsgd"
    per_client = meta.batch_size // clients
    fedavg = (inner if name == "aggregate" else name) == "fedavg"
    defaults = {k: f.get_default(call_default_factory=True) for k, f in AttackConfig.model_fields.items()}
    values: dict[str, Any] = {
        "model": meta.model, "width": meta.model_kwargs.get("width"), "batch_size": per_client,
        "image_size": meta.input_shape[1] if len(meta.input_shape) == 3 else None, "num_classes": meta.num_classes,
        "threat": name, "clients": clients, "inner": inner,
        "local_steps": int(rec.get("local_steps", 1)) if fedavg else defaults["local_steps"],
        "local_batch_size": rec.get("local_batch_size") if fedavg else defaults["local_batch_size"],
        "local_lr": float(rec.get("local_lr", defaults["local_lr"])) if fedavg else defaults["local_lr"],
        "share_bn_statistics": bool(meta.bn_statistics_shared),
        "server": meta.model_kwargs.get("server") or "honest",
    }
    for key in LOCAL_TRAINING_FIELDS:  # a record without them: plain SGD (files of before)
        values[key] = rec.get(key, defaults[key]) if fedavg else defaults[key]
    if fedavg and "local_betas" in rec:
        values["local_betas"] = ",".join(f"{float(b):g}" for b in rec["local_betas"])
    if fedavg and rec.get("local_epochs") is not None:
        values["local_steps"] = defaults["local_steps"]  # the file's steps follow from its epochs
    if fedavg and values["local_optimizer"] == "sgd":
        values["local_betas"], values["local_eps"] = defaults["local_betas"], defaults["local_eps"]
    decides = tuple(decides) + tuple(k for k in LOCAL_TRAINING_FIELDS if k not in decides)

    def agrees(key: str, given: Any) -> bool:
        if given == values[key]:
            return True
        if key == "server":  # "imprint" agrees with the file's resolved "imprint:bins=64,..."
            from ..server_spec import PARAMETERS, parse_server

            a, b = parse_server(given), parse_server(values[key])
            # a trap's "rate" is what the server calibrated its shrink for: the file records the shrink
            fields = [f for f in PARAMETERS.get(a.name, ()) if f != "rate"]
            return a.name == b.name and all(getattr(a, f) in (None, getattr(b, f)) for f in fields)
        if key == "local_batch_size" and fedavg:  # None means the whole client batch
            return (given or per_client) == (values[key] or per_client)
        # "use the file's / the data's" defaults agree with any recorded value
        return given is None and key in ("width", "image_size", "num_classes")

    for key in decides:
        given = getattr(cfg, key)
        if key in cfg.model_fields_set and not agrees(key, given):
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{flag} {given} does not match the update file, which records {values[key]!r}; "
                              f"with --update the file decides {flag} (leave it out)")
    for key in client_only:
        given = getattr(cfg, key)
        if key in cfg.model_fields_set and given != defaults[key] and not (key in values and given == values[key]):
            raise ConfigError(f"--{key.replace('_', '-')} describes the client and does not apply to an update file")
    return values


def defended_file_update(cfg: AttackConfig, update: SharedUpdate) -> SharedUpdate:
    """An update file's update after the --defense specs given with it (applied in order,
    seeded by --seed), as a server would see it had the client used them."""
    if not cfg.defense:
        return update
    from ..defenses import apply_defenses, parse_defenses

    return apply_defenses(update, parse_defenses(cfg.defense), torch.Generator().manual_seed(cfg.seed))


CaseBuilder = Callable[[AttackConfig], Case]
MODALITIES: dict[str, CaseBuilder] = {}


def modality(name: str) -> Callable[[CaseBuilder], CaseBuilder]:
    """Decorator registering the case builder of a modality (``--modality NAME``)."""
    def add(fn: CaseBuilder) -> CaseBuilder:
        MODALITIES[name] = fn
        return fn
    return add


def build_case(cfg: AttackConfig) -> Case:
    """The case ``cfg`` describes: a simulated client, or an update file as the attacker gets it."""
    import importlib

    importlib.import_module(modality_named(cfg.modality).plugin)  # the plug-in registers its builder
    try:
        builder = MODALITIES[cfg.modality]
    except KeyError:
        raise UnknownNameError(f"modality {cfg.modality!r} registers no case builder in its plug-in") from None
    return builder(cfg)


__all__ = ["Case", "MODALITIES", "Observer", "file_values", "THREAT_FLAGS", "threat_model", "build_case", "defended_file_update", "modality"]
