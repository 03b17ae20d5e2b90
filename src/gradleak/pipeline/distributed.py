"""An attack's independent runs (its SPEC's "shards" flag: GradInversion's seeds) spread over
processes (``gradleak attack --nproc P``, or torchrun)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch

from ..engine import SeedShard
from ..config import AttackConfig
from ..errors import ConfigError, GradleakError
from ..localray import safe_path_children
from ..paths import check_output_dir
from .record import RunResult, default_run_dir, jsonable

# run_shard(cfg, shard, write) -> RunResult: the pipeline's per-process run (pipeline/run.py)
RankRun = Callable[[AttackConfig, SeedShard, bool], RunResult]

ENV_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
TIMEOUT = timedelta(minutes=30)  # a collective waiting longer than this means a lost process


def env_world() -> int:
    """WORLD_SIZE when this process was launched by torchrun (all of ENV_VARS set), else 1."""
    if not all(os.environ.get(v) for v in ENV_VARS):
        return 1
    try:
        return max(1, int(os.environ["WORLD_SIZE"]))
    except ValueError:
        raise ConfigError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not a number") from None


def wanted(cfg: AttackConfig) -> bool:
    """Whether ``cfg`` runs over several processes (--nproc > 1, or launched by torchrun)."""
    return cfg.nproc > 1 or env_world() > 1


def resolved_seeds(cfg: AttackConfig) -> int:
    """G: the value of the attack's "shards" flag in ``cfg`` (given, else its preset's or default)."""
    from ..specs import attack_specs

    spec = attack_specs(cfg.modality)[cfg.attack]
    return int(spec.value_of(str(spec.shards), cfg.model_dump()))


def check(cfg: AttackConfig, world: int) -> int:
    """ConfigError unless ``cfg`` can run over ``world`` processes; returns G."""
    from ..specs import attack_specs

    spec = attack_specs(cfg.modality).get(cfg.attack)
    if spec is None or spec.shards is None:
        spread = " and ".join(f"{s.name}'s --{s.shards.replace('_', '-')}" for s in attack_specs().values() if s.shards)
        raise ConfigError(f"--nproc > 1 spreads {spread} over processes; attack {cfg.attack!r} "
                          f"({cfg.modality}) runs in one process (use --nproc 1)")
    if cfg.checkpoint_every != AttackConfig.model_fields["checkpoint_every"].default:
        raise ConfigError("--checkpoint-every does not apply to a run over several processes (it saves no "
                          "resumable state)")
    seeds, flag = resolved_seeds(cfg), f"--{spec.shards.replace('_', '-')}"
    if world > seeds:
        raise ConfigError(f"--nproc {world} is more processes than {spec.shards} ({seeds}); every process needs "
                          f"at least one (use --nproc <= {flag})")
    return seeds


def _backend(device: torch.device, local_world: int) -> str:
    """NCCL when every process on this machine has its own GPU; else gloo (on the CPU, or with
    several processes sharing a GPU, where NCCL refuses: tensors then go through the CPU)."""
    return "nccl" if device.type == "cuda" and local_world <= torch.cuda.device_count() else "gloo"


def _rank_device(cfg: AttackConfig, local_rank: int) -> torch.device:
    from ..runtime import resolve_device

    device = resolve_device(cfg.device)
    if device.type == "cuda":
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    return device


def _threads(cfg: AttackConfig, local_world: int) -> None:
    if cfg.threads is None:  # P processes share the machine's cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local_world)))


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent dies (no orphans holding a port)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- --nproc P: spawned processes
def _worker(rank: int, world: int, port: int, cfg_json: dict[str, Any], write: bool, folder: str,
            rank_run: RankRun) -> None:
    import torch.distributed as dist

    _die_with_parent()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        cfg = AttackConfig(**cfg_json)
        _threads(cfg, world)
        device = _rank_device(cfg, rank)
        backend = _backend(device, world)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=TIMEOUT)
        try:
            shard = SeedShard(resolved_seeds(cfg), world, rank, device if backend == "nccl" else None)
            result = rank_run(cfg, shard, write)
            if rank == 0:
                _save_result(result, Path(folder))
        finally:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
    except BaseException as exc:
        with contextlib.suppress(Exception):  # the parent re-raises the first rank's user error
            record = {"type": type(exc).__name__, "message": str(exc), "user": isinstance(exc, GradleakError)}
            (Path(folder) / f"error-{rank}.json").write_text(json.dumps(record))
        raise


# Rank 0 hands its RunResult to the parent as safetensors + JSON (never pickle): tensors in
# result.safetensors, everything else in result.json (JSON-ready as in metrics.json).
def _save_result(result: Any, folder: Path) -> None:
    from safetensors.torch import save_file

    rec = result.reconstruction
    tensors = {"images": rec.images.contiguous(), "labels": rec.labels.contiguous()}
    if rec.candidates is not None:
        tensors["candidates"] = rec.candidates.contiguous()
    save_file(tensors, str(folder / "result.safetensors"))
    info = {"run_dir": None if result.run_dir is None else str(result.run_dir), "metrics": result.metrics,
            "history": result.history, "rank": result.rank,
            "reconstruction": {"history": rec.history, "iterations": rec.iterations,
                               "wall_seconds": rec.wall_seconds, "label_method": rec.label_method,
                               "extra": rec.extra}}
    tmp = folder / "result.json.partial"
    tmp.write_text(json.dumps(jsonable(info)))
    os.replace(tmp, folder / "result.json")  # last: its presence means the result is complete


def _load_result(folder: Path) -> Any:
    from safetensors.torch import load_file

    from ..attacks.reconstruction import Reconstruction

    info = json.loads((folder / "result.json").read_text())
    tensors = load_file(str(folder / "result.safetensors"))
    r = info["reconstruction"]
    rec = Reconstruction(images=tensors["images"], labels=tensors["labels"], candidates=tensors.get("candidates"),
                         history=r["history"], iterations=r["iterations"], wall_seconds=r["wall_seconds"],
                         label_method=r["label_method"], extra=r["extra"])
    run_dir = None if info["run_dir"] is None else Path(info["run_dir"])
    return RunResult(run_dir=run_dir, metrics=info["metrics"], reconstruction=rec, history=info["history"],
                     rank=info["rank"])


def _user_error(record: dict[str, Any]) -> GradleakError:
    """The GradleakError subclass a rank raised, rebuilt from its JSON record."""
    from .. import errors

    cls = getattr(errors, str(record.get("type")), None)
    if not (isinstance(cls, type) and issubclass(cls, GradleakError)):
        cls = GradleakError
    return cls(str(record.get("message", "")))


def spawn(cfg: AttackConfig, rank_run: RankRun, *, write: bool) -> RunResult:
    """Run ``cfg`` over cfg.nproc processes on this machine; rank 0's RunResult."""
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    world = cfg.nproc
    with tempfile.TemporaryDirectory(prefix="gradleak-nproc-") as folder:
        # spawn's children start as `python -c`: without PYTHONSAFEPATH they would import modules
        # from the working folder first (a planted torch.py, pickle.py ...)
        with safe_path_children():
            ctx = mp.start_processes(_worker, args=(world, _free_port(), cfg.model_dump(mode="json"), write, folder,
                                                    rank_run), nprocs=world, join=False, daemon=True,
                                     start_method="spawn")
        try:
            while not ctx.join():
                pass
        except ProcessException as exc:
            errors = sorted(Path(folder).glob("error-*.json"), key=lambda p: int(p.stem.split("-")[1]))
            for path in errors:
                try:
                    record = json.loads(path.read_text())
                except (OSError, ValueError):  # a half-written record: the generic message below
                    continue
                if isinstance(record, dict) and record.get("user"):  # a user error: one line, as in one process
                    raise _user_error(record) from None
            raise GradleakError(f"a process of the --nproc {world} run failed: {exc}") from None
        finally:  # whatever happened (an error, Ctrl-C, a test timeout): no process outlives the run
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            for p in ctx.processes:
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join()
        return _load_result(Path(folder))


# ---------------------------------------------------------------- torchrun: env://
def from_env(cfg: AttackConfig, rank_run: RankRun, *, write: bool) -> RunResult:
    """This process's part of a torchrun-launched run (rank 0 returns the full RunResult)."""
    import torch.distributed as dist

    world, rank = env_world(), int(os.environ["RANK"])
    if cfg.nproc not in (1, world):
        raise ConfigError(f"--nproc {cfg.nproc} differs from torchrun's WORLD_SIZE {world} (leave --nproc out "
                          f"under torchrun)")
    seeds = check(cfg, world)
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", rank)), int(os.environ.get("LOCAL_WORLD_SIZE", world))
    _threads(cfg, local_world)
    device = _rank_device(cfg, local_rank)
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group(_backend(device, local_world), init_method="env://", timeout=TIMEOUT)
    nccl = dist.get_backend() == "nccl"
    try:
        # Rank 0 alone checks the run folder (the nodes may not share a disk) and decides its name.
        verdict: list[Any] = [None, cfg.out]
        if dist.get_rank() == 0 and write:
            out = Path(cfg.out) if cfg.out else default_run_dir(cfg.attack)
            try:
                check_output_dir(out)
            except ConfigError as exc:
                verdict[0] = str(exc)
            verdict[1] = str(out)
        dist.broadcast_object_list(verdict, src=0, device=device if nccl else None)
        if verdict[0] is not None:
            raise ConfigError(verdict[0])
        cfg = cfg.model_copy(update={"out": verdict[1]})
        shard = SeedShard(seeds, dist.get_world_size(), dist.get_rank(), device if nccl else None)
        return rank_run(cfg, shard, write)
    finally:
        if owned:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def run_distributed(cfg: AttackConfig, rank_run: RankRun, *, write: bool, resume: Any = None) -> RunResult:
    """Entry from ``pipeline.run`` when ``wanted(cfg)``; ``rank_run`` is what each process runs."""
    if resume is not None:
        raise ConfigError("--resume continues one-process runs only; a run over several processes (--nproc > 1) "
                          "saves no resumable state")
    if env_world() > 1:
        return from_env(cfg, rank_run, write=write)
    check(cfg, cfg.nproc)
    if write:
        out = Path(cfg.out) if cfg.out else default_run_dir(cfg.attack)
        check_output_dir(out)
        cfg = cfg.model_copy(update={"out": str(out)})
    return spawn(cfg, rank_run, write=write)


__all__ = ["SeedShard", "check", "env_world", "run_distributed", "spawn", "wanted"]
