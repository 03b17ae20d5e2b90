"""The run configuration: one typed model; every CLI flag of `gradleak attack` is a field here.
Each run saves its full resolved config as config.json, and `gradleak attack --config FILE` reruns it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from .catalog import IMAGE_ATTACKS, TEXT_ATTACKS
from .errors import ConfigError, GradleakError, InputFileError
from .paths import MAX_JSON_DEPTH, check_tree, name_max, one_line, read_text_file
from .server_spec import server_usage
from .specs import declarations

# The largest seed: torch's generators take seeds below 2**64, and the attacks and clients add
# offsets to the seed they are given (restarts, trials, noise streams, clients), so one bit is
# left for them. Every seed a config, an experiment or a file gives is bounded by it.
MAX_SEED = 2**63 - 1
# The declared modalities (each module's MODALITY_SPEC, read without importing it): --modality's choices.
MODALITY_NAMES = tuple(declarations("modality"))
# Config fields that name files or folders: a NUL byte makes every file system call fail.
PATH_FIELDS = ("data", "data_root", "checkpoint", "update", "truth", "out")


def parse_betas(text: str) -> tuple[float, float]:
    """"b1,b2" -> (b1, b2), each in [0, 1) (torch.optim.Adam's betas); ValueError otherwise."""
    parts = text.split(",")
    try:
        betas = tuple(float(p) for p in parts)
    except ValueError:
        raise ValueError(f"{text!r} is not two numbers b1,b2") from None
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ValueError(f"{text!r} is not two numbers b1,b2 in [0, 1)")
    return betas  # type: ignore[return-value]


class _RunConfig(BaseModel):
    """Everything one attack run needs but the attacks' own constants (AttackConfig adds them)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # what is attacked
    modality: Literal[MODALITY_NAMES] = Field("image", description="what the client trains on: "  # type: ignore[valid-type]
                                             f"{' | '.join(MODALITY_NAMES)}")
    # The default is the worst case an auditor asks for first (closed form first):
    # auto runs the closed-form attacks that apply and falls back to optimisation (attacks/auto.py).
    attack: str = Field("auto", description=f"attack: {' | '.join(IMAGE_ATTACKS)} (text: {' | '.join(TEXT_ATTACKS)})")
    model: str = Field("lenet-dlg", description="victim model name, or package.module:callable")
    width: int | None = Field(None, ge=1, le=4096, description="model width (convnet, mlp)")
    data: str = Field("cifar10-samples", description="data source name or an ImageFolder / IDX folder")
    data_root: str | None = Field(None, description="folder overriding a named source's location")
    split: Literal["train", "test"] = Field("train", description="data split (fashion-mnist)")
    batch_size: int = Field(1, ge=1, le=4096, description="client batch size K")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="seed: the batch drawn and the attack's random start")
    model_seed: int = Field(0, ge=0, le=MAX_SEED, description="seed of the model's random weights")
    allow_repeats: bool = Field(False, description="allow repeated labels within a batch")
    indices: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=4096,
                               description="attack these items of the data source, in this order, instead of a "
                                           "draw by --seed (repeatable)")
    image_size: int | None = Field(None, ge=4, le=1024, description="input size (default: the model's)")
    num_classes: int | None = Field(None, ge=2, le=100000, description="classes (default: the data's)")
    share_bn_statistics: bool = Field(False, description="the client also shares its batch's BN statistics")
    threat: Literal["fedsgd", "fedavg", "aggregate"] = Field("fedsgd", description="what the client shares")
    local_steps: int = Field(1, ge=1, le=10000, description="fedavg: local SGD steps")
    local_batch_size: int | None = Field(None, ge=1, description="fedavg: local mini-batch size (default: all)")
    local_lr: float = Field(0.01, gt=0, description="fedavg: local learning rate")
    local_epochs: int | None = Field(None, ge=1, le=1000, description="fedavg: epochs over the client's "
                                     "--batch-size samples in mini-batches of --local-batch-size, reshuffled privately "
                                     "each epoch (instead of --local-steps; default: use --local-steps)")
    local_optimizer: Literal["sgd", "adam", "adamw"] = Field("sgd", description="fedavg: the client's torch.optim "
                                                             "optimizer: sgd | adam | adamw")
    local_momentum: float = Field(0.0, ge=0, lt=1, description="fedavg, sgd: momentum (torch.optim.SGD, dampening 0)")
    local_nesterov: bool = Field(False, description="fedavg, sgd: Nesterov momentum (needs --local-momentum)")
    local_weight_decay: float = Field(0.0, ge=0, le=1, description="fedavg: weight decay (sgd, adam: L2 added to "
                                      "the gradient; adamw: decoupled)")
    local_betas: str = Field("0.9,0.999", description="fedavg, adam/adamw: beta1,beta2, each in [0, 1)")
    local_eps: float = Field(1e-8, gt=0, le=1, description="fedavg, adam/adamw: eps (torch's default)")
    local_augment: Literal["none", "flip", "crop-flip"] = Field("none", description="fedavg: the client's private "
                                                                 "augmentation: none | flip | crop-flip (random crop "
                                                                 "with zero padding, then a horizontal flip)")
    local_crop_padding: int = Field(4, ge=0, le=64, description="fedavg, crop-flip: padding in pixels")
    clients: int = Field(1, ge=1, le=1024, description="aggregate: clients averaged (each --batch-size)")
    inner: Literal["fedsgd", "fedavg"] = Field("fedsgd", description="aggregate: what each client runs")
    checkpoint: str | None = Field(None, description="attack a model checkpoint (safetensors, from gradleak train)")
    server: str = Field("honest", description=f"what the server sends the client: {server_usage()} (N an integer, X a "
                        "number; `gradleak list` says what each server does)")
    defense: list[str] = Field(default_factory=list, description="defense spec, repeatable (e.g. gaussian:1e-3)")
    text: list[str] = Field(default_factory=list, description="text: one sentence of the client's data, repeatable")
    # the attack: its constants are flags too, derived from the attacks' declarations (specs.py,
    # attack_flag_fields below); these are shared with the text attacks
    labels: str | None = Field(None, description="label restoration: gradinversion | sum | counts | llg | idlg "
                               "(idlg: batch 1 only); text: soft | bias")
    search_evaluations: int | None = Field(None, ge=0, le=100_000_000,
                                           description="text dlg: sentences the order search may score (0: none)")
    nproc: int = Field(1, ge=1, le=256, description="GradInversion: processes the seeds are spread over "
                       "(torch.distributed; under torchrun leave it out: WORLD_SIZE)")
    # files and output
    update: str | None = Field(None, description="attack this shared-update file instead of simulating a client")
    truth: str | None = Field(None, description="truth file of that update, for evaluation")
    out: str | None = Field(None, description="run folder (default runs/<time>-<attack>)")
    device: str = Field("cpu", description="cpu | cuda | cuda:N | auto")
    threads: int | None = Field(None, ge=1, le=512, description="torch CPU threads (default: torch's choice; "
                         "fewer when other work keeps cores busy)")
    log_every: int = Field(10, ge=1, description="observe PSNR every N iterations")
    checkpoint_every: int = Field(100, ge=0, le=10_000_000,
                                  description="save resumable state every N iterations (0: only on SIGINT/SIGTERM)")
    divergence_retries: int = Field(3, ge=0, le=100, description="on NaN/Inf: restarts from the last good state, "
                                    "lr x0.5 each, before the run stops as diverged")
    paper_metrics: bool = Field(True, description="compute the GradInversion paper's FFT2D, RPSNR, LPIPS and IIP")
    progress: bool = Field(True, description="show a progress bar")

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v not in ("cpu", "auto", "cuda") and not (v.startswith("cuda:") and v[5:].isdigit()):
            raise ValueError("must be cpu, cuda, cuda:N or auto")
        return v

    @field_validator("*", mode="after")
    @classmethod
    def _utf8(cls, v: Any) -> Any:
        # argv arrives with surrogate escapes for bytes that are not UTF-8: refuse them here,
        # once, rather than deep in a tokenizer or a path
        for text in (v if isinstance(v, list) else [v]):
            if isinstance(text, str):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    raise ValueError("is not valid UTF-8 text") from None
        return v

    @field_validator(*PATH_FIELDS)
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None:
            check_path_text(v)
        return v

    @field_validator("local_betas")
    @classmethod
    def _betas(cls, v: str) -> str:
        parse_betas(v)
        return v

    @field_validator("server")
    @classmethod
    def _server(cls, v: str) -> str:
        from .server_spec import parse_server  # torch-free: a bad --server is answered at once

        try:
            parse_server(v)
        except GradleakError as exc:
            raise ValueError(str(exc)) from None
        return v

    @model_validator(mode="after")
    def _modality_rules(self) -> "AttackConfig":
        from .modalities import modality_named  # torch-free: what each modality reads, refuses, defaults to

        modality = modality_named(self.modality)
        modality.check_config(self)  # a field only another modality reads, or one this one refuses
        if modality.default_attack is not None and "attack" not in self.model_fields_set:
            # The modality's own default attack ("auto" chooses among image attacks). Set without
            # validation so that it still counts as not given (pipeline.text.check_text_config).
            self.__dict__["attack"] = modality.default_attack
        # the case a flag's value names (specs.flag_cases: e.g. GradInversion's --preset imagenet),
        # for the fields not given; set like the modality's default attack, so that they still count
        # as not given
        for name, value in flag_case(self).items():
            if name not in self.model_fields_set:
                self.__dict__[name] = value
        return self


def flag_case(values: Any) -> dict[str, Any]:
    """What the case flags of ``values`` (a config, or a record's dict) fill in where the user gives
    nothing (specs.case_fields: on an update file only the attack)."""
    from .specs import case_fields, flag_cases

    get = values.get if isinstance(values, dict) else lambda name: getattr(values, name, None)
    return case_fields({f: get(f) for f in flag_cases()}, update=bool(get("update")))



def attack_flag_fields() -> dict[str, Any]:
    """Every attack's constants, image and text (specs.flat_flags), as flat config fields: None
    (the attack's default) unless given; ``init`` defaults to "randn" and a switch to off."""
    from .specs import annotation, flat_flags

    fields: dict[str, Any] = {}
    for name, flag in flat_flags().items():
        if name in _RunConfig.model_fields:
            continue
        kind, constraints = annotation(flag.type)
        if flag.type == "bool":
            fields[name] = (bool, Field(False, description=flag.help))
        elif name == "init":
            fields[name] = (kind, Field("randn", description=flag.help, **constraints))
        else:
            fields[name] = (kind | None, Field(None, description=flag.help, **constraints))
    return fields


# Everything one attack run needs. Field descriptions double as CLI help.
AttackConfig = create_model("AttackConfig", __base__=_RunConfig, __doc__="Everything one attack run needs. Field "
                            "descriptions double as CLI help.", **attack_flag_fields())

def check_path_text(text: str) -> None:
    """ValueError for a path no file system can hold: empty, with a NUL byte (a config file can
    hold one; a command line cannot), or with a name longer than its file system allows (every
    later look at it, even "does it exist?", would fail)."""
    if "\0" in text:
        raise ValueError("holds a NUL byte; no file or folder has such a name")
    if not text.strip():
        raise ValueError("is empty; give a file or folder path")
    path = Path(text)
    longest = max((len(os.fsencode(part)) for part in path.parts), default=0)
    limit = name_max(path.parent)
    if longest > limit:
        raise ValueError(f"has a name of {longest} bytes, too long for its file system (at most {limit})")


def config_error(exc: ValidationError) -> ConfigError:
    """One line naming the first invalid field."""
    err = exc.errors()[0]
    if not err["loc"] and err["type"] == "value_error":   # a check across fields: its own sentence
        return ConfigError(str(err["msg"]).removeprefix("Value error, "))
    field = ".".join(str(x) for x in err["loc"]) or "config"
    value = err.get("input")
    shown = "" if isinstance(value, (dict, list)) else f" (got {_short(value)})"
    return ConfigError(f"config field {field!r}: {err['msg']}{shown}")


def _short(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value.encode("utf-8", "surrogateescape") if isinstance(value, str) and not _is_utf8(value) else value)
    return one_line(text, 80)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def config_from_record(record: dict[str, Any]) -> AttackConfig:
    """A config rebuilt from a full record (a sweep or experiment cell): fields equal to their
    default count as not given, so that what a case decides when a flag is absent (an update
    file's values, a text batch of all --text sentences) is decided the same way as on the CLI.
    Under a flag that names a case (flag_case) the case's values are the defaults: a field the
    record holds at the plain default was given (e.g. batch 1 under --preset imagenet) and stays."""
    defaults = {k: f.get_default(call_default_factory=True) for k, f in AttackConfig.model_fields.items()}
    defaults.update(flag_case(record))
    return make_config(**{k: v for k, v in record.items() if k not in defaults or v != defaults[k]})


def make_config(**values: Any) -> AttackConfig:
    try:
        return AttackConfig(**values)
    except ValidationError as exc:
        raise config_error(exc) from None


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


# ---------------------------------------------------------------- config.json: the run and its attack
# A run folder's config.json holds two parts: "run", the run's own fields (what was attacked, how it
# ran), and "attack", the typed attack config that ran (attacks/configs.py, every constant resolved;
# auto's holds its portfolio). The flat attack fields exist only for argparse and sweep specs:
# flat_config turns the record back into them for --config and the dashboard.
RECORD_PARTS = ("run", "attack")


def attack_side_fields() -> frozenset[str]:
    """The flat fields the attack config carries: its name and every attack constant (specs.flat_flags)."""
    from .specs import flat_flags

    return frozenset({"attack", *flat_flags()})


def record_json(cfg: BaseModel, attack: dict[str, Any]) -> dict[str, Any]:
    """config.json of a run: ``cfg``'s run fields and ``attack``, the typed config that ran (a JSON dump)."""
    side = attack_side_fields()
    return {"run": {k: v for k, v in cfg.model_dump(mode="json").items() if k not in side}, "attack": attack}


def flat_config(raw: dict[str, Any], shown: str = "config") -> dict[str, Any]:
    """The flat fields of a config.json (``record_json``'s two parts; a flat record, as older runs
    wrote, is returned as it is). The attack's constants become flags again; of auto's portfolio,
    a member's name is the flag naming it (one member) and a constant every member that reads it
    holds at one value is that flag (several): re-resolving them gives the same members."""
    if set(raw) != set(RECORD_PARTS):
        return raw
    run, attack = raw["run"], raw["attack"]
    if not isinstance(run, dict) or not isinstance(attack, dict):
        raise ConfigError(f"{shown}: \"run\" and \"attack\" must hold JSON objects")
    clash = sorted(attack_side_fields() & set(run))
    if clash:
        raise ConfigError(f"{shown}: {one_line(repr(clash[0]), 80)} belongs under \"attack\", not \"run\"")
    flat = _flat_attack(attack, shown)   # the attack's name first, as the flat config orders it
    return {**run, **({"attack": flat.pop("attack")} if "attack" in flat else {}), **flat}


def _flat_attack(attack: dict[str, Any], shown: str) -> dict[str, Any]:
    from .specs import member_flags

    constants = {k: v for k, v in attack.items() if k not in ("seed", "portfolio")}
    members = attack.get("portfolio")
    if members is None:
        return constants
    if not isinstance(members, list) or not members or not all(isinstance(m, dict) for m in members):
        raise ConfigError(f"{shown}: the attack's \"portfolio\" must be a list of attack configs")
    if len(members) == 1:
        one = {k: v for k, v in members[0].items() if k not in ("attack", "seed")}
        return {**one, **constants, **dict.fromkeys(member_flags(), members[0].get("attack"))}
    values: dict[str, list[Any]] = {}
    for member in members:
        for k, v in member.items():
            if k not in ("attack", "seed"):
                values.setdefault(k, []).append(v)
    shared = {k: vs[0] for k, vs in values.items() if all(v == vs[0] for v in vs)}
    return {**shared, **constants}


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a config.json (as saved in a run folder) as a dict of fields; validated later."""
    p = Path(path)
    shown = one_line(str(p))
    try:
        raw = json.loads(read_text_file(p, "config file", max_bytes=1 << 20), object_pairs_hook=_no_duplicates)
    except InputFileError as exc:
        raise ConfigError(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config file {shown} is not valid JSON: {one_line(str(exc))}") from None
    except RecursionError:
        raise ConfigError(f"config file {shown} is nested too deeply") from None
    except _DuplicateKey as exc:
        raise ConfigError(f"config file {shown} gives the key {one_line(repr(exc.args[0]), 80)} twice") from None
    except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise ConfigError(f"config file {shown} is not valid JSON: {one_line(str(exc), 160)}") from None
    check_tree(raw, f"config file {shown}", max_depth=MAX_JSON_DEPTH, error=ConfigError)
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {shown} must hold a JSON object")
    # A run folder's config.json stores the resolved config under "config" next to provenance.
    if "config" in raw and isinstance(raw["config"], dict):
        raw = raw["config"]
    return flat_config(raw, f"config file {shown}")
