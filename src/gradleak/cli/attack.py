"""`gradleak attack`: simulate a client (or read an update file) and attack it; `--resume`."""

from __future__ import annotations

import argparse

from .checks import precheck, say, threads_for_busy_cpu
from .flags import ATTACK_EPILOG, add_config_flags, config_from, refuse_model_code
from .summary import attack_status, print_summary


# ---------------------------------------------------------------- commands
# Flags that may accompany --resume (they do not change the numbers, or only where stated).
RESUME_OVERRIDES = ("threads", "progress", "checkpoint_every", "device")


def cmd_resume(args: argparse.Namespace) -> int:
    """`gradleak attack --resume RUN`: continue an interrupted run with its saved config."""
    from ..engine.checkpoints import find_state, read_saved_config
    from ..config import AttackConfig, make_config
    from ..errors import ConfigError
    from ..pipeline import run

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
    threads, note = threads_for_busy_cpu(cfg.threads, cfg.device, cfg.nproc)
    if threads != cfg.threads:
        cfg.threads = threads
    result = run(cfg, resume=state_dir)
    print_summary(result.metrics, result.run_dir)
    say(note)
    return attack_status(result.metrics, result.run_dir)


def cmd_attack(args: argparse.Namespace) -> int:
    if getattr(args, "resume", None):
        return cmd_resume(args)
    cfg = config_from(args)
    precheck(cfg)
    from ..pipeline import run

    threads, note = threads_for_busy_cpu(cfg.threads, cfg.device, cfg.nproc)
    if threads != cfg.threads:
        cfg.threads = threads  # recorded in config.json: a rerun from it uses the same threads
    result = run(cfg)  # image or text: the same pipeline
    if result.rank:  # torchrun: a process other than rank 0 (which prints the summary)
        return 0
    print_summary(result.metrics, result.run_dir)
    say(note)
    return attack_status(result.metrics, result.run_dir)


def fill_attack(a: argparse.ArgumentParser) -> None:
    a.add_argument("--config", help="rerun a run folder's config.json (flags given here override it)")
    a.add_argument("--resume", metavar="RUN", help="continue an interrupted run (its --out folder) from its saved "
                   "state, with its saved config (only --threads, --[no-]progress, --checkpoint-every, --device, "
                   "and --model to confirm a saved module:callable model)")
    add_config_flags(a)
    a.epilog = ATTACK_EPILOG
    a.set_defaults(func=cmd_attack)
