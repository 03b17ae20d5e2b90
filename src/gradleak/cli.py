"""The `gradleak` command. User errors become one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import sys
import typing
from pathlib import Path
from typing import Any, Sequence

from .errors import GradleakError

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:  # one line, exit 2 (argparse prints usage too)
        self.exit(EXIT_USAGE, f"gradleak: error: {message}\n")


# ---------------------------------------------------------------- flags from the config model
def _add_config_flags(parser: argparse.ArgumentParser, fields: Sequence[str] | None = None) -> None:
    from .config import AttackConfig

    for name, info in AttackConfig.model_fields.items():
        if fields is not None and name not in fields:
            continue
        flag = "--" + name.replace("_", "-")
        help_ = info.description or ""
        ann = info.annotation
        origin, args = typing.get_origin(ann), typing.get_args(ann)
        if ann is bool:
            if info.default is True:
                parser.add_argument("--no-" + name.replace("_", "-"), dest=name, action="store_false",
                                    default=argparse.SUPPRESS, help=f"do not: {help_}")
            else:
                parser.add_argument(flag, dest=name, action="store_true", default=argparse.SUPPRESS, help=help_)
            continue
        if origin is list:
            parser.add_argument(flag, dest=name, action="append", default=argparse.SUPPRESS, help=help_)
            continue
        inner = [a for a in args if a is not type(None)] if args else [ann]
        base = inner[0] if len(inner) == 1 else str
        choices = None
        if typing.get_origin(base) is typing.Literal:
            choices = list(typing.get_args(base))
            base = str
        conv = {int: int, float: float, str: str}.get(base, str)
        parser.add_argument(flag, dest=name, type=conv, choices=choices, default=argparse.SUPPRESS,
                            metavar=name.upper() if choices is None else None, help=help_)


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
    from .attacks.state import find_state, read_saved_config
    from .config import AttackConfig, make_config
    from .errors import ConfigError
    from .pipeline import run

    state_dir = find_state(args.resume)
    values = read_saved_config(state_dir)
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
    result = run(make_config(**values), resume=state_dir)
    _print_summary(result.metrics, result.run_dir)
    return _attack_status(result.metrics, result.run_dir)


def cmd_attack(args: argparse.Namespace) -> int:
    from .pipeline import run

    if getattr(args, "resume", None):
        return cmd_resume(args)
    result = run(_config_from(args))  # image or text: the same pipeline
    if result.rank:  # torchrun: a process other than rank 0 (which prints the summary)
        return 0
    _print_summary(result.metrics, result.run_dir)
    return _attack_status(result.metrics, result.run_dir)


SHARE_FIELDS = ("model", "width", "data", "data_root", "split", "batch_size", "seed", "model_seed",
                "allow_repeats", "image_size", "num_classes", "share_bn_statistics", "defense", "device",
                "threat", "local_steps", "local_batch_size", "local_lr", "clients", "inner", "checkpoint",
                "modality", "text", "server")


def cmd_share(args: argparse.Namespace) -> int:
    from .paths import check_distinct, check_output_file
    from .pipeline.image import simulate_client

    cfg = _config_from(args, SHARE_FIELDS)
    # Checked before the client is simulated: both are files gradleak may create or replace,
    # and never the same file (nor one of the inputs).
    out = check_output_file(args.out, "--out")
    truth_path = check_output_file(args.truth, "--truth") if args.truth else None
    check_distinct(("--out", out), ("--truth", truth_path), ("--checkpoint", cfg.checkpoint),
                   ("--data", cfg.data if Path(cfg.data).is_file() else None))
    if cfg.modality == "text":
        from .pipeline.text import share_text_client

        case = share_text_client(cfg)
    else:
        case = simulate_client(cfg)
    case.save(out, truth_path)
    print(case.share_line(out, truth_path))
    return 0


def _add_experiment_flags(parser: argparse.ArgumentParser) -> None:
    from .experiments import ExperimentOptions

    for name, info in ExperimentOptions.model_fields.items():
        flag = "--" + name.replace("_", "-")
        ann = info.annotation
        args = [a for a in typing.get_args(ann) if a is not type(None)] or [ann]
        inner = args[0]
        if inner is bool:
            if info.default is True:
                parser.add_argument("--no-" + name.replace("_", "-"), dest=name, action="store_false",
                                    default=argparse.SUPPRESS, help=f"do not: {info.description}")
            else:
                parser.add_argument(flag, dest=name, action="store_true", default=argparse.SUPPRESS,
                                    help=info.description)
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
            parser.add_argument(flag, dest=name, type=parse_list, default=argparse.SUPPRESS, help=info.description)
        else:
            conv = {int: int, float: float}.get(inner, str)
            parser.add_argument(flag, dest=name, type=conv, default=argparse.SUPPRESS,
                                required=info.is_required(), help=info.description)


def cmd_experiment(args: argparse.Namespace) -> int:
    from .experiments import ExperimentOptions, make_options, run_experiment

    values = {k: getattr(args, k) for k in ExperimentOptions.model_fields if hasattr(args, k)}
    result, out = run_experiment(args.name, make_options(**values))
    from rich.console import Console
    from rich.markdown import Markdown

    from .experiments import markdown_table

    Console().print(Markdown(f"**{result.title}**\n\n" + markdown_table(result.columns, result.rows)))
    print(f"wrote {out}/results.csv, results.md" + "".join(f", {f}" for f in result.figures))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    import dataclasses

    import torch

    from .errors import ConfigError
    from .training import TrainConfig, train

    if args.threads is not None and not 1 <= args.threads <= 512:
        raise ConfigError(f"--threads must be in 1..512, got {args.threads}")
    if args.threads:
        torch.set_num_threads(args.threads)
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
    return 0


def _is_text_run(run: Path) -> bool:
    from .report.html import read_metrics  # bounded: a folder, FIFO, huge or deep file is an error

    try:
        metrics = read_metrics(run)
    except GradleakError:
        return False  # the image report gives the error
    return isinstance(metrics, dict) and metrics.get("modality") == "text"


def cmd_report(args: argparse.Namespace) -> int:
    if _is_text_run(Path(args.run)):
        from .text.report import render_text_report as render_report
    else:
        from .report import render_report
    path = render_report(Path(args.run))
    print(f"wrote {path}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from .attacks import attack_names
    from .data import SOURCE_NAMES
    from .models import describe_models

    print("models:")
    for k, v in describe_models().items():
        print(f"  {k:20s} {v}")
    print("data sources: " + ", ".join(SOURCE_NAMES) + ", or a folder (ImageFolder layout)")
    print("attacks: " + ", ".join(attack_names()))
    from .text.attacks import TEXT_ATTACKS
    from .text.models import TEXT_MODELS

    print("text models (--modality text):")
    for k, v in TEXT_MODELS.items():
        print(f"  {k:20s} {v}")
    print("text attacks: " + ", ".join(TEXT_ATTACKS) + "; text data: --text \"...\" (repeatable) or --data FILE.txt")
    from .experiments.base import EXPERIMENTS, experiment_names

    print("experiments:")
    for name in experiment_names():
        print(f"  {name:20s} {EXPERIMENTS[name][1]}")
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
    except KeyboardInterrupt:
        print(f"gradleak: sweep interrupted; finished cells are in {args.out}/results.sqlite, "
              "rerun the same command to continue", file=sys.stderr)
        return 130
    failed = f", {len(summary.failed)} failed" if summary.failed else ""
    lost = f", {len(summary.lost)} lost (rerun to redo)" if summary.lost else ""
    print(f"sweep: {summary.done}/{summary.total} cells done ({summary.skipped} skipped, "
          f"{len(summary.computed)} run{failed}{lost}) in {summary.wall_seconds:.0f} s; "
          f"wrote {args.out}/results.sqlite, results.csv")
    return 0


SUMMARY_KEYS = {
    "image": ("psnr_mean", "ssim_mean", "mse_mean", "label_accuracy", "fft2d_mean", "rpsnr_mean", "lpips_mean",
              "iip", "gradient_distance", "iterations", "wall_seconds"),
    "text": ("token_accuracy", "token_set_precision", "token_set_recall", "bleu", "rouge1", "rougeL",
             "label_accuracy", "gradient_distance", "iterations", "wall_seconds"),
}


def _print_summary(metrics: dict[str, Any], run_dir: Path | None) -> None:
    from rich.console import Console
    from rich.table import Table

    text = metrics.get("modality") == "text"
    where = "text" if text else metrics["data"]
    table = Table(title=f"{metrics['attack']} on {metrics['model']} ({where}, batch {metrics['batch_size']})")
    for col in ("metric", "value"):
        table.add_column(col)

    def fmt(v: Any) -> str:
        if v is None:
            return "n/a" if text else "n/a (no ground truth)"
        if isinstance(v, float):
            return f"{v:.3e}" if (abs(v) < 1e-2 and v != 0) else f"{v:.3f}"
        return str(v)

    for key in SUMMARY_KEYS["text" if text else "image"]:
        if key == "lpips_mean" and metrics.get(key) is None:
            continue  # the notice below says why
        if key in metrics:
            table.add_row(key, fmt(metrics[key]))
    if metrics.get("defenses"):
        table.add_row("defenses", ", ".join(metrics["defenses"]))
    if isinstance(metrics.get("separated"), int):  # the closed-form attacks on a batch
        table.add_row("inputs separated", f"{metrics['separated']} of {metrics['batch_size']}")
    conv = metrics.get("convergence") or {}
    if "converged" in metrics:
        rel = conv.get("relative_gradient_distance")
        table.add_row("converged", ("yes" if metrics["converged"] else "NO: inconclusive")
                      + (f" (relative distance {rel:.2e})" if isinstance(rel, float) else ""))
    console = Console()
    console.print(table)
    auto = metrics.get("auto")
    if isinstance(auto, dict):  # --attack auto: what it tried and what it used
        tried = ", ".join(f"{t['attack']} ({'converged' if t.get('converged') else 'not converged'})" if t.get("applies")
                          else f"{t['attack']} (does not apply)" for t in auto.get("tried", []))
        console.print(f"auto: used {auto.get('used')}: {auto.get('why')}. Tried: {tried}", markup=False,
                      highlight=False)
    if metrics.get("converged") is False:
        console.print(f"verdict: inconclusive. {conv.get('reason', '')}", markup=False, highlight=False)
    if text:
        rows = metrics.get("per_sentence") or []
        for r in rows:
            console.print(f"  original : {r['original']}", markup=False, highlight=False)
            console.print(f"  recovered: {r['recovered']}", markup=False, highlight=False)
        if not rows:
            for sentence in metrics.get("recovered_sentences", []):
                console.print(f"  recovered: {sentence}", markup=False, highlight=False)
    if metrics.get("lpips_notice"):
        console.print(metrics["lpips_notice"], markup=False)
    if run_dir is not None:
        files = "reconstruction.json" if text else "reconstruction.png"
        console.print(f"run folder: {run_dir}  (report.html, {files}, metrics.json)")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = _Parser(prog="gradleak", description="How much private data leaks from federated-learning updates.")
    p.add_argument("--version", action="version", version=f"gradleak {__version__}")
    sub = p.add_subparsers(dest="command", parser_class=_Parser, required=True)

    a = sub.add_parser("attack", help="simulate a client (or read an update file) and attack it")
    a.add_argument("--config", help="rerun a run folder's config.json (flags given here override it)")
    a.add_argument("--resume", metavar="RUN", help="continue an interrupted run (its --out folder) from its saved "
                   "state, with its saved config (only --threads, --[no-]progress, --checkpoint-every, --device)")
    _add_config_flags(a)
    a.set_defaults(func=cmd_attack)

    s = sub.add_parser("share", help="compute a client's shared update and write it as safetensors")
    _add_config_flags(s, SHARE_FIELDS)
    s.add_argument("--out", required=True, help="update file to write (.safetensors)")
    s.add_argument("--truth", help="also write the true batch here (for evaluation only)")
    s.set_defaults(func=cmd_share)

    t = sub.add_parser("train", help="train a model (optionally under a defense) and save checkpoints")
    t.add_argument("--model", default=None, help="model name (default lenet-dlg)")
    t.add_argument("--width", type=int, default=None, help="model width (convnet)")
    t.add_argument("--data", default=None, help="data source (default fashion-mnist)")
    t.add_argument("--data-root", dest="data_root", default=None, help="folder overriding the source's location")
    t.add_argument("--image-size", dest="image_size", type=int, default=None, help="input size")
    t.add_argument("--epochs", type=float, default=None, help="epochs (fractions allowed)")
    t.add_argument("--batch-size", dest="batch_size", type=int, default=None, help="mini-batch size")
    t.add_argument("--lr", type=float, default=None, help="SGD learning rate")
    t.add_argument("--momentum", type=float, default=None, help="SGD momentum")
    t.add_argument("--defense", action="append", default=None, help="defense applied to every gradient step")
    t.add_argument("--checkpoints", default=None, help="fractions of training to save, e.g. 0,0.3,0.7,1.0")
    t.add_argument("--train-subset", dest="train_subset", type=int, default=None, help="use N training images")
    t.add_argument("--test-subset", dest="test_subset", type=int, default=None, help="score on N test images")
    t.add_argument("--seed", type=int, default=None, help="seed")
    t.add_argument("--model-seed", dest="model_seed", type=int, default=None, help="weight-init seed")
    t.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    t.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    t.add_argument("--out", required=True, help="output folder")
    t.set_defaults(func=cmd_train)

    r = sub.add_parser("report", help="rebuild a run folder's report.html")
    r.add_argument("run", help="run folder")
    r.set_defaults(func=cmd_report)

    e = sub.add_parser("experiment", help="run one of the papers' experiments (see `gradleak list`)")
    e.add_argument("name", help="experiment name")
    _add_experiment_flags(e)
    e.set_defaults(func=cmd_experiment)

    m = sub.add_parser("list", help="list models, data sources, attacks and experiments")
    m.set_defaults(func=cmd_models)

    w = sub.add_parser("sweep", help="run a grid of attacks (SPEC.yaml: base + grid) on a process pool or Ray")
    w.add_argument("spec", help="sweep spec (YAML/JSON): base: {fields}, grid: {field: [values]}")
    w.add_argument("--out", required=True, help="results folder (results.sqlite, results.csv); rerun to resume")
    w.add_argument("--executor", choices=("local", "ray", "inline"), default="local",
                   help="local: process pool (default); ray: Ray tasks; inline: this process")
    w.add_argument("--address", default=None, help="Ray cluster address (default: start a local Ray)")
    w.add_argument("--workers", type=int, default=None, help="parallel cells (default: the CPUs available)")
    w.add_argument("--retry-failed", dest="retry_failed", action="store_true", help="rerun cells that failed")
    w.add_argument("--save-runs", dest="save_runs", action="store_true", help="also write DIR/runs/<cell>/ run folders")
    w.add_argument("--no-progress", dest="progress", action="store_false", help="one line per cell, no bar")
    w.set_defaults(func=cmd_sweep)

    from .audit.command import add_audit_flower_parser  # imports no flwr until it runs

    add_audit_flower_parser(sub)
    from .sweep.dashboard import add_dashboard_parser

    add_dashboard_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except GradleakError as exc:
        print(f"gradleak: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:  # attacks.state.Interrupted: state saved, says how to resume
        print(f"gradleak: {exc}" if str(exc) else "gradleak: interrupted", file=sys.stderr)
        return int(getattr(exc, "exit_code", 130))


if __name__ == "__main__":
    sys.exit(main())
