"""What a run leaves: its result in memory (RunResult) and its run folder on disk (write_run)."""

from __future__ import annotations

import csv
import io
import json
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .. import __version__
from ..config import record_json
from ..engine.checkpoints import state_dir_for
from ..paths import StagedDir
from ..runtime import allocator, cpu_model

if TYPE_CHECKING:
    from ..config import AttackConfig
    from .case import Case


@dataclass
class RunResult:
    run_dir: Path | None
    metrics: dict[str, Any]
    reconstruction: Any          # attacks.Reconstruction (images) or text.TextReconstruction
    history: list[dict[str, Any]] = field(default_factory=list)
    rank: int = 0  # seeds over processes (--nproc, torchrun): only rank 0's result has metrics


def versions(device: torch.device) -> dict[str, str]:
    import numpy

    info = {"gradleak": __version__, "torch": torch.__version__, "numpy": numpy.__version__,
            "python": platform.python_version(), "platform": platform.platform(), "device": str(device),
            "cpu": cpu_model(), "allocator": allocator()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def default_run_dir(name: str) -> Path:
    """runs/<time>-<name>, with -2, -3, ... when taken (or when a saved state claims it)."""
    base = Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"
    path, n = base, 1
    while path.exists() or state_dir_for(path).exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def jsonable(value: Any) -> Any:
    """``value`` with tensors as lists and non-finite floats as null (metrics.json is strict JSON)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


def history_csv(history: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    """iteration, loss, then the case's observed columns (psnr; phase, token_accuracy)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["iteration", "loss", *columns])
    for h in history:
        row: list[Any] = [int(h["iteration"]), repr(float(h["loss"]))]
        for c in columns:
            v = h.get(c)
            row.append("" if v is None else f"{v:.4f}" if isinstance(v, float) else v)
        w.writerow(row)
    return buf.getvalue()


def write_run(out: Path, cfg: "AttackConfig", case: "Case", recon: Any, metrics: dict[str, Any],
              history: list[dict[str, Any]], *, attack: Any, stage: StagedDir | None = None) -> Path:
    """Write the run folder ``out`` (staged, then renamed into place) and return it. Its
    config.json holds ``cfg``'s run fields and ``attack``, the typed attack config that ran
    (config.record_json)."""
    stage = stage if stage is not None else StagedDir(out)
    tmp = stage.path
    try:
        record = record_json(cfg, attack.model_dump(mode="json"))
        (tmp / "config.json").write_text(json.dumps(record, indent=2) + "\n")
        (tmp / "history.csv").write_text(history_csv(history, case.history_columns))
        case.write_files(tmp, recon)
        (tmp / "metrics.json").write_text(json.dumps(jsonable(metrics), indent=2, ensure_ascii=False) + "\n")
        case.render_report(tmp)
        return stage.commit()
    except BaseException:
        stage.discard()
        raise


__all__ = ["RunResult", "default_run_dir", "history_csv", "jsonable", "versions", "write_run"]
