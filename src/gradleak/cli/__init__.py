"""The `gradleak` command. User errors become one line on stderr and exit status 2.
Each sub-command's flags are added only when it is parsed, so ``gradleak --help`` imports neither
torch nor the config models, and ``gradleak attack --help`` only the pydantic config."""

from __future__ import annotations

import argparse
import contextlib
import sys
import typing
from typing import Any, Callable, Sequence

from ..errors import GradleakError
from .attack import fill_attack
from .checks import check_data_folder, check_names, precheck
from .experiment import fill_experiment, print_experiment
from .flags import EXIT_USAGE, MAX_ERROR_LINE, attack_defaults, refuse_model_code, show_defaults
from .inspection import fill_inspect
from .report import fill_list, fill_report
from .share import fill_share
from .summary import print_summary
from .sweep import fill_sweep, signal_name, sweep_command
from .train import TRAIN_DEFAULTS, fill_train

__all__ = ["EXIT_USAGE", "LAZY_HELP", "MAX_ERROR_LINE", "TRAIN_DEFAULTS", "attack_defaults", "build_parser",
           "check_data_folder", "check_names", "command_parser", "main", "precheck", "print_experiment",
           "print_summary", "refuse_model_code", "sweep_command"]


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
            show_defaults(parser)
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


# One-line help of the sub-commands whose flags a module that imports torch adds (they are added
# only when the sub-command runs); tests/cli/test_cli_quiet.py checks they equal the modules' own.
LAZY_HELP = {
    "audit-flower": "run an example Flower federation (Fashion-MNIST, FedAvg) and audit every client's update "
                    "each round",
    "dashboard": "one self-contained HTML risk report of a sweep, an experiment or a Flower audit (or a "
                 "comparison of two)",
}


def _fill_audit_flower(f: argparse.ArgumentParser) -> None:
    from ..audit.command import add_audit_flower_parser  # torch and flwr only when it runs, after its checks

    add_audit_flower_parser(_Registered(f))


def _fill_dashboard(d: argparse.ArgumentParser) -> None:
    from ..sweep.dashboard_cli import add_dashboard_parser

    add_dashboard_parser(_Registered(d))


def build_parser() -> argparse.ArgumentParser:
    """The `gradleak` parser; a sub-command's flags are added when it is parsed (see
    _LazySubParsers, and :func:`command_parser` for one sub-command's whole parser)."""
    from .. import __version__

    p = _Parser(prog="gradleak", description="How much private data leaks from federated-learning updates.")
    p.add_argument("--version", action="version", version=f"gradleak {__version__}")
    sub = p.add_subparsers(dest="command", parser_class=_Parser, required=True, action=_LazySubParsers)
    sub.add_lazy("attack", "simulate a client (or read an update file) and attack it", fill_attack)
    sub.add_lazy("share", "compute a client's shared update and write it as safetensors", fill_share)
    sub.add_lazy("inspect", "check a received model for the structures of known malicious servers (exit 1 if found)",
                 fill_inspect)
    sub.add_lazy("train", "train a model (optionally under a defense) and save checkpoints", fill_train)
    sub.add_lazy("report", "rebuild a run folder's report.html", fill_report)
    sub.add_lazy("experiment", "run one of the papers' experiments (see `gradleak list`)", fill_experiment)
    sub.add_lazy("list", "list models, data sources, attacks and experiments", fill_list)
    sub.add_lazy("sweep", "run a grid of attacks (SPEC.yaml: base + grid) on a process pool or Ray", fill_sweep)
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

    from ..errors import Terminated

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
        from ..paths import one_line

        # one line, bounded whatever a message echoes (a hostile file's megabyte of text)
        print(f"gradleak: error: {one_line(str(exc), MAX_ERROR_LINE)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:  # engine.Interrupted: state saved, says how to resume
        if str(exc):
            print(f"gradleak: {exc}", file=sys.stderr)
        else:
            print(f"gradleak: interrupted ({signal_name(exc)})", file=sys.stderr)
        return int(getattr(exc, "exit_code", 130))
