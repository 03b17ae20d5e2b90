"""`gradleak train`: train a model (optionally under a defense) and save checkpoints."""

from __future__ import annotations

import argparse
from pathlib import Path

from .checks import check_names, say, threads_for_busy_cpu
from ..specs import read_literal
from .flags import fmt_default


# `gradleak train`'s defaults, as training/config.py declares them for TrainConfig (read without
# importing it: it imports torch).
TRAIN_DEFAULTS = read_literal(Path(__file__).resolve().parents[1] / "training" / "config.py", "TRAIN_DEFAULTS")


def cmd_train(args: argparse.Namespace) -> int:
    import dataclasses

    from ..errors import ConfigError

    if args.threads is not None and not 1 <= args.threads <= 512:
        raise ConfigError(f"--threads must be in 1..512, got {args.threads}")
    check_names(model=args.model, data=args.data, defenses=args.defense or ())
    import torch

    from ..training import TrainConfig, train

    threads, note = threads_for_busy_cpu(args.threads, getattr(args, "device", None) or "cpu")
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
    from ..paths import StagedDir

    with StagedDir(args.out) as stage:  # checked and created before training starts
        result = train(cfg, stage.path, progress=args.progress)
        out = stage.commit()
    for c in result.checkpoints:
        print(f"checkpoint {c.fraction:.2f} (step {c.step}): test accuracy {c.test_accuracy:.3f} -> {out / Path(c.path).name}")
    if result.epsilon is not None:
        print(f"DP-SGD epsilon {result.epsilon:.3f}")
    print(f"wrote {out}/training.json, training.png ({result.wall_seconds:.0f} s)")
    say(note)
    return 0


def fill_train(t: argparse.ArgumentParser) -> None:
    def d(name: str) -> str:
        return f" (default: {fmt_default(TRAIN_DEFAULTS[name])})"

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
