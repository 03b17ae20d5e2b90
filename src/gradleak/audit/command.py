"""`gradleak audit-flower`: run the example Flower federation with the leakage audit on."""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    from .settings import FederationSettings


def _add_local_training_flags(f: Any) -> None:
    """The clients' local training (torch.optim's meanings, as `gradleak share`'s --local-* flags),
    announced in the train config, which the audit reads back and models."""
    f.add_argument("--local-epochs", dest="local_epochs", type=int, default=None,
                   help="FedAvg local epochs over each client's --examples (default 2; or --local-steps)")
    f.add_argument("--local-steps", dest="local_steps", type=int, default=None,
                   help="FedAvg local steps, instead of --local-epochs")
    f.add_argument("--batch-size", dest="batch_size", type=int, default=None,
                   help="FedAvg local mini-batch size (default: all --examples)")
    f.add_argument("--lr", type=float, default=0.01, help="FedAvg local learning rate")
    f.add_argument("--local-optimizer", dest="local_optimizer", default="sgd",
                   help="the clients' torch.optim optimizer: sgd | adam | adamw (default sgd)")
    f.add_argument("--local-momentum", dest="local_momentum", type=float, default=None,
                   help="SGD momentum (default 0.9 for sgd, 0 otherwise)")
    f.add_argument("--local-nesterov", dest="local_nesterov", action="store_true", help="SGD Nesterov momentum")
    f.add_argument("--local-weight-decay", dest="local_weight_decay", type=float, default=5e-4,
                   help="weight decay (L2 for sgd and adam, decoupled for adamw) (default 5e-4)")
    f.add_argument("--local-betas", dest="local_betas", default=None, help="adam/adamw betas b1,b2 (default 0.9,0.999)")
    f.add_argument("--local-eps", dest="local_eps", type=float, default=1e-8, help="adam/adamw eps (default 1e-8)")
    f.add_argument("--local-augment", dest="local_augment", default="none",
                   help="the clients' private augmentation: none | flip | crop-flip (default none)")
    f.add_argument("--local-crop-padding", dest="local_crop_padding", type=int, default=4,
                   help="crop-flip's zero padding in pixels (default 4)")


def add_audit_flower_parser(sub: Any) -> None:
    f = sub.add_parser("audit-flower", help="run an example Flower federation (Fashion-MNIST, FedAvg) and audit "
                                            "every client's update each round")
    f.add_argument("--rounds", type=int, default=3, help="federated rounds (default 3)")
    f.add_argument("--clients", type=int, default=3, help="clients, each with a Fashion-MNIST partition (default 3)")
    f.add_argument("--attack", default="dlg", help="gradleak attack run on each update: " + _attack_names()
                   + " (auto: closed form first; the default of gradleak attack, not of the audit; imprint and trap "
                   "read the block of --server imprint or trap) (default: dlg)")
    from ..server_spec import server_usage  # torch-free: the declared servers and their parameters

    f.add_argument("--server", default="honest",
                   help=f"what the server sends the clients: {server_usage()} (N an integer, X a number; a malicious "
                        "server's block in front of --model; the clients train the model it sends) (default: honest)")
    f.add_argument("--out", required=True, help="output folder: audit.csv (the index), audit.json, runs/ (a run "
                                                "folder per attacked update: round-RRR-client-C/)")
    f.add_argument("--iterations", type=int, default=None, help="attack iterations (default: the attack's)")
    f.add_argument("--attack-lr", dest="attack_lr", type=float, default=None,
                   help="attack learning rate (default: the attack's)")
    f.add_argument("--optimizer", choices=("lbfgs", "adam", "sgd"), default=None,
                   help="attack optimizer (default: the attack's)")
    f.add_argument("--dtype", choices=("float32", "float64"), default=None,
                   help="attack precision (default: the attack's)")
    f.add_argument("--preset", default=None, help="GradInversion preset: cpu | paper | imagenet (default: cpu)")
    f.add_argument("--seeds", type=int, default=None,
                   help="GradInversion: candidates per image (default: the preset's, cpu 4)")
    f.add_argument("--restarts", type=int, default=None, help="Inverting Gradients: restarts (default: 1)")
    f.add_argument("--labels", default=None, help="label restoration (ig, gradinversion): gradinversion | sum | "
                                                 "counts | llg | idlg (default: gradinversion)")
    f.add_argument("--attack-seed", dest="attack_seed", type=int, default=0, help="the attack's random start")
    f.add_argument("--device", default="cpu", help="device of the attack (cpu | cuda | auto)")
    f.add_argument("--examples", type=int, default=1, help="images per client per round (default 1)")
    _add_local_training_flags(f)
    f.add_argument("--model", default="lenet-dlg", help="model (a gradleak model name)")
    f.add_argument("--width", type=int, default=None, help="model width (convnet, mlp; default: the model's)")
    f.add_argument("--image-size", dest="image_size", type=int, default=28, help="input size (default 28)")
    f.add_argument("--data-root", dest="data_root", default=None,
                   help="Fashion-MNIST IDX folder (default: $GRADLEAK_FASHION_MNIST, else the installed copy)")
    f.add_argument("--seed", type=int, default=0, help="federation seed: model init and client batches")
    f.add_argument("--defense", action="append", default=[], help="update-level defense every client applies")
    f.add_argument("--verbose", action="store_true", help="show Flower's and Ray's logs")
    f.set_defaults(func=cmd_audit_flower)


def _local_training(args: argparse.Namespace) -> dict[str, Any]:
    """FederationSettings' local-training fields from the flags (ConfigError for a pair that
    cannot go together; the ranges are FederationSettings.check's)."""
    from ..config import parse_betas

    if args.local_steps is not None and args.local_epochs is not None:
        raise ConfigError("audit-flower: give --local-epochs or --local-steps, not both")
    sgd = args.local_optimizer == "sgd"
    if args.local_betas is not None and sgd:
        raise ConfigError("audit-flower: --local-betas applies to --local-optimizer adam or adamw, not sgd")
    try:
        betas = parse_betas(args.local_betas) if args.local_betas is not None else (0.9, 0.999)
    except ValueError as exc:
        raise ConfigError(f"audit-flower: --local-betas {exc}") from None
    momentum = args.local_momentum if args.local_momentum is not None else 0.9 if sgd else 0.0
    return {"local_steps": args.local_steps, "local_epochs": args.local_epochs if args.local_epochs is not None else 2,
            "optimizer": args.local_optimizer, "momentum": momentum, "nesterov": args.local_nesterov,
            "weight_decay": args.local_weight_decay, "betas": betas, "eps": args.local_eps,
            "augment": args.local_augment, "crop_padding": args.local_crop_padding}


def _attack_names() -> str:
    """Every image attack of the catalog, as the help lists them (torch-free: the attacks' SPECs)."""
    from ..catalog import IMAGE_ATTACKS

    return " | ".join(IMAGE_ATTACKS)


def _attack_options(args: argparse.Namespace) -> dict[str, Any]:
    """The attack's settings for the audit: its name, seed and device, and the options given."""
    attack: dict[str, Any] = {"attack": args.attack, "seed": args.attack_seed, "device": args.device}
    for key, value in (("iterations", args.iterations), ("lr", args.attack_lr), ("optimizer", args.optimizer),
                       ("dtype", args.dtype), ("preset", args.preset), ("seeds", args.seeds),
                       ("restarts", args.restarts), ("labels", args.labels)):
        if value is not None:
            attack[key] = value
    return attack


def _check_names_and_numbers(args: argparse.Namespace, settings: FederationSettings) -> None:
    """audit-flower's names and numbers, from torch-free tables (a mistake is answered in a
    fraction of a second): ConfigError on the first bad one."""
    from ..catalog import DEFENSES, check, unknown
    from .settings import FederationSettings, check_attack_server

    check("attack", args.attack)
    if ":" not in args.model:
        check("model", args.model, " or package.module:callable")
    for spec in settings.defense:
        name = str(spec).strip().partition(":")[0].strip().lower()
        if name not in DEFENSES:
            raise unknown("defense", name, DEFENSES)
    settings.check(with_defenses=False)
    check_attack_server(args.attack, settings.server)
    if not 0 <= args.attack_seed <= FederationSettings.MAX_SEED:
        raise ConfigError(f"audit-flower: --attack-seed must be in 0..{FederationSettings.MAX_SEED} "
                          f"(got {args.attack_seed})")
    if args.attack_lr is not None and not (math.isfinite(args.attack_lr) and args.attack_lr > 0):
        raise ConfigError(f"audit-flower: --attack-lr must be a positive finite number (got {args.attack_lr})")


def cmd_audit_flower(args: argparse.Namespace) -> int:
    from ..paths import StagedDir, check_output_dir
    from ..errors import sigterm_as_interrupt
    from .settings import FederationSettings

    # Like `gradleak attack`, the audit is staged: --out is checked here, the audit writes into a
    # hidden staging folder beside it (.<out>.partial-..., where audit.csv and runs/ grow as
    # rounds finish) created just before the federation starts, renamed to --out once the audit is
    # complete; a failed or interrupted audit leaves nothing (its rerun is the same command).
    out = check_output_dir(args.out)
    attack = _attack_options(args)
    settings = FederationSettings(rounds=args.rounds, clients=args.clients, examples=args.examples,
                                  batch_size=args.batch_size, lr=args.lr, **_local_training(args),
                                  model=args.model, width=args.width, image_size=args.image_size,
                                  data_root=args.data_root, seed=args.seed, defense=list(args.defense),
                                  server=args.server, verbose=args.verbose)
    # Validate everything (attack name and options included) before anything starts: each bad
    # value is one line and exit status 2, with no Ray started and no output written.
    _check_names_and_numbers(args, settings)
    from .auditor import AuditSettings
    from .example import run_federation

    settings.check()   # the defenses parsed too (torch)
    cfg = AuditSettings(attack=attack, out=out).attack_config()
    from ..attacks import resolve_attack
    from ..runtime import resolve_device

    resolve_attack(cfg.model_dump(), bn_statistics_shared=True)  # the name; options the attack ignores
    resolve_device(cfg.device)
    # SIGTERM stops the audit like Ctrl-C (exit 143): the federation and its thread are stopped
    # (run_federation), the staging folder removed.
    with sigterm_as_interrupt():
        stage = StagedDir(out)
        try:
            with contextlib.nullcontext() if args.verbose else _without_known_flower_warnings():
                result = run_federation(settings, attack, stage.path, recorded_out=out)
            stage.commit()
        except BaseException:
            stage.discard()
            raise
    _print_rows(result["rows"], out, result.get("wall_seconds"))
    return 0


class KnownFlowerWarnings(logging.Filter):
    """Drops the two WARNING records Flower 1.41 logs on every run of the example federation,
    neither of which the user can act on:

    * ``DEPRECATED FEATURE: The `run_simulation` function is deprecated ... use `flwr run` in the
      CLI``: flwr 1.41 has no in-process replacement; ``flwr run`` runs a Flower app project
      through a SuperLink in other processes, which the audit (its auditor and its clients'
      ground truth in this process, Ray on loopback only) cannot use.
    * ``fraction_evaluate is set to 0.0. Federated evaluation will be skipped.``: the example
      skips Flower's federated evaluation on purpose (its clients only train).

    Matched by level, logging module and message, so any other Flower warning still shows
    (and all of them with --verbose)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        message = record.getMessage()
        deprecated = (record.module == "logger" and record.funcName == "warn_deprecated_feature"
                      and "The `run_simulation` function is deprecated" in message)
        no_evaluation = record.module == "fedavg" and message.startswith("fraction_evaluate is set to 0.0")
        return not (deprecated or no_evaluation)


@contextlib.contextmanager
def _without_known_flower_warnings() -> Iterator[None]:
    """:class:`KnownFlowerWarnings` on Flower's logger for the block."""
    logger = logging.getLogger("flwr")   # flwr.supercore.logger.LOGGER_NAME; the filter applies to its records
    known = KnownFlowerWarnings()
    logger.addFilter(known)
    try:
        yield
    finally:
        logger.removeFilter(known)


ROW_COLUMNS = ("round", "client", "status", "verdict", "psnr_mean", "relative_gradient_distance")


def _print_rows(rows: list[dict[str, Any]], out: Path, wall: float | None) -> None:
    from rich.console import Console

    from ..console import print_table

    console = Console()
    print_table(console, list(ROW_COLUMNS), sorted(rows, key=lambda r: (int(r["round"]), str(r["client"]))),
                title="leakage per client and round")
    runs = sum(1 for r in rows if r.get("run"))
    console.print(f"wrote {out}/audit.csv, audit.json and {runs} run folder(s) in runs/"
                  + (f" ({wall:.0f} s)" if wall else ""), highlight=False, markup=False)
