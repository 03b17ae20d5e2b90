"""`gradleak share`: compute a client's shared update and write it as safetensors."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .checks import precheck
from .flags import add_config_flags, config_from


SHARE_FIELDS = ("model", "width", "data", "data_root", "split", "batch_size", "seed", "model_seed",
                "allow_repeats", "image_size", "num_classes", "share_bn_statistics", "defense", "device",
                "threat", "local_steps", "local_batch_size", "local_lr", "clients", "inner", "checkpoint",
                "modality", "text", "server", "local_epochs", "local_optimizer", "local_momentum", "local_nesterov",
                "local_weight_decay", "local_betas", "local_eps", "local_augment", "local_crop_padding")


def cmd_share(args: argparse.Namespace) -> int:
    from ..paths import check_apart, check_distinct, check_output_file, run_inputs

    cfg = config_from(args, SHARE_FIELDS)
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
    from ..modalities import modality_named

    case = modality_named(cfg.modality).share_client(cfg)
    if model_out is None:
        case.save(out, truth_path, force=args.force)
    else:
        _save_with_model(case, out, truth_path, model_out, force=args.force)
    print(case.share_line(out, truth_path) + (f"; the model received in {model_out}" if model_out else ""))
    return 0


def _save_with_model(case: Any, out: Path, truth_path: Path | None, model_out: Path, *, force: bool) -> None:
    """share's files and the model the client received (--model-out), written all or none."""
    from ..fl.inspect import received_model_bytes
    from ..paths import atomic_write_files

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


def fill_share(s: argparse.ArgumentParser) -> None:
    add_config_flags(s, SHARE_FIELDS)
    s.add_argument("--out", required=True, help="update file to write (.safetensors)")
    s.add_argument("--truth", help="also write the true batch here (for evaluation only)")
    s.add_argument("--model-out", dest="model_out", help="also write the model the client received (its state "
                   "dict as the server sent it, a malicious server's block included) here, for `gradleak inspect`")
    s.add_argument("--force", action="store_true", help="replace an existing --out / --truth / --model-out file "
                   "(all are written together, or none)")
    s.set_defaults(func=cmd_share)
