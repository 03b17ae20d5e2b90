"""The one run pipeline (see run.py): ``build_case`` -> ``Engine.run`` -> ``case.metrics`` ->
``write_run``. Every entry point (CLI, ``--resume``, sweeps, experiments, the multi-process path)
calls :func:`run`; :func:`attack_update` attacks one update in memory the same way)."""

from .case import MODALITIES, Case, build_case, modality
from .image import attack_update
from .record import RunResult, default_run_dir, jsonable, versions, write_run
from .run import run, run_metrics

__all__ = ["Case", "MODALITIES", "RunResult", "attack_update", "build_case", "default_run_dir", "jsonable", "modality", "run",
           "run_metrics", "versions", "write_run"]
