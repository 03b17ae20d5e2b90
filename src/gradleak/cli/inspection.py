"""`gradleak inspect`: check a received model for the structures of known malicious servers."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .checks import check_names


EXIT_SUSPICIOUS = 1


def cmd_inspect(args: argparse.Namespace) -> int:
    """`gradleak inspect FILE --model ARCH`: exit 1 when a structure of a known malicious server
    is found, 0 when none is; bad input is one line and exit 2 (main)."""
    import os

    from ..errors import ConfigError
    from ..paths import atomic_write_files, check_input_file, check_output_file, one_line

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
        from ..data import open_source

        source = open_source(args.data, root=args.data_root)
        channels = source.native_channels if channels is None else channels
        num_classes = source.num_classes if num_classes is None else num_classes
    from ..fl.inspect import inspect_file

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
    from ..paths import printable

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


def fill_inspect(i: argparse.ArgumentParser) -> None:
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
