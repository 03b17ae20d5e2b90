"""Sweeps: a grid of attack configs run on a process pool or Ray, each finished cell committed
to DIR/results.sqlite at once and listed in DIR/results.csv; reruns skip finished cells."""

from .engine import SweepSummary, run_sweep
from .executors import EXECUTORS
from .spec import Cell, SweepSpec, cell_identity, cells_spec, load_spec, parse_spec
from .store import CSV_NAME, STORE_NAME, CellRecord, ResultStore

__all__ = ["CSV_NAME", "Cell", "CellRecord", "EXECUTORS", "ResultStore", "STORE_NAME", "SweepSpec",
           "SweepSummary", "cell_identity", "cells_spec", "load_spec", "parse_spec", "run_sweep"]
