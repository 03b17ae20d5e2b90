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


# `make test` runs the suite on 2 xdist workers (`-n 2 --dist loadgroup`). Tests that start a
# local Ray instance (the Ray sweep, Flower's simulation engine) share one group, so two Ray
# instances never start at once on a 2-core machine.
_RAY_TESTS = ("test_sweep.py::test_ray_sweep", "test_flower_audit.py::test_flower_example_federation")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(name in item.nodeid for name in _RAY_TESTS):
            item.add_marker(pytest.mark.xdist_group("ray"))
