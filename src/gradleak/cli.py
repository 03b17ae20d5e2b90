"""The `gradleak` command. User errors become one line on stderr and exit status 2.
Each sub-command's flags are added only when it is parsed, so ``gradleak --help`` imports neither
torch nor the config models, and ``gradleak attack --help`` only the pydantic config."""

from __future__ import annotations

import argparse
import contextlib
import functools
import shlex
import sys
import typing
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from .console import notice_once
from .errors import GradleakError

EXIT_USAGE = 2
MAX_ERROR_LINE = 2000   # characters of an error message shown (each echoed value is cut shorter)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:  # one line, exit 2 (argparse prints usage too)
        self.exit(EXIT_USAGE, f"gradleak: error: {message}\n")


class _LazySubParsers(argparse._SubParsersAction):
    """Sub-commands registered by name and one-line help; their flags are added (``fill``) only
    when the sub-command is parsed. The flags of `attack` come from the pydantic AttackConfig
    and those of `audit-flower` and `dashboard` from modules that import torch: building them
    for `gradleak --help` took ~3 s."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fill: dict[str, Callable[[argparse.ArgumentParser], None]] = {}

    def add_lazy(self, name: str, help: str, fill: Callable[[argparse.ArgumentParser], None]) -> None:
        self.add_parser(name, help=help, description=help)
        self._fill[name] = fill

    def fill(self, name: str) -> argparse.ArgumentParser:
        """The sub-command's parser with its flags (added on first use)."""
        parser = self._name_parser_map[name]
        fill = self._fill.pop(name, None)
        if fill is not None:
            fill(parser)
            _show_defaults(parser)
        return parser

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if values and values[0] in self._name_parser_map:
            self.fill(values[0])
        super().__call__(parser, namespace, values, option_string)


class _Registered:
    """Hands a module's ``add_*_parser(sub)`` the sub-parser already registered under that name
    (its one-line help is cli.py's, see ``LAZY_HELP``); other settings it passes are applied."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        for key in ("description", "epilog", "formatter_class", "usage"):
            if key in kwargs:
                setattr(self.parser, key, kwargs[key])
        return self.parser


def _show_defaults(parser: argparse.ArgumentParser) -> None:
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
        action.help = f"{action.help} (default: {_fmt_default(default)})"


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
    from .specs import attack_specs

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
    from .specs import attack_specs

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
    from .specs import attack_specs

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


def _fmt_default(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(_fmt_default(v) for v in value)
    return str(value)


def _resolved_default(name: str) -> str | None:
    """The help's default of attack constant ``name`` from attack_defaults(), or None."""
    parts = []
    for attacks, values, variants in attack_defaults():
        if name not in values:
            continue
        text = _fmt_default(values[name])
        text += "".join(f", {label} {_fmt_default(v[name])}" for label, v in variants
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
        text = _fmt_default(default)
    return f" (default: {text})"


def _add_config_flags(parser: argparse.ArgumentParser, fields: Sequence[str] | None = None) -> None:
    from .config import AttackConfig

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


def _config_from(args: argparse.Namespace, fields: Sequence[str] | None = None):  # noqa: ANN202
    from .config import AttackConfig, load_config, make_config

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
    from .errors import ConfigError

    if isinstance(named, str) and ":" in named and named != flag:
        raise ConfigError(f"{where} names the user model {named!r}; gradleak never imports code a file names "
                          f"(to use your own model, pass --model {named} yourself)")


# ---------------------------------------------------------------- commands
# Flags that may accompany --resume (they do not change the numbers, or only where stated).
RESUME_OVERRIDES = ("threads", "progress", "checkpoint_every", "device")


def _attack_status(metrics: dict[str, Any], run_dir: Path | None) -> int:
    """0, or 2 with one error line when the attack diverged beyond its retries (results kept)."""
    if metrics.get("status") != "diverged":
        return 0
    where = f"; partial results in {run_dir} (metrics.json status \"diverged\")" if run_dir is not None else ""
    print(f"gradleak: error: the attack diverged: {metrics.get('divergence', {}).get('message', '')}{where}",
          file=sys.stderr)
    return EXIT_USAGE


def cmd_resume(args: argparse.Namespace) -> int:
    """`gradleak attack --resume RUN`: continue an interrupted run with its saved config."""
    from .engine.checkpoints import find_state, read_saved_config
    from .config import AttackConfig, make_config
    from .errors import ConfigError
    from .pipeline import run

    state_dir = find_state(args.resume)
    values = read_saved_config(state_dir)
    if "attack" not in values and values.get("modality", "image") == "image":
        values["attack"] = "dlg"  # a state saved while the default attack was dlg does not name it
    # The saved state is a file too: a module:callable model in it runs only when the user names
    # the same model again (--model), their own decision.
    flag_model = getattr(args, "model", None)
    refuse_model_code(values.get("model"), flag_model, f"the saved state in {state_dir}")
    given = [n for n in AttackConfig.model_fields if hasattr(args, n) and n not in RESUME_OVERRIDES
             and not (n == "model" and flag_model == values.get("model"))]
    if getattr(args, "config", None) or given:
        flag = "--config" if getattr(args, "config", None) else "--" + given[0].replace("_", "-")
        raise ConfigError(f"{flag} cannot be given with --resume (the run continues with its saved config; "
                          f"allowed: --threads, --no-progress, --checkpoint-every, --device, and --model to "
                          f"confirm a saved module:callable model)")
    values.update({n: getattr(args, n) for n in RESUME_OVERRIDES if hasattr(args, n)})
    cfg = make_config(**values)
    threads, note = _threads_for_busy_cpu(cfg.threads, cfg.device, cfg.nproc)
    if threads != cfg.threads:
        cfg.threads = threads
    result = run(cfg, resume=state_dir)
    _print_summary(result.metrics, result.run_dir)
    _say(note)
    return _attack_status(result.metrics, result.run_dir)


def _threads_for_busy_cpu(threads: int | None, device: str, nproc: int = 1) -> tuple[int | None, str | None]:
    """(threads, note) by the thread policy the Python API applies too (runtime.threads_for_run);
    the command prints the note after its results (never before: a bad input still ends in one
    error line). None: torch's own choice."""
    from .runtime import threads_for_run

    return threads_for_run(threads, device, nproc)


def _say(note: str | None) -> None:
    if note:
        print(f"note: {note}")


def check_names(*, model: str | None = None, data: str | None = None, defenses: Sequence[str] = (),
                attacks: Sequence[str] = (), text: bool = False, data_root: str | None = None) -> None:
    """Unknown names (with a "did you mean"), malformed defense specs and a data folder (or
    --data-root) that does not exist, answered before torch is imported; the data loader checks
    the folder's contents."""
    from .catalog import check, check_defense

    for attack in attacks:
        check("text attack" if text else "attack", attack)
    if model is not None and ":" not in model:
        check("text model" if text else "model", model, "" if text else " or package.module:callable")
    for spec in defenses:
        check_defense(spec)   # its name and its values (gaussian:abc, prune:2), as defenses/spec.py does
    if not text and (data is not None or data_root is not None):
        check_data_folder(data, data_root)


def check_data_folder(data: str | None, root: str | None = None) -> None:
    """An image --data that is neither a source name nor an existing folder, or a --data-root that
    is not a folder, refused as data/sources.py's open_source refuses them (DataError, the same
    line), before torch is imported. What cannot be told without reading (a folder above that
    cannot be searched) is left to the loader."""
    import os
    import stat

    from .catalog import SOURCES, unknown
    from .errors import DataError
    from .paths import one_line

    def kind(path: str) -> str | None:   # "dir", "file", "absent", or None: cannot tell
        try:
            return "dir" if stat.S_ISDIR(os.stat(os.path.expanduser(path)).st_mode) else "file"
        except FileNotFoundError:
            return "absent"
        except (OSError, ValueError):
            return None

    if root is not None and kind(root) in ("file", "absent"):
        raise DataError(f"no such folder: {one_line(os.path.expanduser(root))} (given as root)")
    if data is None or data.strip().lower() in SOURCES:
        return
    found = kind(data)
    if found == "file":
        raise DataError(f"{one_line(data)} is a file, not a folder of images or a known source name")
    if found == "absent":
        if any(c in data for c in "/.~" + os.sep):
            raise DataError(f"no such folder: {one_line(data)}")
        raise unknown("data source", data, SOURCES, ", or a path to an image folder")


def precheck(cfg: Any) -> None:
    """Answer the common mistakes in a run's config before torch is imported (it takes 2-3 s):
    unknown names (with a "did you mean"; the config model checks --server, server_spec.py), input files that cannot be read, an --out that
    cannot be written. Only what the user gave is checked (a name an --update file decides is
    checked when it is read); the pipeline checks everything again, this only answers fast."""
    from .catalog import check
    from .modalities import modality_named
    from .paths import check_apart, check_input_file, check_output_dir, run_inputs

    given = cfg.model_fields_set
    modality = modality_named(cfg.modality)  # its names: the attacks and models of its own kind
    modality.check_names(attack=cfg.attack if "attack" in given else None,
                         model=cfg.model if "model" in given else None)
    check_names(data=cfg.data if "data" in given and modality.data_sources else None, defenses=cfg.defense,
                data_root=cfg.data_root if modality.data_sources else None)
    if cfg.preset is not None:
        check("preset", cfg.preset)
    for field in ("update", "truth", "checkpoint"):
        path = getattr(cfg, field)
        if path is not None:
            check_input_file(path, "--" + field)
    if cfg.out is not None:
        check_output_dir(cfg.out)
        check_apart([("--out", cfg.out)], run_inputs(cfg))


def cmd_attack(args: argparse.Namespace) -> int:
    if getattr(args, "resume", None):
        return cmd_resume(args)
    cfg = _config_from(args)
    precheck(cfg)
    from .pipeline import run

    threads, note = _threads_for_busy_cpu(cfg.threads, cfg.device, cfg.nproc)
    if threads != cfg.threads:
        cfg.threads = threads  # recorded in config.json: a rerun from it uses the same threads
    result = run(cfg)  # image or text: the same pipeline
    if result.rank:  # torchrun: a process other than rank 0 (which prints the summary)
        return 0
    _print_summary(result.metrics, result.run_dir)
    _say(note)
    return _attack_status(result.metrics, result.run_dir)


SHARE_FIELDS = ("model", "width", "data", "data_root", "split", "batch_size", "seed", "model_seed",
                "allow_repeats", "image_size", "num_classes", "share_bn_statistics", "defense", "device",
                "threat", "local_steps", "local_batch_size", "local_lr", "clients", "inner", "checkpoint",
                "modality", "text", "server", "local_epochs", "local_optimizer", "local_momentum", "local_nesterov",
                "local_weight_decay", "local_betas", "local_eps", "local_augment", "local_crop_padding")


def cmd_share(args: argparse.Namespace) -> int:
    from .paths import check_apart, check_distinct, check_output_file, run_inputs

    cfg = _config_from(args, SHARE_FIELDS)
    precheck(cfg)
    # Checked before the client is simulated: an existing file is refused unless --force (and
    # never replaced half-way: Case.save writes both or neither), the outputs are never the
    # same file, and never one of the inputs nor inside an input folder (even with --force).
    out = check_output_file(args.out, "--out", force=args.force)
    truth_path = check_output_file(args.truth, "--truth", force=args.force) if args.truth else None
    model_out = check_output_file(args.model_out, "--model-out", force=args.force) if args.model_out else None
    outputs = (("--out", out), ("--truth", truth_path), ("--model-out", model_out))
    check_distinct(*outputs)
    check_apart(outputs, run_inputs(cfg, getattr(args, "config", None)))
    from .modalities import modality_named

    case = modality_named(cfg.modality).share_client(cfg)
    if model_out is None:
        case.save(out, truth_path, force=args.force)
    else:
        _save_with_model(case, out, truth_path, model_out, force=args.force)
    print(case.share_line(out, truth_path) + (f"; the model received in {model_out}" if model_out else ""))
    return 0


def _save_with_model(case: Any, out: Path, truth_path: Path | None, model_out: Path, *, force: bool) -> None:
    """share's files and the model the client received (--model-out), written all or none."""
    from .fl.inspect import received_model_bytes
    from .paths import atomic_write_files

    update_data, truth_data = case.file_bytes()
    meta = case.update.meta
    info = {"model": meta.model, "num_classes": meta.num_classes, "input_shape": list(meta.input_shape)}
    if meta.model_kwargs.get("server"):  # for the reader only: inspect never relies on it
        info["server"] = meta.model_kwargs["server"]
    files = {out: update_data, model_out: received_model_bytes(case.update.global_weights, info)}
    what = {out: "--out", model_out: "--model-out"}
    if truth_path is not None and truth_data is not None:
        files[truth_path], what[truth_path] = truth_data, "--truth"
    atomic_write_files(files, force=force, what=what)


EXIT_SUSPICIOUS = 1


def cmd_inspect(args: argparse.Namespace) -> int:
    """`gradleak inspect FILE --model ARCH`: exit 1 when a structure of a known malicious server
    is found, 0 when none is; bad input is one line and exit 2 (main)."""
    import os

    from .errors import ConfigError
    from .paths import atomic_write_files, check_input_file, check_output_file, one_line

    check_names(model=args.model, data=args.data)
    for flag, value, low, high in (("--num-classes", args.num_classes, 2, 100_000), ("--channels", args.channels, 1, 4),
                                   ("--image-size", args.image_size, 4, 1024), ("--width", args.width, 1, 4096)):
        if value is not None and not low <= value <= high:
            raise ConfigError(f"{flag} must be in {low}..{high}, got {value}")
    check_input_file(args.file, "model file")   # answered before torch is imported
    report = None
    if args.report:   # never the model itself (a link or a hard link to it included), never replaced unasked
        if os.path.exists(args.report) and os.path.samefile(args.report, args.file):
            raise ConfigError(f"--report {one_line(args.report)} is the inspected model file itself; give another path")
        report = check_output_file(args.report, "--report", force=args.force)
    channels, num_classes = args.channels, args.num_classes
    if channels is None or num_classes is None:
        from .data import open_source

        source = open_source(args.data, root=args.data_root)
        channels = source.native_channels if channels is None else channels
        num_classes = source.num_classes if num_classes is None else num_classes
    from .fl.inspect import inspect_file

    result = inspect_file(args.file, args.model, num_classes=num_classes, channels=channels,
                          image_size=args.image_size, width=args.width)
    text = result.to_json()   # strict JSON: a non-finite statistic is null, never Infinity or NaN
    if report is not None:
        atomic_write_files({report: (text + "\n").encode()}, force=args.force, what={report: "--report"})
    if args.json:
        print(text)
    else:
        _print_inspection(result, report)
    return EXIT_SUSPICIOUS if result.suspicious else 0


def _print_inspection(result: Any, report: Path | None) -> None:
    """The console summary; every name the file chose (tensor names, in the layers and reasons)
    and the paths are escaped (paths.printable), so a hostile file cannot forge lines."""
    from .paths import printable

    c, h, w = result.input_shape
    where = f" (its tensors under {printable(repr(result.prefix))})" if result.prefix else ""
    checked = sum(1 for layer in result.layers if layer.kind in ("linear", "conv", "batchnorm"))
    print(f"{printable(result.path)}: model {result.arch}, input {c}x{h}x{w}{where}; {checked} layers checked")
    for layer in result.layers:
        for f in layer.findings:
            shape = "x".join(str(v) for v in layer.shape)
            print(printable(f"  {layer.name} [{layer.kind} {shape}] {f.check}: {f.reason}"))
    if result.suspicious:
        layers = sorted({name for name, _ in result.findings})
        print(f"suspicious: {len(layers)} layer(s) hold structures of a malicious server; do not train this model "
              "on private data")
    else:
        print("nothing found: no layer ARCH lacks, no imprint bins, no trap rows, no layer scaled out of line"
              .replace("ARCH", result.arch))
    if report is not None:
        print(f"wrote {printable(report)}")


EXPERIMENT_CHOOSES = "the experiment's own setting"


def _add_experiment_flags(parser: argparse.ArgumentParser) -> None:
    from .experiments import ExperimentOptions

    for name, info in ExperimentOptions.model_fields.items():
        flag = "--" + name.replace("_", "-")
        ann = info.annotation
        args = [a for a in typing.get_args(ann) if a is not type(None)] or [ann]
        inner = args[0]
        help_ = info.description or ""
        if inner is not bool and not info.is_required() and "default" not in help_.lower():
            # None: each experiment chooses (its module documents it; --smoke makes it smaller)
            default = info.get_default()
            help_ += f" (default: {EXPERIMENT_CHOOSES if default is None else _fmt_default(default)})"
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
    from .catalog import TEXT_EXPERIMENTS, check
    from .experiments import ExperimentOptions, make_options

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
    from .experiments import run_experiment

    result, out = run_experiment(args.name, options)
    _print_experiment(result, out)
    return 0


def _print_experiment(result: Any, out: Path) -> None:
    from rich.console import Console

    from .console import print_table

    # Wide tables (most experiments have 10-20 columns) are printed as their Markdown table,
    # whole, rather than cut to the terminal's width.
    print_table(Console(), result.columns, result.rows, title=result.title)
    print(f"wrote {out}/results.csv, results.md" + "".join(f", {f}" for f in result.figures))


def cmd_train(args: argparse.Namespace) -> int:
    import dataclasses

    from .errors import ConfigError

    if args.threads is not None and not 1 <= args.threads <= 512:
        raise ConfigError(f"--threads must be in 1..512, got {args.threads}")
    check_names(model=args.model, data=args.data, defenses=args.defense or ())
    import torch

    from .training import TrainConfig, train

    threads, note = _threads_for_busy_cpu(args.threads, getattr(args, "device", None) or "cpu")
    if threads:
        torch.set_num_threads(threads)
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    values = {k: getattr(args, k) for k in fields if getattr(args, k, None) is not None}
    if "defense" in values:
        values["defense"] = tuple(values["defense"])
    if "checkpoints" in values:
        try:
            values["checkpoints"] = tuple(float(v) for v in values["checkpoints"].split(",") if v.strip())
        except ValueError:
            raise ConfigError("--checkpoints must be comma-separated fractions, e.g. 0,0.3,0.7,1.0") from None
    try:
        cfg = TrainConfig(**values)
    except TypeError as exc:
        raise ConfigError(str(exc)) from None
    from .paths import StagedDir

    with StagedDir(args.out) as stage:  # checked and created before training starts
        result = train(cfg, stage.path, progress=args.progress)
        out = stage.commit()
    for c in result.checkpoints:
        print(f"checkpoint {c.fraction:.2f} (step {c.step}): test accuracy {c.test_accuracy:.3f} -> {out / Path(c.path).name}")
    if result.epsilon is not None:
        print(f"DP-SGD epsilon {result.epsilon:.3f}")
    print(f"wrote {out}/training.json, training.png ({result.wall_seconds:.0f} s)")
    _say(note)
    return 0


def _run_modality(run: Path) -> Any:
    """The modality (modalities.Modality) a run folder's metrics.json names."""
    from .modalities import IMAGE, recorded_modality
    from .report.html import read_metrics  # bounded: a folder, FIFO, huge or deep file is an error

    try:
        metrics = read_metrics(run)
    except GradleakError:
        return IMAGE  # the image report gives the error
    return recorded_modality(metrics.get("modality") if isinstance(metrics, dict) else None)


def cmd_report(args: argparse.Namespace) -> int:
    import os

    from .errors import DataError
    from .paths import one_line

    run = Path(args.run)
    if not os.path.lexists(run) or not run.is_dir():  # answered before the report modules (torch) load
        what = "does not exist" if not os.path.lexists(run) else "is not a folder; give a run folder (an --out of attack)"
        raise DataError(f"run folder {one_line(str(run))} {what}")
    path = _run_modality(run).render_report(Path(args.run))
    print(f"wrote {path}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    """`gradleak list`, from the torch-free catalog (tests/test_catalog.py holds it to the registries)."""
    from . import catalog

    sections = {"models": dict(sorted(catalog.MODELS.items())), "attacks": catalog.IMAGE_ATTACKS,
                "text models": catalog.TEXT_MODELS, "text attacks": catalog.TEXT_ATTACKS,
                "experiments": dict(sorted(catalog.EXPERIMENTS.items()))}
    width = max(20, *(len(k) for names in sections.values() for k in names))

    def section(title: str, names: dict[str, str]) -> None:
        print(f"{title}:")
        for k, v in names.items():
            print(f"  {k:{width}s} {v}")

    section("models", sections["models"])
    print("data sources: " + ", ".join(catalog.SOURCES) + ", or a folder (ImageFolder layout)")
    section("attacks", sections["attacks"])
    section("text models (--modality text)", sections["text models"])
    section("text attacks (--modality text; text data: --text \"...\" (repeatable) or --data FILE.txt)",
            sections["text attacks"])
    section("experiments", sections["experiments"])
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from .sweep import load_spec, run_sweep

    spec = load_spec(args.spec)  # refuses a module:callable model named in the file
    if args.workers is not None and not 1 <= args.workers <= 256:
        raise GradleakError("--workers must be in 1..256")
    if args.address and args.executor != "ray":
        raise GradleakError("--address applies to --executor ray only")
    try:
        summary = run_sweep(spec, Path(args.out), executor=args.executor, workers=args.workers,
                            address=args.address, retry_failed=args.retry_failed, save_runs=args.save_runs,
                            progress=args.progress)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (sweep.engine): finished cells are in the store
        print(f"gradleak: sweep interrupted ({_signal_name(exc)}); finished cells are saved in "
              f"{args.out}/results.sqlite; to continue, run: {sweep_command(args)}", file=sys.stderr)
        return int(getattr(exc, "exit_code", 130))
    failed = f", {len(summary.failed)} failed" if summary.failed else ""
    lost = f", {len(summary.lost)} lost (rerun to redo)" if summary.lost else ""
    print(f"sweep: {summary.done}/{summary.total} cells done ({summary.skipped} skipped, "
          f"{len(summary.computed)} run{failed}{lost}) in {summary.wall_seconds:.0f} s; "
          f"wrote {args.out}/results.sqlite, results.csv")
    # LPIPS not computed: said once per sweep, not per cell, and not again for later sweeps
    # into the same parent folder (console.notice_once); each cell's metrics record it.
    if summary.lpips_notice and notice_once(Path(args.out).absolute().parent, "lpips", summary.lpips_notice):
        print(summary.lpips_notice)
    return 0


def _signal_name(exc: BaseException) -> str:
    import signal

    signum = getattr(exc, "signum", signal.SIGINT)
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def sweep_command(args: argparse.Namespace) -> str:
    """The command that continues an interrupted sweep: the same spec, --out and options
    (rerunning it skips every cell already in the store; --workers and the executor do not
    change a cell)."""
    words = ["gradleak", "sweep", args.spec, "--out", args.out]
    if args.executor != "local":
        words += ["--executor", args.executor]
    if args.address:
        words += ["--address", args.address]
    if args.workers is not None:
        words += ["--workers", str(args.workers)]
    words += [flag for flag, on in (("--retry-failed", args.retry_failed), ("--save-runs", args.save_runs),
                                    ("--no-progress", not args.progress)) if on]
    return shlex.join(words)


def _summary_rows(metrics: dict[str, Any], modality: Any) -> list[tuple[str, str]]:
    """The summary table's rows: the modality's keys (modalities.Modality), then the defenses,
    epsilon, the inputs a closed form separated and the attack's own convergence; the worst
    image's PSNR beside the mean."""
    from .report.html import convergence_text, worst_image
    from .report.page import inputs_exact

    rows: list[tuple[str, str]] = []

    def fmt(v: Any) -> str:
        if v is None:
            return modality.no_value
        if isinstance(v, float):
            return f"{v:.3e}" if (abs(v) < 1e-2 and v != 0) else f"{v:.3f}"
        return str(v)

    for key in modality.summary_keys:
        if key == "lpips_mean" and metrics.get(key) is None:
            continue  # metrics.json's lpips_notice says why (and the notice below, once)
        if key == "iterations" and isinstance(metrics.get("iterations_per_start"), int):
            # DLG/iDLG: --iterations is each start's budget; the total counts every start's steps
            starts = metrics.get("trials")
            rows.append(("iterations", f"{metrics['iterations']} in all ({metrics['iterations_per_start']} per start"
                         + (f", {starts} start{'s' if starts != 1 else ''})" if isinstance(starts, int) else ")")))
        elif key in metrics:
            rows.append((key, fmt(metrics[key])))
        if key == "psnr_mean" and len(metrics.get("per_image") or ()) > 1 and worst_image(metrics):
            low, name = worst_image(metrics)  # the mean hides the image that failed
            rows.append(("psnr_min", f"{low:.3f} (worst image: {name})"))
    if metrics.get("defenses"):
        rows.append(("defenses", ", ".join(metrics["defenses"])))
    if isinstance(metrics.get("dp_epsilon"), (int, float)):
        rows.append(("DP-SGD epsilon", f"{metrics['dp_epsilon']:.3g} (this one update, delta {metrics.get('dp_delta')})"))
    if inputs_exact(metrics):  # a closed form on an undefended update: the inputs it read off exactly
        rows.append(("inputs separated", f"{inputs_exact(metrics)} inputs exact (read off the update)"))
    elif isinstance(metrics.get("separated"), int):  # the closed-form attacks on a batch
        rows.append(("inputs separated", f"{metrics['separated']} of {metrics['batch_size']}"))
    if "converged" in metrics:
        rows.append(("attack converged", convergence_text(metrics)))
    return rows


def _summary_lines(metrics: dict[str, Any], modality: Any) -> list[str]:
    """The lines under the table: what auto tried, the positive control, the verdict and what
    would decide it, the BN prior's note, and the modality's own lines (a text run's sentences)."""
    from .outcome import tried_summary

    lines = []
    auto = metrics.get("auto")
    if isinstance(auto, dict):  # --attack auto: what it tried and what it used
        lines.append(f"auto: used {auto.get('used')}: {auto.get('why')}. Tried: {tried_summary(auto)}")
    if isinstance(metrics.get("control"), dict):   # the positive control outcome.py asked for
        c = metrics["control"]
        lines.append(f"control (the same attack without the defenses): {c.get('verdict')}"
                     + (f", PSNR {c['psnr_mean']:.1f} dB" if isinstance(c.get("psnr_mean"), (int, float)) else ""))
    if metrics.get("verdict"):   # every run: the verdict on the client (outcome.py), and what would decide it
        line = f"verdict: {metrics['verdict']}: {metrics.get('verdict_reason', '')}"
        if metrics.get("next_step") and metrics["verdict"] != "leaked":
            line += f". Next: {metrics['next_step']}"
        lines.append(line)
    if metrics.get("bn_prior_note"):
        lines.append(f"note: {metrics['bn_prior_note']}")
    return lines + modality.summary_lines(metrics)


def _print_summary(metrics: dict[str, Any], run_dir: Path | None) -> None:
    from rich.console import Console

    from .console import print_table
    from .modalities import recorded_modality

    modality = recorded_modality(metrics.get("modality"))
    where = modality.data_label or metrics["data"]
    console = Console()
    print_table(console, ["metric", "value"], _summary_rows(metrics, modality),
                title=f"{metrics['attack']} on {metrics['model']} ({where}, batch {metrics['batch_size']})")
    for line in _summary_lines(metrics, modality):
        console.print(line, markup=False, highlight=False)
    # LPIPS not computed: said once per folder of runs (runs/ by default), not on every run;
    # metrics.json and report.html keep saying it for each run (lpips_notice).
    notice = metrics.get("lpips_notice")
    if notice and notice_once(run_dir.absolute().parent if run_dir is not None else None, "lpips", notice):
        console.print(notice, markup=False, highlight=False)
    if run_dir is not None:
        console.print(f"run folder: {run_dir}  (report.html, {modality.files}, metrics.json)", markup=False,
                      highlight=False)


# One-line help of the sub-commands whose flags a module that imports torch adds (they are added
# only when the sub-command runs); tests/cli/test_cli_quiet.py checks they equal the modules' own.
LAZY_HELP = {
    "audit-flower": "run an example Flower federation (Fashion-MNIST, FedAvg) and audit every client's update "
                    "each round",
    "dashboard": "one self-contained HTML risk report of a sweep, an experiment or a Flower audit (or a "
                 "comparison of two)",
}
# `gradleak train`'s defaults (training.TrainConfig, which imports torch; checked by the tests).
TRAIN_DEFAULTS = {"model": "lenet-dlg", "data": "fashion-mnist", "epochs": 1.0, "batch_size": 64, "lr": 0.05,
                  "momentum": 0.9, "checkpoints": (0.0, 0.3, 0.7, 1.0), "test_subset": 2000, "seed": 0,
                  "model_seed": 0}


def _fill_attack(a: argparse.ArgumentParser) -> None:
    a.add_argument("--config", help="rerun a run folder's config.json (flags given here override it)")
    a.add_argument("--resume", metavar="RUN", help="continue an interrupted run (its --out folder) from its saved "
                   "state, with its saved config (only --threads, --[no-]progress, --checkpoint-every, --device, "
                   "and --model to confirm a saved module:callable model)")
    _add_config_flags(a)
    a.epilog = ATTACK_EPILOG
    a.set_defaults(func=cmd_attack)


def _fill_share(s: argparse.ArgumentParser) -> None:
    _add_config_flags(s, SHARE_FIELDS)
    s.add_argument("--out", required=True, help="update file to write (.safetensors)")
    s.add_argument("--truth", help="also write the true batch here (for evaluation only)")
    s.add_argument("--model-out", dest="model_out", help="also write the model the client received (its state "
                   "dict as the server sent it, a malicious server's block included) here, for `gradleak inspect`")
    s.add_argument("--force", action="store_true", help="replace an existing --out / --truth / --model-out file "
                   "(all are written together, or none)")
    s.set_defaults(func=cmd_share)


def _fill_inspect(i: argparse.ArgumentParser) -> None:
    i.add_argument("file", help="the received model: a safetensors state dict (share --model-out, a checkpoint)")
    i.add_argument("--model", required=True, help="the architecture the client expects (gradleak list)")
    i.add_argument("--data", default="cifar10-samples", help="the client's data source: its channels and classes "
                   "set the architecture's shapes unless --channels / --num-classes are given")
    i.add_argument("--data-root", dest="data_root", default=None, help="folder overriding the source's location")
    i.add_argument("--num-classes", dest="num_classes", type=int, default=None, help="classes (default: the data's)")
    i.add_argument("--channels", type=int, default=None, help="image channels (default: the data's)")
    i.add_argument("--image-size", dest="image_size", type=int, default=None, help="input size (default: the model's)")
    i.add_argument("--width", type=int, default=None, help="model width (convnet, mlp; default: the model's)")
    i.add_argument("--json", action="store_true", help="print the full report (every layer's statistics) as JSON")
    i.add_argument("--report", default=None, help="also write the JSON report to this file (never the inspected "
                   "model file; an existing file only with --force)")
    i.add_argument("--force", action="store_true", help="replace an existing --report file")
    i.epilog = ("Exit status: 0 nothing found, 1 a structure of a known malicious server found, 2 bad input. "
                "The file's metadata is never used.")
    i.set_defaults(func=cmd_inspect)


def _fill_train(t: argparse.ArgumentParser) -> None:
    def d(name: str) -> str:
        return f" (default: {_fmt_default(TRAIN_DEFAULTS[name])})"

    t.add_argument("--model", default=None, help="model name" + d("model"))
    t.add_argument("--width", type=int, default=None, help="model width (convnet, mlp; default: the model's)")
    t.add_argument("--data", default=None, help="data source" + d("data"))
    t.add_argument("--data-root", dest="data_root", default=None, help="folder overriding the source's location")
    t.add_argument("--image-size", dest="image_size", type=int, default=None, help="input size (default: the model's)")
    t.add_argument("--epochs", type=float, default=None, help="epochs (fractions allowed)" + d("epochs"))
    t.add_argument("--batch-size", dest="batch_size", type=int, default=None, help="mini-batch size" + d("batch_size"))
    t.add_argument("--lr", type=float, default=None, help="SGD learning rate" + d("lr"))
    t.add_argument("--momentum", type=float, default=None, help="SGD momentum" + d("momentum"))
    t.add_argument("--defense", action="append", default=None, help="defense applied to every gradient step")
    t.add_argument("--checkpoints", default=None, help="fractions of training to save, e.g. 0,0.3,0.7,1.0"
                   + d("checkpoints"))
    t.add_argument("--train-subset", dest="train_subset", type=int, default=None,
                   help="use N training images (default: all)")
    t.add_argument("--test-subset", dest="test_subset", type=int, default=None, help="score on N test images"
                   + d("test_subset"))
    t.add_argument("--seed", type=int, default=None, help="seed" + d("seed"))
    t.add_argument("--model-seed", dest="model_seed", type=int, default=None, help="weight-init seed" + d("model_seed"))
    t.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice, fewer when other work "
                   "keeps cores busy)")
    t.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    t.add_argument("--out", required=True, help="output folder")
    t.set_defaults(func=cmd_train)


def _fill_report(r: argparse.ArgumentParser) -> None:
    r.add_argument("run", help="run folder")
    r.set_defaults(func=cmd_report)


def _fill_experiment(e: argparse.ArgumentParser) -> None:
    e.add_argument("name", help="experiment name (gradleak list shows them)")
    _add_experiment_flags(e)
    e.set_defaults(func=cmd_experiment)


def _fill_list(m: argparse.ArgumentParser) -> None:
    m.set_defaults(func=cmd_models)


def _fill_sweep(w: argparse.ArgumentParser) -> None:
    w.add_argument("spec", help="sweep spec (YAML/JSON): base: {fields}, grid: {field: [values]}")
    w.add_argument("--out", required=True, help="results folder (results.sqlite, results.csv); rerun to resume")
    w.add_argument("--executor", choices=("local", "ray", "inline"), default="local",
                   help="local: process pool (default); ray: Ray tasks; inline: this process")
    w.add_argument("--address", default=None, help="Ray cluster address (default: start a local Ray)")
    w.add_argument("--workers", type=int, default=None, help="parallel cells (default: the CPUs available; "
                   "with --address, the cluster's)")
    w.add_argument("--retry-failed", dest="retry_failed", action="store_true", help="rerun cells that failed")
    w.add_argument("--save-runs", dest="save_runs", action="store_true", help="also write DIR/runs/<cell>/ run folders")
    w.add_argument("--no-progress", dest="progress", action="store_false", help="one line per cell, no bar")
    w.set_defaults(func=cmd_sweep)


def _fill_audit_flower(f: argparse.ArgumentParser) -> None:
    from .audit.command import add_audit_flower_parser  # torch and flwr only when it runs, after its checks

    add_audit_flower_parser(_Registered(f))


def _fill_dashboard(d: argparse.ArgumentParser) -> None:
    from .sweep.dashboard_cli import add_dashboard_parser

    add_dashboard_parser(_Registered(d))


def build_parser() -> argparse.ArgumentParser:
    """The `gradleak` parser; a sub-command's flags are added when it is parsed (see
    _LazySubParsers, and :func:`command_parser` for one sub-command's whole parser)."""
    from . import __version__

    p = _Parser(prog="gradleak", description="How much private data leaks from federated-learning updates.")
    p.add_argument("--version", action="version", version=f"gradleak {__version__}")
    sub = p.add_subparsers(dest="command", parser_class=_Parser, required=True, action=_LazySubParsers)
    sub.add_lazy("attack", "simulate a client (or read an update file) and attack it", _fill_attack)
    sub.add_lazy("share", "compute a client's shared update and write it as safetensors", _fill_share)
    sub.add_lazy("inspect", "check a received model for the structures of known malicious servers (exit 1 if found)",
                 _fill_inspect)
    sub.add_lazy("train", "train a model (optionally under a defense) and save checkpoints", _fill_train)
    sub.add_lazy("report", "rebuild a run folder's report.html", _fill_report)
    sub.add_lazy("experiment", "run one of the papers' experiments (see `gradleak list`)", _fill_experiment)
    sub.add_lazy("list", "list models, data sources, attacks and experiments", _fill_list)
    sub.add_lazy("sweep", "run a grid of attacks (SPEC.yaml: base + grid) on a process pool or Ray", _fill_sweep)
    sub.add_lazy("audit-flower", LAZY_HELP["audit-flower"], _fill_audit_flower)
    sub.add_lazy("dashboard", LAZY_HELP["dashboard"], _fill_dashboard)
    return p


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser of sub-command ``name`` with all its flags (its --help, for tools and tests)."""
    subs = next(a for a in build_parser()._actions if isinstance(a, _LazySubParsers))
    return subs.fill(name)


@contextlib.contextmanager
def _signals_interrupt() -> typing.Iterator[None]:
    """For the command's duration, SIGTERM and SIGHUP raise :class:`Terminated` (the attack loop
    and the sweep install their own handlers inside, and restore this one); the previous
    handlers come back afterwards (main() also runs inside tests and other programs)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    from .errors import Terminated

    def raise_terminated(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    wanted = [s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None]
    saved = {}
    for sig in wanted:
        if signal.getsignal(sig) in (signal.SIG_DFL, None):  # a handler someone installed stays
            saved[sig] = signal.signal(sig, raise_terminated)
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with _signals_interrupt():
            return int(args.func(args) or 0)
    except GradleakError as exc:
        from .paths import one_line

        # one line, bounded whatever a message echoes (a hostile file's megabyte of text)
        print(f"gradleak: error: {one_line(str(exc), MAX_ERROR_LINE)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:  # engine.Interrupted: state saved, says how to resume
        if str(exc):
            print(f"gradleak: {exc}", file=sys.stderr)
        else:
            print(f"gradleak: interrupted ({_signal_name(exc)})", file=sys.stderr)
        return int(getattr(exc, "exit_code", 130))


if __name__ == "__main__":
    sys.exit(main())
