"""Shared fixtures and helpers of the suite. The test folders mirror the packages (tests/attacks/,
tests/engine/, tests/pipeline/, ...; top-level modules in tests/ itself; tests/reliability/ the
cross-cutting hostile-input and process checks). No folder is a package: pytest puts tests/ on
sys.path for this file, so a test imports the helpers below with ``from conftest import ...``."""

import contextlib
import os

import pytest
import torch

# One intra-op thread: on this 2-core machine, small models run several times faster than with
# two competing OpenMP threads, and the numbers are identical run to run.
torch.set_num_threads(1)
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")


@pytest.fixture(scope="session")
def valid(tmp_path_factory):
    """A folder with a valid update (u.safetensors) and its truth (t.safetensors): lenet-dlg,
    one CIFAR-10 photo. The malformed-input suites derive their hostile files from it."""
    from gradleak.cli import main

    d = tmp_path_factory.mktemp("valid")
    assert main(["share", "--model", "lenet-dlg", "--out", str(d / "u.safetensors"),
                 "--truth", str(d / "t.safetensors")]) == 0
    return d


@pytest.fixture(scope="session")
def cifar10():
    from gradleak.data import open_source

    return open_source("cifar10-samples")



# `make test` runs the suite on 2 xdist workers (`-n 2`). Tests that start a local Ray instance
# (the Ray sweep, Flower's simulation engine) take an exclusive file lock first, so two Ray
# instances never run at once on a 2-core machine, whichever worker runs them. (A lock rather
# than xdist's loadgroup scheduling: after a worker crash, loadgroup can wait forever.)
_RAY_TESTS = ("test_sweep.py::test_ray_sweep", "test_flower_audit.py::test_flower_example_federation",
              "test_loopback.py::test_ray_sweep_stays_on_loopback",
              "test_loopback.py::test_flower_audit_stays_on_loopback",
              "test_cli_quiet.py::test_ray_sweep_sigterm", "test_cli_quiet.py::test_flower_audit_prints_no")


@contextlib.contextmanager
def ray_lock():
    """One Ray at a time on 2 cores: a file lock shared by every test process."""
    import fcntl
    import tempfile
    from pathlib import Path

    lock = Path(tempfile.gettempdir()) / f"gradleak-tests-ray-{os.getuid()}.lock"
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _one_ray_at_a_time(request):
    if not any(name in request.node.nodeid for name in _RAY_TESTS):
        yield
        return
    with ray_lock():
        yield


def rewrite_update(src, dst, tensors_fn=None, meta_fn=None):  # noqa: ANN001, ANN201
    """A copy of safetensors file ``src`` at ``dst`` with its tensors and metadata dict edited in
    place by ``tensors_fn`` / ``meta_fn`` (hostile-input tests)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(src), "pt") as f:
        meta = dict(f.metadata())
    tensors = load_file(str(src))
    if tensors_fn:
        tensors_fn(tensors)
    if meta_fn:
        meta_fn(meta)
    save_file(tensors, str(dst), metadata=meta)
    return dst


def stored_cells(db) -> int:  # noqa: ANN001
    """How many cells a sweep's results.sqlite holds (0 while it does not exist or is locked):
    read-only, so a test can watch a running sweep."""
    import sqlite3

    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return int(con.execute("SELECT COUNT(*) FROM cells").fetchone()[0])
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def idx_bytes(magic: int, array) -> bytes:  # noqa: ANN001
    """An IDX file's bytes (Fashion-MNIST's format: big-endian magic, one uint32 per dimension,
    then the raw uint8 array)."""
    import struct

    dims = b"".join(struct.pack(">I", d) for d in array.shape)
    return struct.pack(">I", magic) + dims + array.tobytes()


@pytest.fixture
def one_thread():
    """torch on one thread for the test (the suite runs 2 workers on 2 cores), restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run_cli(args, capsys) -> tuple[int, list[str]]:  # noqa: ANN001
    """``gradleak.cli.main`` in-process: its exit status and the non-empty lines of its stderr."""
    from gradleak.cli import main

    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.strip()]


def refused(args, capsys, *contains: str) -> str:  # noqa: ANN001
    """The house rule for bad input: exit status 2 and one line ``gradleak: error: ...`` holding
    each of ``contains`` (and no NUL byte); returns that line."""
    code, lines = run_cli(args, capsys)
    assert code == 2, (args, code, lines)
    assert len(lines) == 1 and lines[0].startswith("gradleak: error:"), lines
    assert "\x00" not in lines[0]
    for text in contains:
        assert text in lines[0], lines[0]
    return lines[0]
