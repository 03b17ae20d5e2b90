"""The names a user can give, importable without torch: models, data sources, attacks, defenses,
servers, presets, text models and attacks, experiments, each with its one-line description."""

from __future__ import annotations

import difflib
from typing import Iterable

from .errors import UnknownNameError
from .specs import PRESET_FLAG, attack_specs, declarations, preset_names

# The image models: each module under models/ declares its own (a SPEC literal: name, summary,
# builder, size, normalisation).
MODELS: dict[str, str] = {name: d.summary for name, d in sorted(declarations("model").items())}
SOURCES: tuple[str, ...] = ("cifar10-samples", "cifar100-samples", "imagenet-samples", "fashion-mnist")
# The image attacks: each declares itself in its module under attacks/ (gradleak/specs.py reads the
# declarations without importing the modules).
IMAGE_ATTACKS: dict[str, str] = {name: spec.summary for name, spec in attack_specs().items()}
# The defenses: each declares itself (a SPEC literal: name, summary, class, parameters) in its module
# under defenses/.
DEFENSES: tuple[str, ...] = tuple(sorted(declarations("defense")))
DEFENSE_SUMMARIES: dict[str, str] = {name: d.summary for name, d in sorted(declarations("defense").items())}
# The servers (--server): each declares itself (a SERVER_SPEC literal: name, summary, parameters)
# in its module under models/.
SERVERS: tuple[str, ...] = tuple(sorted(declarations("server")))
SERVER_SUMMARIES: dict[str, str] = {name: d.summary for name, d in sorted(declarations("server").items())}
# The attacks' presets (each SPEC's "presets"), the names PRESET_FLAG takes.
PRESETS: tuple[str, ...] = preset_names()
# The text models: each module under text/ declares its own (a SPEC literal: name, summary, builder).
TEXT_MODELS: dict[str, str] = {name: d.summary for name, d in declarations("text model").items()}
# The text attacks: each declares itself in its module under text/attacks/ (read the same way).
TEXT_ATTACKS: dict[str, str] = {name: spec.summary for name, spec in attack_specs("text").items()}
# The experiments: each declares itself (a SPEC literal: name, summary, accepts, modality) in its
# module under experiments/ (specs.declarations reads them the same way).
EXPERIMENTS: dict[str, str] = {name: d.summary for name, d in declarations("experiment").items()}
# The experiments whose cells are all text (their --model and --attacks name text models and attacks).
TEXT_EXPERIMENTS: frozenset[str] = frozenset(name for name, d in declarations("experiment").items()
                                             if d.get("modality") == "text")

# What each kind of name is called in messages.
KINDS = {"model": MODELS, "data source": SOURCES, "attack": IMAGE_ATTACKS, "defense": DEFENSES,
         "server": SERVERS, PRESET_FLAG: PRESETS, "text model": TEXT_MODELS, "text attack": TEXT_ATTACKS,
         "experiment": EXPERIMENTS}


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """" (did you mean 'x'?)" for the known name closest to ``name``, or ""."""
    text = str(name).strip().lower()[:100]   # a hostile megabyte of text is not compared
    known = sorted(known)
    close = difflib.get_close_matches(text, known, n=1, cutoff=0.6)
    if not close and len(text) >= 3:   # a shortened name: 'cifar' for cifar10-samples, cifar100-samples
        close = [k for k in known if k.startswith(text)][:2]
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def unknown(kind: str, name: object, known: Iterable[str], extra: str = "") -> UnknownNameError:
    """The error for an unknown ``kind`` name: the name (cut to one short line), the closest
    known one, and the list of known names (``extra`` appended, e.g. "or a folder")."""
    from .paths.bounded import one_line

    known = sorted(known)
    return UnknownNameError(f"unknown {kind} {one_line(repr(name), 80)}{did_you_mean(name, known)}; known: "
                            f"{', '.join(known)}{extra}")


def check(kind: str, name: str, extra: str = "") -> str:
    """``name`` if it is a known ``kind`` name (see KINDS), else :func:`unknown`'s error."""
    known = KINDS[kind]
    if name not in known:
        raise unknown(kind, name, known, extra)
    return name


# ---------------------------------------------------------------- defense specs, checked without torch
# Each defense's parameters as its module under defenses/ declares them (its SPEC's parameters):
# (field, kind, required, (minimum, inclusive) or None, (maximum, inclusive) or None, choices).
# The CLI checks a --defense spec with them before torch loads; defenses/spec.py parses it again
# (tests/reliability/test_reliability4_files.py holds the two to the same answers).
Param = tuple[str, str, bool, "tuple[float, bool] | None", "tuple[float, bool] | None", tuple[str, ...]]


def _param(field: str, declared: list) -> Param:
    kind, required, low, high, choices = declared
    return (field, kind, required, None if low is None else (float(low[0]), low[1]),
            None if high is None else (float(high[0]), high[1]), tuple(choices))


DEFENSE_PARAMETERS: dict[str, tuple[str | None, tuple[Param, ...]]] = {
    name: (d.get("positional"), tuple(_param(f, p) for f, p in d.get("parameters").items()))
    for name, d in sorted(declarations("defense").items())}
# A valid spec of each defense that takes parameters (its name for one that takes none).
DEFENSE_EXAMPLES: dict[str, str] = {name: d.get("example", name) for name, d in sorted(declarations("defense").items())}


def check_defense(spec: object) -> str:
    """The name of a well-formed defense spec (``name[:value][,key=value...]``, its values within
    their bounds), else the ConfigError (UnknownNameError for the name) that defenses/spec.py's
    parse_defense gives, without importing torch."""
    from .errors import ConfigError
    from .paths.bounded import one_line

    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"defense spec must be a non-empty string like 'gaussian:0.01', got {one_line(repr(spec), 80)}")
    head, sep, rest = spec.strip().partition(":")
    name = head.strip().lower()
    if name not in DEFENSE_PARAMETERS:
        raise unknown("defense", head.strip(), DEFENSES, f" (in {one_line(repr(spec), 80)})")
    values = defense_values(name, spec, rest) if sep else {}
    params = {p[0]: p for p in DEFENSE_PARAMETERS[name][1]}
    missing = [f for f, p in params.items() if p[2] and f not in values]
    if missing:
        raise ConfigError(f"defense {name}: missing value for {', '.join(missing)} (e.g. {DEFENSE_EXAMPLES.get(name, name)})")
    for field, text in values.items():
        _check_defense_value(name, params[field], text)
    return name


def defense_values(name: str, spec: str, rest: str) -> dict[str, str]:
    """The ``key=value`` texts after the ':' of a spec (a bare first value fills the positional one):
    the spec grammar, shared by this torch-free check and defenses/spec.py's parser."""
    from .errors import ConfigError
    from .paths.bounded import one_line

    positional, params = DEFENSE_PARAMETERS[name]
    fields = [p[0] for p in params]
    if not rest.strip():
        raise ConfigError(f"defense {name}: missing value after ':' in {one_line(repr(spec), 80)}")
    if not fields:
        raise ConfigError(f"defense {name} takes no parameters, got {one_line(repr(spec), 80)}")
    values: dict[str, str] = {}
    for i, token in enumerate(t.strip() for t in rest.split(",")):
        if not token:
            raise ConfigError(f"defense {name}: empty parameter in {one_line(repr(spec), 80)}")
        key, eq, text = (s.strip() for s in token.partition("="))
        if not eq:
            if positional is None:
                raise ConfigError(f"defense {name}: bare value {one_line(repr(token), 80)}; write key=value pairs, e.g. "
                                  f"{DEFENSE_EXAMPLES.get(name, name)}")
            if i > 0:
                raise ConfigError(f"defense {name}: bare value {one_line(repr(token), 80)}; only the first parameter "
                                  f"({positional}) may be given without its key")
            key, text = positional, token
        if key not in fields:
            raise ConfigError(f"defense {name}: unknown parameter {key!r}; known: {', '.join(fields)}")
        if not text:
            raise ConfigError(f"defense {name}: missing value for {key}")
        if key in values:
            raise ConfigError(f"defense {name}: {key} given twice in {one_line(repr(spec), 80)}")
        values[key] = text
    return values


def _check_defense_value(name: str, param: Param, text: str) -> None:
    """One parameter's text: a number (an integer for ``int``) within its bounds, or one of its choices."""
    import math

    from .errors import ConfigError
    from .paths.bounded import one_line

    field, kind, _, low, high, choices = param
    if kind == "str":
        if choices and text not in choices:
            raise ConfigError(f"defense {name}: {field} must be one of {', '.join(choices)}, got {text!r}")
        return
    try:
        value = float(text)
        if kind == "int" and (not math.isfinite(value) or value != int(value)):
            raise ValueError
    except ValueError:
        want = "an integer" if kind == "int" else "a number"
        raise ConfigError(f"defense {name}: {field} must be {want}, got {one_line(repr(text), 80)}") from None
    if not math.isfinite(value):
        raise ConfigError(f"defense {name}: {field} must be a finite number, got {one_line(repr(text), 80)}")
    if kind == "int":
        if low is not None and value < low[0]:
            raise ConfigError(f"defense {name}: {field} must be an integer >= {int(low[0])}, got {int(value)!r}")
        return
    below = low is not None and (value < low[0] or (value == low[0] and not low[1]))
    above = high is not None and (value > high[0] or (value == high[0] and not high[1]))
    if below or above:
        bounds = [f"{'>=' if b[1] else '>'} {_number(b[0])}" for b in (low,) if b is not None]
        bounds += [f"{'<=' if b[1] else '<'} {_number(b[0])}" for b in (high,) if b is not None]
        raise ConfigError(f"defense {name}: {field} must be a finite number {' and '.join(bounds)}, got {_number(value)}")


def _number(value: float) -> str:
    """A float as defenses/base.py's format_value writes it (1.0 -> "1")."""
    return str(int(value)) if value.is_integer() and abs(value) < 1e16 else repr(value)
