"""`gradleak experiment NAME`: run one of the papers' experiments."""

from __future__ import annotations

import argparse
import typing
from pathlib import Path
from typing import Any

from .checks import check_names
from .flags import fmt_default


EXPERIMENT_CHOOSES = "the experiment's own setting"


def add_experiment_flags(parser: argparse.ArgumentParser) -> None:
    from ..experiments import ExperimentOptions

    for name, info in ExperimentOptions.model_fields.items():
        flag = "--" + name.replace("_", "-")
        ann = info.annotation
        args = [a for a in typing.get_args(ann) if a is not type(None)] or [ann]
        inner = args[0]
        help_ = info.description or ""
        if inner is not bool and not info.is_required() and "default" not in help_.lower():
            # None: each experiment chooses (its module documents it; --smoke makes it smaller)
            default = info.get_default()
            help_ += f" (default: {EXPERIMENT_CHOOSES if default is None else fmt_default(default)})"
        if inner is bool:
            if info.default is True:
                parser.add_argument("--no-" + name.replace("_", "-"), dest=name, action="store_false",
                                    default=argparse.SUPPRESS, help=f"do not: {help_}")
            else:
                parser.add_argument(flag, dest=name, action="store_true", default=argparse.SUPPRESS, help=help_)
        elif typing.get_origin(inner) is list:
            item = typing.get_args(inner)[0]
            if typing.get_origin(item) is typing.Annotated:  # e.g. list[Annotated[int, Field(ge=1)]]
                item = typing.get_args(item)[0]

            def parse_list(text: str, item: type = item) -> list[Any]:
                parts = [v.strip() for v in text.split(",")]
                try:
                    if not parts or any(not v for v in parts):
                        raise ValueError
                    return [item(v) for v in parts]
                except ValueError:
                    raise argparse.ArgumentTypeError(
                        f"expected a comma-separated list of {item.__name__}, got {text!r}") from None
            parser.add_argument(flag, dest=name, type=parse_list, default=argparse.SUPPRESS, help=help_)
        else:
            conv = {int: int, float: float}.get(inner, str)
            parser.add_argument(flag, dest=name, type=conv, default=argparse.SUPPRESS,
                                required=info.is_required(), help=help_)


def cmd_experiment(args: argparse.Namespace) -> int:
    from ..catalog import TEXT_EXPERIMENTS, check
    from ..experiments import ExperimentOptions, make_options

    check("experiment", args.name)
    values = {k: getattr(args, k) for k in ExperimentOptions.model_fields if hasattr(args, k)}
    options = make_options(**values)
    attacks = options.attacks or ()
    if args.name in TEXT_EXPERIMENTS:  # text only: its --model and --attacks are text names
        check_names(model=options.model, attacks=attacks, text=True)
    else:  # an experiment's text rows name their text attack as text-NAME (defenses: text-dlg, text-tag)
        # comparison's DeepInversion row is no attack of its own (GradInversion with alpha_G = 0)
        own = ("deepinversion",) if args.name == "comparison" else ()
        check_names(model=options.model, data=options.data,
                    attacks=[a for a in attacks if not a.startswith("text-") and a not in own])
        check_names(attacks=[a.removeprefix("text-") for a in attacks if a.startswith("text-")], text=True)
    from ..experiments import run_experiment

    result, out = run_experiment(args.name, options)
    print_experiment(result, out)
    return 0


def print_experiment(result: Any, out: Path) -> None:
    from rich.console import Console

    from ..console import print_table

    # Wide tables (most experiments have 10-20 columns) are printed as their Markdown table,
    # whole, rather than cut to the terminal's width.
    print_table(Console(), result.columns, result.rows, title=result.title)
    print(f"wrote {out}/results.csv, results.md" + "".join(f", {f}" for f in result.figures))


def fill_experiment(e: argparse.ArgumentParser) -> None:
    e.add_argument("name", help="experiment name (gradleak list shows them)")
    add_experiment_flags(e)
    e.set_defaults(func=cmd_experiment)
