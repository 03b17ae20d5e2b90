"""The docs' generated reference: every `gradleak` sub-command with its flags and defaults (from
the argparse parsers) and each attack's declared facts (from its SPEC).

Run by the MkDocs hook (docs/hooks.py) on every build, so the pages cannot fall behind the code;
``python scripts/docs_reference.py OUT`` writes the same Markdown to OUT for reading."""

from __future__ import annotations

import argparse
import html
import sys
from pathlib import Path
from typing import Any

from gradleak import cli, specs


def _cell(text: Any) -> str:
    """Text safe inside a Markdown table cell (no HTML, no emphasis, no column break)."""
    out = html.escape(" ".join(str(text).split()), quote=False)
    for ch in "\\|*_`[]":
        out = out.replace(ch, "\\" + ch)
    return out


def _help(action: argparse.Action) -> str:
    """The flag's help as `--help` prints it (argparse's %(default)s and friends filled in)."""
    text = action.help or ""
    if "%" in text:
        try:
            text = text % {**vars(action), "prog": "gradleak"}
        except (KeyError, TypeError, ValueError):
            pass
    return text


def subcommands() -> dict[str, str]:
    """Every sub-command of `gradleak` and its one-line help, in `gradleak --help` order."""
    parser = cli.build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {choice.dest: choice.help for choice in subs._choices_actions}


def flag_rows(parser: argparse.ArgumentParser) -> list[tuple[str, str, str]]:
    """(flags, value, help) for each argument of ``parser``."""
    rows = []
    for action in parser._actions:
        names = ", ".join(action.option_strings) or action.dest
        if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
            value = "{" + ",".join(str(c) for c in action.choices) + "}"
        elif action.nargs == 0:
            value = ""
        else:
            value = action.metavar or action.dest.upper()
        rows.append((names, str(value), _help(action)))
    return rows


def cli_markdown() -> str:
    """The CLI reference: each sub-command's usage, description and flags with their defaults."""
    out = []
    for name, summary in subcommands().items():
        parser = cli.command_parser(name)
        out += [f"## `gradleak {name}`", "", _cell(summary), "", "```text", parser.format_usage().strip(), "```", ""]
        out += ["| flag | value | what, and its default |", "| --- | --- | --- |"]
        out += [f"| `{flags}` | {_cell(value)} | {_cell(text)} |" for flags, value, text in flag_rows(parser)]
        out.append("")
    return "\n".join(out)


def attack_names() -> list[tuple[str, str]]:
    """(modality, name) of every attack `gradleak list` shows."""
    return [(m, n) for m in ("image", "text") for n in specs.attack_specs(m)]


def page_name(modality: str, name: str) -> str:
    """The attack's page under docs/reference/attacks/."""
    return f"{name}.md" if modality == "image" else f"text-{name}.md"


def attack_table() -> str:
    """One line per attack (its SPEC's summary), each linking its page."""
    out = ["| attack | modality | kind | what it does |", "| --- | --- | --- | --- |"]
    for modality, name in attack_names():
        spec = specs.attack_specs(modality)[name]
        out.append(f"| [`{name}`]({page_name(modality, name)}) | {modality} | {spec.kind} | {_cell(spec.summary)} |")
    return "\n".join(out) + "\n"


def spec_markdown(modality: str, name: str) -> str:
    """What the attack declares in its SPEC: kind, needs, verdict line, auto's use, flags."""
    spec = specs.attack_specs(modality)[name]
    out = ["## Declared in its SPEC", "", f"Generated from `{spec.module}`'s `SPEC` (what `gradleak list`, "
           "`--help`, the typed config and the verdict read).", "",
           "| | |", "| --- | --- |", f"| summary | {_cell(spec.summary)} |", f"| kind | {spec.kind} |",
           f"| needs | {_cell(spec.needs)} |",
           f"| converged below | {spec.converged_below if spec.converged_below is not None else 'no line'} |"]
    if spec.auto is not None:
        out.append(f"| in `auto` | {_cell(', '.join(f'{k}: {v}' for k, v in spec.auto.items()))} |")
    if spec.presets:
        out.append(f"| presets | {_cell(', '.join(spec.presets))} (the first is the default) |")
    out += _hook_rows(spec)
    out += ["", "| flag | type | default | what |", "| --- | --- | --- | --- |"]
    for flag in spec.flags.values():
        kind = "|".join(flag.type) if isinstance(flag.type, tuple) else flag.type
        default = spec.default_note.get(flag.name, flag.default)
        if spec.model_defaults and flag.default is None:
            default = "; ".join(f"{m}: {d.get(flag.name)}" for m, d in spec.model_defaults.items())
        out.append(f"| `--{flag.name.replace('_', '-')}` | {_cell(kind)} | {_cell(default)} | {_cell(flag.help)} |")
    return "\n".join(out) + "\n"


def _hook_rows(spec: specs.AttackSpec) -> list[str]:
    """The SPEC's hooks, each a row when declared: what else reads the declaration (the config's
    cases, --nproc's shards, the truth-start test's single start, the verdict's line, sweep identities)."""
    rows = []
    if spec.resolve:
        rows.append("| resolve | its module's `resolve()` fills the defaults that depend on the case |")
    if spec.verdict_line:
        rows.append("| verdict line | its module's `verdict_line(settings)` names the convergence line a run is held to |")
    for flag, cases in spec.cases.items():
        named = "; ".join(f"{value}: {', '.join(f'{k}={v}' for k, v in case.items())}" for value, case in cases.items())
        rows.append(f"| cases of `--{flag.replace('_', '-')}` | {_cell(named)} |")
    if spec.shards:
        rows.append(f"| shards | `--{spec.shards.replace('_', '-')}` (its independent runs; `--nproc` spreads them) |")
    if spec.one_start:
        rows.append(f"| one start | {_cell(', '.join(f'{k}={v}' for k, v in spec.one_start.items()))} (the truth-start test) |")
    if spec.hashed_flags:
        rows.append(f"| hashed when unset | {_cell(', '.join(spec.hashed_flags))} (sweep and experiment cell identities) |")
    for flag, why in spec.changed_defaults.items():
        rows.append(f"| changed default of `--{flag.replace('_', '-')}` | {_cell(why)} |")
    return rows


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "site-reference")
    (out / "attacks").mkdir(parents=True, exist_ok=True)
    (out / "cli.md").write_text(cli_markdown())
    for modality, name in attack_names():
        (out / "attacks" / page_name(modality, name)).write_text(spec_markdown(modality, name))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
