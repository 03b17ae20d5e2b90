"""The flags of `attack` and `share`, built from the pydantic AttackConfig and the attacks' SPECs
(their defaults said per attack and preset, without importing torch), and the config they give."""

from __future__ import annotations

import argparse
import functools
import typing
from typing import Any, Iterable, Iterator, Sequence


EXIT_USAGE = 2


MAX_ERROR_LINE = 2000   # characters of an error message shown (each echoed value is cut shorter)


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Append "(default: X)" to each option whose help does not name its default yet. Flags
    that default to argparse.SUPPRESS (so that a given flag can be told from an absent one) or
    None say theirs in their help text themselves (``_default_help``)."""
    for action in parser._actions:
        default = action.default
        if (not action.option_strings or action.help in (None, argparse.SUPPRESS)
                or isinstance(action, (argparse._HelpAction, argparse._VersionAction,
                                       argparse._StoreTrueAction, argparse._StoreFalseAction))
                or default in (None, argparse.SUPPRESS) or default == [] or "default" in action.help.lower()):
            continue
        action.help = f"{action.help} (default: {fmt_default(default)})"


# ---------------------------------------------------------------- flags from the config model
# What a run uses for an attack constant it is not given: each image attack's declared defaults
# (its SPEC, read by specs.py without importing the attack: `gradleak attack --help` imports no
# torch), with GradInversion's presets as variants; resolved when the run starts
# (attacks.configs.resolve_attack: --iterations then rescales GradInversion's registration
# schedule and caps its warm-up). The text attacks' defaults per text model come from their SPECs'
# model_defaults (the first model's are the row, the others' its variants "on MODEL");
# tests/cli/test_cli_quiet.py checks every value against the code that resolves it.
Variants = tuple[tuple[str, dict[str, Any]], ...]   # (label, the values that differ)


Row = tuple[str, dict[str, Any], Variants]            # (attack or attacks, their defaults, variants)


Defaults = tuple[Row, ...]


def _grouped(entries: Iterable[Row]) -> list[tuple[list[str], dict[str, Any], Variants]]:
    """(attack, values, variants) entries grouped: attacks with the same values and variants share a row."""
    rows: list[tuple[list[str], dict[str, Any], Variants]] = []
    for name, values, variants in entries:
        same = next((row for row in rows if row[1] == values and row[2] == variants), None)
        if same is not None:
            same[0].append(name)
        else:
            rows.append(([name], values, variants))
    return rows


def _image_defaults() -> Iterator[Row]:
    """Each image attack's defaults (the optimisation attacks', and a closed form's constants such
    as cpa's), its presets after the first as variants."""
    from ..specs import attack_specs

    for name, spec in attack_specs().items():
        if not spec.optimisation and not any(f.default is not None for f in spec.flags.values()):
            continue
        values = {k: f.default for k, f in spec.flags.items() if k not in ("init", "labels", "preset", "box")}
        presets = list(spec.presets.items())
        yield name, values, tuple((f"with --preset {p}", {k: v for k, v in preset.items() if k in values and values[k] != v})
                                  for p, preset in presets[1:])


def _text_defaults() -> Iterator[Row]:
    """Each text attack's defaults: its declared ones and those of the first model it names, the
    other models' as variants."""
    from ..specs import attack_specs

    for name, spec in attack_specs("text").items():
        models = list(spec.model_defaults.items()) or [("", {})]
        values = {**{k: f.default for k, f in spec.flags.items() if f.default is not None}, **models[0][1]}
        if values:
            yield name, values, tuple((f"on {model}", {k: v for k, v in other.items() if values.get(k) != v})
                                      for model, other in models[1:])


@functools.cache
def attack_defaults() -> Defaults:
    """(attacks, their default values, variants: (label, values that differ)) per group of image
    attacks with the same defaults (in the order declared), then the text attacks' (one group is
    labelled "text"; several, "text" and their names)."""
    image, text = _grouped(_image_defaults()), _grouped(_text_defaults())
    return (*((", ".join(names), values, variants) for names, values, variants in image),
            *(("text" + ("" if len(text) == 1 else f" {', '.join(names)}"), values, variants)
              for names, values, variants in text))


@functools.cache
def _default_notes() -> dict[str, str]:
    """How a default left to the case is resolved, per flag (the attacks' SPEC default_note)."""
    from ..specs import attack_specs

    notes: dict[str, list[str]] = {}
    for spec in attack_specs().values():
        for flag, note in spec.default_note.items():
            if note not in notes.setdefault(flag, []):
                notes[flag].append(note)
    return {flag: "; ".join(n) for flag, n in notes.items()}


# Defaults that depend on the case, or notes on how a resolved default is used.
_DEFAULT_TEXT = {
    "preset": "cpu",
    "bn": "exact when the update carries the client's BN batch statistics, else approx",
    "labels": "gradinversion; text: bias for one sentence, else soft",
    "width": "the model's, see gradleak list",
    "attack": "auto; text: dlg; --preset imagenet: gradinversion",
    "model": "lenet-dlg; text: tiny-transformer; --preset imagenet: efficientnet-lite0",
    "data": "cifar10-samples; text: the --text sentences; --preset imagenet: imagenet-samples",
    "batch_size": "1; text with --text: all the sentences; --preset imagenet: 8",
}


ATTACK_EPILOG = ("Defaults apply where neither --config nor an --update file gives the value (with --update the "
                 "file decides what the client did). Those said per attack or per preset are resolved when the "
                 "run starts; config.json records every value a run used.")


def fmt_default(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(fmt_default(v) for v in value)
    return str(value)


def _resolved_default(name: str) -> str | None:
    """The help's default of attack constant ``name`` from attack_defaults(), or None."""
    parts = []
    for attacks, values, variants in attack_defaults():
        if name not in values:
            continue
        text = fmt_default(values[name])
        text += "".join(f", {label} {fmt_default(v[name])}" for label, v in variants
                        if name in v and v[name] != values[name])
        parts.append((attacks, text))
    if not parts:
        return None
    # A constant of one attack only (its description names it): just the values.
    text = parts[0][1] if len(parts) == 1 else "per attack: " + "; ".join(f"{a} {t}" for a, t in parts)
    notes = _default_notes()
    return text + (f"; {notes[name]}" if name in notes else "")


def _default_help(name: str, info: Any) -> str:
    """" (default: ...)" for the help of config field ``name``, or "" (no default to show: a
    switch, an empty list, an option that is off unless given, or a description that says it)."""
    if "default" in (info.description or "").lower() or info.annotation is bool:
        return ""
    text = _DEFAULT_TEXT.get(name) or _resolved_default(name)
    if text is None:
        default = info.get_default(call_default_factory=True)
        if default is None or default == []:
            return ""
        text = fmt_default(default)
    return f" (default: {text})"


def add_config_flags(parser: argparse.ArgumentParser, fields: Sequence[str] | None = None) -> None:
    from ..config import AttackConfig

    for name, info in AttackConfig.model_fields.items():
        if fields is not None and name not in fields:
            continue
        flag = "--" + name.replace("_", "-")
        help_ = (info.description or "").replace("%", "%%")   # argparse formats help with %
        ann = info.annotation
        origin, args = typing.get_origin(ann), typing.get_args(ann)
        if ann is bool:
            if info.default is True:
                parser.add_argument("--no-" + name.replace("_", "-"), dest=name, action="store_false",
                                    default=argparse.SUPPRESS, help=f"do not: {help_}")
            else:
                parser.add_argument(flag, dest=name, action="store_true", default=argparse.SUPPRESS, help=help_)
            continue
        help_ += _default_help(name, info).replace("%", "%%")
        if origin is list:
            parser.add_argument(flag, dest=name, action="append", default=argparse.SUPPRESS, help=help_)
            continue
        inner = [a for a in args if a is not type(None)] if args else [ann]
        base = inner[0] if len(inner) == 1 else str
        choices = None
        metavar = name.upper()
        if typing.get_origin(base) is typing.Literal:
            choices = list(typing.get_args(base))
            base, metavar = str, None
        elif typing.get_origin(ann) is typing.Literal:
            # Checked by the config model (one error line naming the field): the help shows them.
            metavar = "{" + ",".join(str(a) for a in args) + "}"
        conv = {int: int, float: float, str: str}.get(base, str)
        parser.add_argument(flag, dest=name, type=conv, choices=choices, default=argparse.SUPPRESS,
                            metavar=metavar, help=help_)


def config_from(args: argparse.Namespace, fields: Sequence[str] | None = None):  # noqa: ANN202
    from ..config import AttackConfig, load_config, make_config

    values: dict[str, Any] = {}
    if getattr(args, "config", None):
        values.update(load_config(args.config))
        refuse_model_code(values.get("model"), getattr(args, "model", None), f"config file {args.config}")
    for name in AttackConfig.model_fields:
        if (fields is None or name in fields) and hasattr(args, name):
            values[name] = getattr(args, name)
    return make_config(**values)


def refuse_model_code(named: Any, flag: str | None, where: str) -> None:
    """A file (config, sweep spec) never makes gradleak import code: a ``module:callable`` model
    named in one is refused unless the user gave the same ``--model`` on the command line."""
    from ..errors import ConfigError

    if isinstance(named, str) and ":" in named and named != flag:
        raise ConfigError(f"{where} names the user model {named!r}; gradleak never imports code a file names "
                          f"(to use your own model, pass --model {named} yourself)")
