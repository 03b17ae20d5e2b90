"""A local Ray instance that stays on this machine: loopback listeners, no probes."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .errors import ConfigError, GradleakError

LOOPBACK = "127.0.0.1"
# Requests sent through this proxy fail at once with "connection refused": no socket can listen
# on port 0 (binding port 0 picks another port).
_NOWHERE = "http://127.0.0.1:0"
_NO_PROXY = "localhost,127.0.0.1,::1"

ENVIRONMENT: dict[str, str] = {
    # Ray's single-machine mode: the node address is loopback (read by each Ray process at import).
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    # No metrics exporter (a listener) in the dashboard agent, no metrics export from the workers.
    "RAY_enable_metrics_collection": "0",
    # Ray's gRPC channels ignore HTTP proxies (Ray's default; a user may have switched it on).
    "RAY_grpc_enable_http_proxy": "0",
    # CPU tasks: Ray leaves CUDA_VISIBLE_DEVICES alone (and does not warn that it will).
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    # The cloud-metadata probes of Ray's dashboard process (see the module's notes in docs/), and any other
    # HTTP(S) request a Ray process makes with requests/urllib, go nowhere; a user's own proxy
    # settings would send them to that proxy, off this machine.
    "http_proxy": _NOWHERE, "https_proxy": _NOWHERE, "HTTP_PROXY": _NOWHERE, "HTTPS_PROXY": _NOWHERE,
    "all_proxy": _NOWHERE, "ALL_PROXY": _NOWHERE,
    "no_proxy": _NO_PROXY, "NO_PROXY": _NO_PROXY,
}


@contextmanager
def local_ray(num_cpus: int, *, verbose: bool = False, keep_signals: bool = False) -> Iterator[None]:
    """Start a local Ray instance of ``num_cpus`` CPUs that listens on loopback only and probes
    nothing (see the module's notes in docs/); shut it down on exit and restore the environment.
    ``keep_signals``: the caller's SIGINT/SIGTERM handlers stay in charge (:func:`init_ray`),
    for a caller whose handlers stop its work in order (a sweep); otherwise Ray's own.

    Raises ConfigError when Ray is already initialised in this process (its network settings
    are not gradleak's to vouch for), GradleakError when Ray did not take 127.0.0.1 as the node
    address (it is shut down again at once)."""
    with environment(ENVIRONMENT):   # before ray is imported: Ray reads some of it at import
        try:
            import ray
            from ray._private import ray_constants
        except ImportError:
            raise ConfigError("Ray is not installed: pip install 'gradleak[fl]'") from None
        if ray.is_initialized():
            raise ConfigError("a Ray instance is already running in this process; gradleak starts its own")
        # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER is read once, when ray is first imported: set its effect
        # here too in case this process imported ray earlier (Ray's processes read the variable).
        cluster_mode = ray_constants.ENABLE_RAY_CLUSTER
        ray_constants.ENABLE_RAY_CLUSTER = False
        try:
            init_ray(address="local", num_cpus=num_cpus, _node_ip_address=LOOPBACK, dashboard_host=LOOPBACK,
                     include_dashboard=False, log_to_driver=verbose, configure_logging=verbose,
                     keep_signals=keep_signals)
            node = ray.util.get_node_ip_address()
            if node != LOOPBACK:
                raise GradleakError(f"Ray took {node} as this machine's address instead of {LOOPBACK}; gradleak "
                                    "runs Ray on loopback only and stopped it")
            yield
        finally:
            ray.shutdown()   # also after a failed ray.init: stops whatever it started
            ray_constants.ENABLE_RAY_CLUSTER = cluster_mode


def init_ray(*, keep_signals: bool = True, **kwargs: Any) -> None:
    """``ray.init(**kwargs)``, then (``keep_signals``) the caller's SIGINT and SIGTERM handlers
    put back. The job's workers do not import from the driver's working folder (nor its script's
    folder): the job config is :func:`job_config`'s unless the caller gives one (or connects as a
    Ray Client, ``ray://``, whose workers never get the driver's folders).

    ray.init makes SIGTERM call ``sys.exit`` and Ray's core worker adds a C-level failure
    handler that prints a crash-style stack trace ("*** SIGTERM received ... PC: @ ...") and
    aborts the process 3 s later if it has not exited by then, which an orderly shutdown of the
    workers can take. For a sweep a SIGTERM is an ordinary request to stop: its own handler
    (which turns it into an interrupt that keeps the finished cells and says how to resume)
    stays in charge. Re-installing a Python handler replaces both of Ray's."""
    import ray

    main = keep_signals and threading.current_thread() is threading.main_thread()
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    if kwargs.get("job_config") is None and not str(kwargs.get("address") or "").startswith("ray://"):
        kwargs["job_config"] = job_config()
    ray.init(**kwargs)
    for sig, handler in saved.items():
        if handler is not None:   # None: not installed from Python; nothing to put back
            signal.signal(sig, handler)


def job_config() -> Any:
    """A ``ray.job_config.JobConfig`` that gives the job's workers no folder of the driver's:
    ``ray.init`` adds the driver's working folder (and script folder) to the job's
    ``py_driver_sys_path`` after the caller built the config, and every worker prepends that
    list to its ``sys.path`` before loading task code; this config leaves the list empty when
    Ray serialises it for the workers."""
    from ray.job_config import JobConfig

    class NoDriverFolders(JobConfig):
        def _get_proto_job_config(self) -> Any:
            self._py_driver_sys_path = []
            return super()._get_proto_job_config()

    return NoDriverFolders()


# Python >= 3.11: no working folder (nor script folder) at the head of sys.path (python -P).
SAFE_PATH = {"PYTHONSAFEPATH": "1"}


@contextmanager
def safe_path_children() -> Iterator[None]:
    """Python processes started in the block put neither their working folder nor their script's
    folder at the head of ``sys.path`` (``PYTHONSAFEPATH=1``, Python >= 3.11, inherited by what
    they start in turn). For multiprocessing's spawn and forkserver children: they start as
    ``python -c ...``, whose ``sys.path[0]`` is the working folder until the parent's path
    replaces it, after ``multiprocessing`` and its imports (``pickle``, ``socket`` ...) were
    loaded; Python 3.10 has no such switch (its children keep that behaviour)."""
    with environment(SAFE_PATH):
        yield


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in os.environ for the block (processes started in it inherit them), then
    restore what was there."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
