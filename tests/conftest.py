import os

import pytest
import torch

# One intra-op thread: on this 2-core machine, small models run several times faster than with
# two competing OpenMP threads, and the numbers are identical run to run.
torch.set_num_threads(1)
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")


@pytest.fixture(scope="session")
def cifar10():
    from gradleak.data import open_source

    return open_source("cifar10-samples")
