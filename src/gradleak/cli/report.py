"""`gradleak report RUN` (rebuild a run folder's report.html) and `gradleak list`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import GradleakError


def _run_modality(run: Path) -> Any:
    """The modality (modalities.Modality) a run folder's metrics.json names."""
    from ..modalities import IMAGE, recorded_modality
    from ..report.run_page import read_metrics  # bounded: a folder, FIFO, huge or deep file is an error

    try:
        metrics = read_metrics(run)
    except GradleakError:
        return IMAGE  # the image report gives the error
    return recorded_modality(metrics.get("modality") if isinstance(metrics, dict) else None)


def cmd_report(args: argparse.Namespace) -> int:
    import os

    from ..errors import DataError
    from ..paths import one_line

    run = Path(args.run)
    if not os.path.lexists(run) or not run.is_dir():  # answered before the report modules (torch) load
        what = "does not exist" if not os.path.lexists(run) else "is not a folder; give a run folder (an --out of attack)"
        raise DataError(f"run folder {one_line(str(run))} {what}")
    path = _run_modality(run).render_report(Path(args.run))
    print(f"wrote {path}")
    return 0


def fill_report(r: argparse.ArgumentParser) -> None:
    r.add_argument("run", help="run folder")
    r.set_defaults(func=cmd_report)


def cmd_models(args: argparse.Namespace) -> int:
    """`gradleak list`, from the torch-free catalog (tests/test_catalog.py holds it to the registries)."""
    from .. import catalog

    sections = {"models": dict(sorted(catalog.MODELS.items())), "attacks": catalog.IMAGE_ATTACKS,
                "text models": catalog.TEXT_MODELS, "text attacks": catalog.TEXT_ATTACKS,
                "defenses": catalog.DEFENSE_SUMMARIES, "servers": catalog.SERVER_SUMMARIES,
                "experiments": dict(sorted(catalog.EXPERIMENTS.items()))}
    width = max(20, *(len(k) for names in sections.values() for k in names))

    def section(title: str, names: dict[str, str]) -> None:
        print(f"{title}:")
        for k, v in names.items():
            print(f"  {k:{width}s} {v}")

    section("models", sections["models"])
    print("data sources: " + ", ".join(catalog.SOURCES) + ", or a folder (ImageFolder layout)")
    section("attacks", sections["attacks"])
    examples = [e for e in catalog.DEFENSE_EXAMPLES.values() if ":" in e][:2]
    section(f"defenses (--defense NAME[:VALUE], e.g. {', '.join(examples)}; repeatable)", sections["defenses"])
    section("servers (--server NAME[:KEY=VALUE,...])", sections["servers"])
    section("text models (--modality text)", sections["text models"])
    section("text attacks (--modality text; text data: --text \"...\" (repeatable) or --data FILE.txt)",
            sections["text attacks"])
    section("experiments", sections["experiments"])
    return 0


def fill_list(m: argparse.ArgumentParser) -> None:
    m.set_defaults(func=cmd_models)
