"""Plug-in declarations: each attack, defense, image model, server, text model and experiment
declares itself once, as a literal in its own module, read here without importing it; everything
else is derived from those declarations."""

from __future__ import annotations

import ast
import functools
import re
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

from .errors import ConfigError

KINDS = ("optimisation", "closed-form", "chooser")
KEYS = ("name", "summary", "kind", "converged_below", "needs", "flags")
OPTIONAL_KEYS = ("modality", "model_defaults", "default_note", "presets", "auto", "resolve", "changed_defaults",
                 "hashed_flags", "verdict_line", "cases", "shards", "one_start")
TYPES = ("int>=0", "float>0", "float>=0", "bool", "str", "optimisation attack")  # and "int[LOW,HIGH]"
INT_TYPE = re.compile(r"int\[(\d+),(\d+)\]")
# The packages whose modules may declare an attack (searched in this order), found as folders
# under the gradleak package without importing them (gradleak.text imports torch).
ATTACK_PACKAGES = ("gradleak.attacks", "gradleak.text.attacks")

# The constants several attacks share: type and help. An attack names the ones it reads, with its
# default, in its SPEC's "flags".
COMMON_FLAGS: dict[str, tuple[Any, str]] = {
    "iterations": ("int[0,10000000]", "optimisation steps"),
    "lr": ("float>0", "learning rate"),
    "optimizer": (["lbfgs", "adam", "sgd"], "optimizer"),
    "init": (["randn", "rand", "zeros"], "dummy image initialisation"),
    "dtype": (["float32", "float64"], "attack precision"),
    "labels": (["gradinversion", "sum", "counts", "llg", "idlg"], "label restoration"),
    "stall_restarts": ("int[0,100]", "DLG/iDLG: further starts (other inits) while the answer does not explain the "
                       "update"),
    "stop": (["settled", "budget"], "DLG/iDLG: end a start once its objective has settled below the verdict's line "
             "(settled), or run every --iterations step (budget)"),
}


# The text attacks' shared constants (their defaults depend on the text model: model_defaults).
TEXT_COMMON_FLAGS: dict[str, tuple[Any, str]] = {
    "iterations": ("int[0,10000000]", "optimisation steps"),
    "lr": ("float>0", "learning rate"),
    "optimizer": (["adam", "sgd", "lbfgs"], "optimizer"),
    "dtype": (["float32", "float64"], "attack precision"),
    "labels": (["soft", "bias"], "labels: soft (optimised with the sentences) or bias (one sentence: the class "
               "whose classifier-bias gradient is negative, exact)"),
    "search_evaluations": ("int>=0", "sentences the order search may score (0: none)"),
}
COMMON_BY_MODALITY: dict[str, dict[str, tuple[Any, str]]] = {"image": COMMON_FLAGS, "text": TEXT_COMMON_FLAGS}
# The flag that names one of a SPEC's "presets" (the values its other flags take where not given).
PRESET_FLAG = "preset"


@dataclass(frozen=True)
class Flag:
    """One attack constant as a flat flag: its type, the attack's default and help."""

    name: str
    type: Any
    default: Any
    help: str


@dataclass(frozen=True)
class AttackSpec:
    name: str
    module: str
    summary: str
    kind: str
    converged_below: float | None
    needs: str
    flags: dict[str, Flag]
    default_note: dict[str, str] = field(default_factory=dict)
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)
    auto: dict[str, Any] | None = None
    resolve: bool = False
    changed_defaults: dict[str, str] = field(default_factory=dict)
    modality: str = "image"
    model_defaults: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the flags every sweep cell's identity hashes even when unset (sweep/spec.py): those the cell
    # stores hashed when they took their present form; frozen, never extended
    hashed_flags: tuple[str, ...] = ()
    # the module defines verdict_line(settings): the family whose convergence line judges a run of
    # these settings (attacks/verdict.py), None for its own
    verdict_line: bool = False
    # flag -> value -> the run-config fields that value fills in where the user gives nothing
    # (config.py: e.g. a preset that also names its model, data and batch)
    cases: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    # the flag counting its independent runs, which --nproc spreads over processes (None: one process)
    shards: str | None = None
    # its flags' values for a single start (pipeline/truth_start.py: no further restarts)
    one_start: dict[str, Any] = field(default_factory=dict)

    def value_of(self, flag: str, values: Mapping[str, Any]) -> Any:
        """``flag``'s value in the flat config ``values``: given, else its preset's (PRESET_FLAG;
        an unknown one: the first), else its default."""
        if values.get(flag) is not None:
            return values[flag]
        return self.presets.get(str(values.get(PRESET_FLAG)), {}).get(flag, self.flags[flag].default)

    def defaults_for(self, model: str) -> dict[str, Any]:
        """The defaults that depend on the attacked model (the first model's for any other)."""
        if not self.model_defaults:
            return {}
        return dict(self.model_defaults.get(model, next(iter(self.model_defaults.values()))))

    @property
    def closed_form(self) -> bool:
        return self.kind == "closed-form"

    @property
    def optimisation(self) -> bool:
        return self.kind == "optimisation"


def read_spec(path: Path, module: str) -> AttackSpec | None:
    """The attack ``SPEC`` literal declared at the top level of the module file ``path`` (None when
    it declares none). ConfigError when the literal is not a valid spec."""
    literal = read_literal(path, "SPEC")
    return None if literal is None else make_spec(literal, module, str(path))


def make_spec(literal: Any, module: str, where: str = "") -> AttackSpec:
    """An AttackSpec from a SPEC literal (ConfigError naming ``where`` when it is not one)."""
    where = where or module
    if not isinstance(literal, dict):
        raise ConfigError(f"{where}: SPEC must be a dict")
    missing = [k for k in KEYS if k not in literal]
    unknown = [k for k in literal if k not in KEYS + OPTIONAL_KEYS]
    if missing or unknown:
        raise ConfigError(f"{where}: SPEC " + (f"lacks {', '.join(missing)}" if missing else
                                               f"has unknown keys {', '.join(unknown)}"))
    if literal["kind"] not in KINDS:
        raise ConfigError(f"{where}: SPEC kind {literal['kind']!r} is not one of {', '.join(KINDS)}")
    modality = literal.get("modality", "image")
    if modality not in COMMON_BY_MODALITY:
        raise ConfigError(f"{where}: SPEC modality {modality!r} is not one of {', '.join(COMMON_BY_MODALITY)}")
    presets = dict(literal.get("presets") or {})
    flags = _flags(dict(literal["flags"]), presets, COMMON_BY_MODALITY[modality], where)
    model_defaults = {str(m): dict(v) for m, v in dict(literal.get("model_defaults") or {}).items()}
    for label, values in (*((f"preset {p!r}", v) for p, v in presets.items()),
                          *((f"model_defaults {m!r}", v) for m, v in model_defaults.items())):
        extra = set(values) - set(flags)
        if extra:
            raise ConfigError(f"{where}: {label} sets {', '.join(sorted(extra))}, which are not its flags")
    hashed = tuple(literal.get("hashed_flags") or ())
    if set(hashed) - set(flags):
        raise ConfigError(f"{where}: hashed_flags names {', '.join(sorted(set(hashed) - set(flags)))}, which are "
                          "not its flags")
    cases = {str(f): {str(v): dict(c) for v, c in dict(by_value).items()} for f, by_value in
             dict(literal.get("cases") or {}).items()}
    one_start, shards = dict(literal.get("one_start") or {}), literal.get("shards")
    named = {*cases, *one_start, *([shards] if shards is not None else [])}
    if named - set(flags):
        raise ConfigError(f"{where}: cases, shards or one_start name {', '.join(sorted(map(str, named - set(flags))))}, "
                          "which are not its flags")
    return AttackSpec(name=literal["name"], module=module, summary=literal["summary"], kind=literal["kind"],
                      converged_below=literal["converged_below"], needs=literal["needs"], flags=flags,
                      default_note=dict(literal.get("default_note") or {}), presets=presets,
                      auto=literal.get("auto"), resolve=bool(literal.get("resolve", False)),
                      changed_defaults=dict(literal.get("changed_defaults") or {}), modality=modality,
                      model_defaults=model_defaults, hashed_flags=hashed,
                      verdict_line=bool(literal.get("verdict_line", False)), cases=cases, shards=shards,
                      one_start=one_start)


def _flags(declared: dict[str, Any], presets: dict[str, dict[str, Any]], common: dict[str, tuple[Any, str]],
           where: str) -> dict[str, Flag]:
    """A SPEC's flags: a common one (its modality's) by its default, any other as [type, default, help]."""
    flags = {}
    for name, value in declared.items():
        if isinstance(value, list) and len(value) == 3 and name not in common:
            kind, default, help_ = value
        elif name in common:
            (kind, help_), default = common[name], value
        else:
            raise ConfigError(f"{where}: flag {name!r} is not a common one: declare it as [type, default, help]")
        if presets:
            default = next(iter(presets.values())).get(name, default)
        if not (kind in TYPES or (isinstance(kind, str) and INT_TYPE.fullmatch(kind))
                or (isinstance(kind, list) and all(isinstance(k, str) for k in kind))):
            raise ConfigError(f"{where}: flag {name!r} has an unknown type {kind!r}")
        flags[name] = Flag(name, kind if isinstance(kind, str) else tuple(kind), default, help_)
    return flags


def _package_folders(package: str) -> list[Path]:
    """The folders of ``package`` (e.g. gradleak.text.attacks), found from the top package's
    location without importing any package below it."""
    top, *rest = package.split(".")
    found = importlib.util.find_spec(top)  # gradleak itself imports no torch
    if found is None or not found.submodule_search_locations:
        return []
    return [Path(loc, *rest) for loc in found.submodule_search_locations if Path(loc, *rest).is_dir()]


@functools.cache
def _all_specs() -> dict[tuple[str, str], AttackSpec]:
    """Every attack declared in ATTACK_PACKAGES, by (modality, name), read without importing them."""
    specs: dict[tuple[str, str], AttackSpec] = {}
    for package in ATTACK_PACKAGES:
        for folder in _package_folders(package):
            for path in sorted(folder.glob("*.py")):
                spec = read_spec(path, f"{package}.{path.stem}")
                if spec is None:
                    continue
                key = (spec.modality, spec.name)
                if key in specs:
                    raise ConfigError(f"{spec.modality} attack {spec.name!r} is declared twice: {specs[key].module} "
                                      f"and {spec.module}")
                specs[key] = spec
    return specs


def attack_specs(modality: str = "image") -> dict[str, AttackSpec]:
    """The attacks of ``modality`` by name (sorted), read without importing them."""
    return dict(sorted((name, spec) for (m, name), spec in _all_specs().items() if m == modality))


def closed_forms() -> tuple[str, ...]:
    """The closed-form attacks in the order ``auto`` tries them."""
    specs = [s for s in attack_specs().values() if s.closed_form]
    return tuple(s.name for s in sorted(specs, key=lambda s: (s.auto or {}).get("order", 99)))


def portfolio_candidates() -> tuple[str, ...]:
    """The optimisation attacks ``auto`` may run when no closed form explains the update, in its order."""
    specs = [s for s in attack_specs().values() if s.optimisation and s.auto is not None]
    return tuple(s.name for s in sorted(specs, key=lambda s: s.auto.get("order", 99)))  # type: ignore[union-attr]


def annotation(kind: Any) -> tuple[Any, dict[str, Any]]:
    """The Python type and pydantic Field constraints of a flag of type ``kind``."""
    if isinstance(kind, tuple):
        return Literal[kind], {}  # type: ignore[valid-type]
    if kind == "optimisation attack":
        return Literal[portfolio_candidates()], {}  # type: ignore[valid-type]
    match = INT_TYPE.fullmatch(kind)
    if match:
        return int, {"ge": int(match.group(1)), "le": int(match.group(2))}
    return {"int>=0": (int, {"ge": 0}), "float>0": (float, {"gt": 0, "allow_inf_nan": False}),
            "float>=0": (float, {"ge": 0, "allow_inf_nan": False}),
            "bool": (bool, {}), "str": (str, {})}[kind]


def flat_flags() -> dict[str, Flag]:
    """Every attack constant, of every modality, as one flat flag (the CLI's): the first
    declaration's type (choice lists of different attacks joined: text's optimizers are image's
    too), the help texts of the attacks that read it (joined when they differ), no default (each
    attack has its own). ConfigError when two attacks declare one flag with other types."""
    flags: dict[str, Flag] = {}
    helps: dict[str, list[str]] = {}
    order = [*COMMON_FLAGS]
    for modality in COMMON_BY_MODALITY:
        for spec in attack_specs(modality).values():
            for name, flag in spec.flags.items():
                if name not in order:
                    order.append(name)
                kind = flag.type
                if name in flags and flags[name].type != kind:
                    if not (isinstance(kind, tuple) and isinstance(flags[name].type, tuple)):
                        raise ConfigError(f"flag --{name.replace('_', '-')}: {spec.name} declares type {kind!r}, "
                                          f"another attack {flags[name].type!r}")
                    flags[name] = Flag(name, tuple(dict.fromkeys((*flags[name].type, *kind))), None, "")
                flags.setdefault(name, flag)
                if flag.help not in helps.setdefault(name, []):
                    helps[name].append(flag.help)
    return {name: Flag(name, flags[name].type, None, "; ".join(helps[name])) for name in order if name in flags}


def attacker_fields() -> frozenset[str]:
    """The flat run-config fields that configure the attacker, not the client: the attack's name
    and every constant an attack of any modality declares (the rest is the client's)."""
    return frozenset({"attack", *flat_flags()})


def hashed_flags() -> frozenset[str]:
    """The attack constants every sweep cell identity hashes even when unset (each SPEC's
    ``hashed_flags``); any other constant counts only when it is set (sweep/spec.py)."""
    return frozenset(f for m in COMMON_BY_MODALITY for spec in attack_specs(m).values() for f in spec.hashed_flags)


def attacks_run(values: Mapping[str, Any]) -> tuple[str, ...]:
    """The image attacks a run of the flat config ``values`` may run: its attack; for a chooser,
    the attack its "optimisation attack" flag names when given, else itself and every portfolio
    candidate (sorted)."""
    attack = values.get("attack")
    spec = attack_specs().get(str(attack))
    if spec is None or spec.kind != "chooser":
        return (attack,)  # type: ignore[return-value]
    named = [values[f] for f, flag in spec.flags.items() if flag.type == "optimisation attack" and values.get(f)]
    return (named[0],) if named else (spec.name, *sorted(portfolio_candidates()))


def readers(flag: str) -> tuple[str, ...]:
    """The attacks that read the constant ``flag``."""
    return tuple(name for name, spec in attack_specs().items() if flag in spec.flags)


def flag_cases(modality: str | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """flag -> value -> the run-config fields it fills in where not given (each SPEC's "cases"),
    of the attacks of ``modality`` (None: every modality)."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for m in COMMON_BY_MODALITY if modality is None else (modality,):
        for spec in attack_specs(m).values():
            for flag, by_value in spec.cases.items():
                found.setdefault(flag, {}).update(by_value)
    return found


def case_fields(values: Mapping[str, Any], *, update: bool) -> dict[str, Any]:
    """The run-config fields the case flags (flag_cases) given in ``values`` fill in. On an update
    file only the attack: the file decides the model, batch and BN statistics, and no data is read
    without --truth, so a recorded named source would be refused on rerun."""
    case: dict[str, Any] = {}
    for flag, by_value in flag_cases().items():
        case.update(by_value.get(str(values.get(flag)), {}))
    return {k: v for k, v in case.items() if k == "attack"} if update else case


def member_flags() -> tuple[str, ...]:
    """The flags that name the one attack a chooser runs (type "optimisation attack": auto's)."""
    return tuple(dict.fromkeys(f for spec in attack_specs().values() for f, flag in spec.flags.items()
                               if flag.type == "optimisation attack"))


def preset_names() -> tuple[str, ...]:
    """Every image attack's preset names (SPEC "presets", named by PRESET_FLAG), sorted."""
    return tuple(sorted({p for spec in attack_specs().values() for p in spec.presets}))


# ---------------------------------------------------------------- the other plug-in kinds
# Each kind: the packages whose modules declare it, the module-level literal they declare it with
# (a dict, or a list of dicts for a module that declares several), and the keys a declaration must
# and may hold. Read from the source like the attacks' SPECs, so that the catalog, `--help`,
# `gradleak list` and "did you mean" need no torch.
PLUGIN_KINDS: dict[str, tuple[tuple[str, ...], str, tuple[str, ...], tuple[str, ...]]] = {
    # accepts: the opt-in options it takes (experiments/base.py); modality "text": its cells are
    # text (its --model and --attacks name text models and attacks)
    "experiment": (("gradleak.experiments",), "SPEC", ("name", "summary"), ("accepts", "modality")),
    # class: the Defense subclass in its module; parameters: field -> [type ("float", "int", "str"),
    # required, [minimum, inclusive] or None, [maximum, inclusive] or None, choices]; positional:
    # the field a bare value fills; example: a valid spec; averages (default true): its noise floor
    # averages over aggregated clients; unmodelled: the part of it the noise floor does not model
    "defense": (("gradleak.defenses",), "SPEC", ("name", "summary", "class", "parameters"),
                ("positional", "example", "averages", "unmodelled")),
    # build: the name of its builder in the module, build(num_classes, channels, image_size,
    # **kwargs) -> nn.Module; image_size: its default side; mean, std: its input normalisation
    "model": (("gradleak.models",), "SPEC", ("name", "summary", "build", "image_size", "mean", "std"), ()),
    # a malicious (or the honest) server's modification of the global model (--server NAME[:...]);
    # SERVER_SPEC, since its modules sit beside the models' in models/. parameters: its keys, the
    # first one the value a bare number fills (server_spec.py parses them); integers: those taking
    # an integer; exclusive: [key, key, why] pairs not to give together; example: a valid --server
    # text; build: the name of its builder in the module, build(spec, **given parameters) ->
    # ModelSpec (none: the global model as it is)
    "server": (("gradleak.models",), "SERVER_SPEC", ("name", "summary"),
               ("parameters", "integers", "exclusive", "example", "build")),
    # a modality (--modality NAME), MODALITY_SPEC in the module that registers its case builder
    # (pipeline/<name>.py); the keys are modalities.Modality's, its callables (share, report,
    # summary_lines) named as functions of that module; default: a record naming no modality is its
    "modality": (("gradleak.pipeline",), "MODALITY_SPEC",
                 ("name", "summary", "share", "report", "attack_kind", "model_kind", "files", "summary_keys",
                  "measures", "nothing"),
                 ("model_extra", "data_sources", "own_fields", "refuses", "default_attack", "run_prefix", "no_value",
                  "data_label", "summary_lines", "verdict_family", "portfolio_keys", "default",
                  "update_format")),
    # build: the name of its builder in the module, build(num_classes, seed) -> TextModel
    "text model": (("gradleak.text",), "SPEC", ("name", "summary", "build"), ()),
}


@dataclass(frozen=True)
class Declaration:
    """One plug-in's declaration: its kind, name, module, one-line summary and every key it gave."""

    kind: str
    name: str
    module: str
    summary: str
    values: dict[str, Any]

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


def read_literal(path: Path, variable: str) -> Any:
    """The literal assigned to ``variable`` at the top level of the module file ``path`` (None when
    there is none); ConfigError when it is not a literal."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == variable for t in node.targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError as exc:
                raise ConfigError(f"{path}: {variable} must be a literal (strings, numbers, lists, dicts): "
                                  f"{exc}") from None
    return None


def make_declaration(kind: str, literal: Any, module: str, where: str = "") -> Declaration:
    """A Declaration of ``kind`` from one declared dict (ConfigError naming ``where`` when it is not one)."""
    where = where or module
    _, variable, required, optional = PLUGIN_KINDS[kind]
    if not isinstance(literal, dict):
        raise ConfigError(f"{where}: each {kind} {variable} must be a dict")
    missing = [k for k in required if k not in literal]
    unknown = [k for k in literal if k not in required + optional]
    if missing or unknown:
        raise ConfigError(f"{where}: {kind} {variable} " + (f"lacks {', '.join(missing)}" if missing else
                                                            f"has unknown keys {', '.join(map(str, unknown))}"))
    if not all(isinstance(literal[k], str) and literal[k].strip() for k in ("name", "summary")):
        raise ConfigError(f"{where}: {kind} {variable} name and summary must be non-empty strings")
    if literal.get("modality", "image") not in COMMON_BY_MODALITY:
        raise ConfigError(f"{where}: {kind} {literal['name']!r} modality {literal['modality']!r} is not one of "
                          f"{', '.join(COMMON_BY_MODALITY)}")
    _check_values(kind, literal, where)
    return Declaration(kind, literal["name"], module, literal["summary"], dict(literal))


def _check_values(kind: str, literal: dict[str, Any], where: str) -> None:
    """The kind's own keys of a declaration: a defense's parameters, a model's size and
    normalisation, a server's parameter names."""
    names = lambda k: isinstance(literal.get(k, []), list) and all(isinstance(v, str) for v in literal.get(k, []))  # noqa: E731
    if kind == "defense":
        _check_parameters(literal, where)
    if kind == "model" and not (isinstance(literal["image_size"], int) and 4 <= literal["image_size"] <= 1024
                                and all(isinstance(literal[k], list) and literal[k]
                                        and all(isinstance(v, (int, float)) for v in literal[k]) for k in ("mean", "std"))
                                and all(v > 0 for v in literal["std"])):
        raise ConfigError(f"{where}: model {literal['name']!r} needs an image_size in 4..1024 and mean and std lists of "
                          "numbers (std > 0)")
    if kind == "server":
        _check_server(literal, where, names)
    if kind == "modality":
        _check_modality(literal, where, names)


def _check_server(literal: dict[str, Any], where: str, names: Callable[[str], bool]) -> None:
    """A server declaration's parameter names, integers and exclusive pairs (among its parameters)."""
    params = set(literal.get("parameters", []))
    if not (names("parameters") and names("integers") and set(literal.get("integers", [])) <= params):
        raise ConfigError(f"{where}: server {literal['name']!r} parameters and integers must be lists of names "
                          "(integers among its parameters)")
    pairs = literal.get("exclusive", [])
    if not (isinstance(pairs, list) and all(isinstance(p, list) and len(p) == 3 and all(isinstance(v, str) for v in p)
                                            and {p[0], p[1]} <= params for p in pairs)
            and isinstance(literal.get("build", ""), str)):
        raise ConfigError(f"{where}: server {literal['name']!r} exclusive must list [parameter, parameter, why] and "
                          "build name its builder")


def _check_modality(literal: dict[str, Any], where: str, names: Callable[[str], bool]) -> None:
    """A modality declaration: its callables named (functions of its module), its lists of names,
    its refusals as [[field, ...], why] and what it measures."""
    refuses = literal.get("refuses", [])
    if not (all(isinstance(literal.get(k, "f"), str) and literal.get(k, "f").isidentifier()
                for k in ("share", "report", "summary_lines"))
            and all(names(k) for k in ("summary_keys", "own_fields", "portfolio_keys"))
            and isinstance(refuses, list) and all(isinstance(r, list) and len(r) == 2 and isinstance(r[0], list)
                                                  and all(isinstance(f, str) for f in r[0]) and isinstance(r[1], str)
                                                  for r in refuses)
            and literal["measures"] in ("images", "tokens")):
        raise ConfigError(f"{where}: modality {literal['name']!r} needs share, report and summary_lines naming "
                          "functions of its module, lists of names, refuses as [[field, ...], why] and measures "
                          "'images' or 'tokens'")


def _check_parameters(literal: dict[str, Any], where: str) -> None:
    """A defense declaration's parameters: each [type, required, minimum, maximum, choices]."""
    params = literal["parameters"]
    bound = lambda b: b is None or (isinstance(b, list) and len(b) == 2 and isinstance(b[1], bool))  # noqa: E731
    if not isinstance(params, dict) or not all(
            isinstance(p, list) and len(p) == 5 and p[0] in ("float", "int", "str") and isinstance(p[1], bool)
            and bound(p[2]) and bound(p[3]) and isinstance(p[4], list) for p in params.values()):
        raise ConfigError(f"{where}: defense {literal['name']!r} parameters must map each field to [type (float, int, "
                          "str), required, [minimum, inclusive] or None, [maximum, inclusive] or None, choices]")
    if literal.get("positional") is not None and literal["positional"] not in params:
        raise ConfigError(f"{where}: defense {literal['name']!r} positional {literal['positional']!r} is not one of "
                          "its parameters")


@functools.cache
def declarations(kind: str) -> dict[str, Declaration]:
    """Every ``kind`` plug-in (see PLUGIN_KINDS) by name, in the order its modules (sorted) declare
    them, read without importing them. ConfigError for a bad or twice-declared one."""
    if kind not in PLUGIN_KINDS:
        raise ConfigError(f"unknown plug-in kind {kind!r}; known: {', '.join(PLUGIN_KINDS)}")
    packages, variable = PLUGIN_KINDS[kind][:2]
    found: dict[str, Declaration] = {}
    for package in packages:
        for folder in _package_folders(package):
            for path in sorted(folder.glob("*.py")):
                literal = read_literal(path, variable)
                for item in (literal if isinstance(literal, list) else [] if literal is None else [literal]):
                    decl = make_declaration(kind, item, f"{package}.{path.stem}", str(path))
                    if decl.name in found:
                        raise ConfigError(f"{kind} {decl.name!r} is declared twice: {found[decl.name].module} and "
                                          f"{decl.module}")
                    found[decl.name] = decl
    return found


__all__ = ["ATTACK_PACKAGES", "Declaration", "PLUGIN_KINDS", "declarations", "make_declaration", "read_literal", "AttackSpec", "annotation", "attacker_fields", "attacks_run", "hashed_flags", "COMMON_BY_MODALITY", "COMMON_FLAGS", "TEXT_COMMON_FLAGS", "Flag", "attack_specs", "closed_forms",
           "flat_flags", "make_spec", "portfolio_candidates", "read_spec", "readers", "PRESET_FLAG", "case_fields",
           "member_flags", "flag_cases", "preset_names"]
