"""One module per paper table or reviewer question; see base.py for the common frame."""

from .base import (EXPERIMENTS, ExperimentOptions, ExperimentResult, experiment, experiment_names, make_options,
                   markdown_table, run_experiment)

__all__ = ["EXPERIMENTS", "ExperimentOptions", "ExperimentResult", "experiment", "experiment_names",
           "make_options", "markdown_table", "run_experiment"]
