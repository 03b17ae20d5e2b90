"""One attack run, end to end: client (or update file) -> defenses -> attack -> evaluation -> run folder.

The CLI, the experiments and the sweeps all go through :func:`run` (or its parts), so a run is
the same whichever way it was started.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import platform
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import __version__
from .attacks import AttackSettings, Reconstruction, attack_names, run_attack
from .attacks.shard import SeedShard
from .attacks.state import Session, StateFileError, StateHooks, load_state, state_dir_for
from .config import AttackConfig
from .data import SOURCE_NAMES, Batch, open_source, sample_batch
from .errors import ConfigError, GradleakError, UnknownNameError
from .fl import SharedUpdate, load_truth, load_update
from .fl.threats import ThreatModel, client_share, share
from .metrics import evaluate, match, psnr
from .paths import StagedDir, check_output_dir
from .runtime import allocator, resolve_device
from .models import ModelSpec, build_model, default_image_size


@dataclass
class Case:
    """What one attack is run on: the shared update and the model (the attacker's inputs), and,
    kept apart, the ground truth (None when unknown)."""

    update: SharedUpdate
    model: ModelSpec
    truth: Batch | None
    data: str = ""


@dataclass
class RunResult:
    run_dir: Path | None
    metrics: dict[str, Any]
    reconstruction: Reconstruction
    history: list[dict[str, Any]] = field(default_factory=list)
    rank: int = 0  # seeds over processes (--nproc, torchrun): only rank 0's result has metrics


def check_attack_name(name: str) -> None:
    if name not in attack_names():
        raise UnknownNameError(f"unknown attack {name!r}; known: {', '.join(attack_names())}")


def threat_model(cfg: AttackConfig) -> ThreatModel:
    return ThreatModel(name=cfg.threat, local_steps=cfg.local_steps, local_batch_size=cfg.local_batch_size,
                       local_lr=cfg.local_lr, clients=cfg.clients if cfg.threat == "aggregate" else 1,
                       inner=cfg.inner)


def simulate_client(cfg: AttackConfig) -> Case:
    """Draw the client's batch, build the global model and compute what the server receives.
    Under ``aggregate`` the batch drawn holds all N clients' samples (N x --batch-size)."""
    threat = threat_model(cfg)
    source = open_source(cfg.data, root=cfg.data_root, split=cfg.split)
    size = cfg.image_size or default_image_size(cfg.model)
    channels = source.native_channels
    total = cfg.batch_size * threat.clients
    batch = sample_batch(source, total, cfg.seed, image_size=size, channels=channels,
                         allow_repeats=cfg.allow_repeats)
    model = build_model(cfg.model, num_classes=cfg.num_classes or source.num_classes, channels=channels,
                        image_size=size, seed=cfg.model_seed, width=cfg.width)
    if cfg.checkpoint:
        from .training import apply_checkpoint  # the global model is a trained checkpoint

        apply_checkpoint(model, cfg.checkpoint)
    share_bn = cfg.share_bn_statistics or attacker_bn_mode(cfg) == "exact"
    update = client_update(cfg, model, batch, share_bn_statistics=share_bn)
    return Case(update=update, model=model, truth=batch, data=source.name)


def attacker_bn_mode(cfg: AttackConfig) -> str | None:
    """The BN prior the attack will use (--bn, else its preset's): "exact" means the simulated
    client is one that shares its BatchNorm batch statistics (GradInversion Sec. 3.3)."""
    if cfg.bn is not None or cfg.attack != "gradinversion":
        return cfg.bn
    from .attacks import GradInversionSettings

    return GradInversionSettings.preset(cfg.preset or "cpu").bn


def client_update(cfg: AttackConfig, model: ModelSpec, batch: Batch, *, share_bn_statistics: bool) -> SharedUpdate:
    """What the server receives for ``batch`` under the configured threat model, each client's
    update defended as configured before any aggregation. The clients' private shuffling seed is
    derived from --seed and never recorded."""
    threat = threat_model(cfg)
    private_seed = cfg.seed * 100_003 + 17
    defenses = []
    if cfg.defense:
        from .defenses import parse_defenses, split_defenses  # defenses sit between client and attacker

        defenses = parse_defenses(cfg.defense)
        client_side, _ = split_defenses(defenses)
        if client_side is not None and threat.client_threat != "fedsgd":
            raise ConfigError("dpsgd is applied to FedSGD gradients; use it with --threat fedsgd (or --inner fedsgd)")
    gen = torch.Generator().manual_seed(cfg.seed)

    def one_client(b: Batch, seed: int) -> SharedUpdate:
        if defenses and threat.client_threat == "fedsgd":
            from .defenses import client_update as defended_fedsgd

            up = defended_fedsgd(model, b, defenses, gen, share_bn_statistics=share_bn_statistics)
        else:
            up = client_share(model, b, threat, private_seed=seed, share_bn_statistics=share_bn_statistics)
            if defenses:
                from .defenses import apply_defenses

                up = apply_defenses(up, defenses, gen)
        if threat.name != "aggregate":
            up.meta.threat = threat.record(b.size)
        return up

    return share(model, batch, threat, private_seed=private_seed, client_fn=one_client)


# Config fields that describe the client. With --update the file decides them: given values must
# agree with the file, and fields the file does not record (the client's private choices) may not
# be given at all; config.json then records the file's values (issue 16: no flag ignored).
UPDATE_DECIDES = ("model", "width", "batch_size", "image_size", "num_classes", "threat", "local_steps",
                  "local_batch_size", "local_lr", "clients", "inner")
CLIENT_ONLY = ("model_seed", "allow_repeats", "checkpoint", "share_bn_statistics")


def update_file_values(cfg: AttackConfig, meta: Any) -> dict[str, Any]:
    """The client-describing config values an update file stands for (its public metadata).
    Raises ConfigError naming the first given flag that contradicts the file or does not apply
    to an update file."""
    rec = meta.threat if isinstance(meta.threat, dict) else {}
    name = str(rec.get("name", "fedsgd"))
    clients = int(rec.get("clients", 1)) if name == "aggregate" else 1
    inner = str(rec.get("inner", "fedsgd")) if name == "aggregate" else "fedsgd"
    per_client = meta.batch_size // clients
    fedavg = (inner if name == "aggregate" else name) == "fedavg"
    defaults = {k: f.get_default(call_default_factory=True) for k, f in AttackConfig.model_fields.items()}
    values: dict[str, Any] = {
        "model": meta.model, "width": meta.model_kwargs.get("width"), "batch_size": per_client,
        "image_size": meta.input_shape[1], "num_classes": meta.num_classes,
        "threat": name, "clients": clients, "inner": inner,
        "local_steps": int(rec.get("local_steps", 1)) if fedavg else defaults["local_steps"],
        "local_batch_size": rec.get("local_batch_size") if fedavg else defaults["local_batch_size"],
        "local_lr": float(rec.get("local_lr", defaults["local_lr"])) if fedavg else defaults["local_lr"],
    }

    def agrees(key: str, given: Any) -> bool:
        if given == values[key]:
            return True
        if key == "local_batch_size" and fedavg:  # None means the whole client batch
            return (given or per_client) == (values[key] or per_client)
        # "use the file's / the data's" defaults agree with any recorded value
        return given is None and key in ("width", "image_size", "num_classes")

    for key in UPDATE_DECIDES:
        given = getattr(cfg, key)
        if key in cfg.model_fields_set and not agrees(key, given):
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{flag} {given} does not match the update file, which records {values[key]!r}; "
                              f"with --update the file decides {flag} (leave it out)")
    for key in CLIENT_ONLY:
        if key in cfg.model_fields_set and getattr(cfg, key) != defaults[key]:
            raise ConfigError(f"--{key.replace('_', '-')} describes the client and does not apply to an update file")
    return values


def load_case(cfg: AttackConfig) -> Case:
    """An update file (and optional truth file) as the attacker receives it."""
    assert cfg.update is not None
    # A module:callable model only when the user chose it (--model), never because a file names it.
    update, model = load_update(cfg.update, user_model=cfg.model if ":" in cfg.model else None)
    update_file_values(cfg, update.meta)
    truth = load_truth(cfg.truth, update.meta) if cfg.truth else None
    if cfg.defense:
        from .defenses import apply_defenses, parse_defenses

        update = apply_defenses(update, parse_defenses(cfg.defense), torch.Generator().manual_seed(cfg.seed))
    return Case(update=update, model=model, truth=truth, data=truth.source if truth is not None else "")


def prepare(cfg: AttackConfig) -> Case:
    check_attack_name(cfg.attack)
    if cfg.truth and not cfg.update:
        raise ConfigError("--truth needs --update (a truth file belongs to an update file)")
    return load_case(cfg) if cfg.update else simulate_client(cfg)


# Attack-specific options: passing one to an attack that ignores it is an error, not a no-op.
ATTACK_OPTIONS_ALL = ("preset", "seeds", "group", "bn", "labels", "restarts")
ATTACK_OPTIONS: dict[str, tuple[str, ...]] = {
    "dlg": (), "idlg": (),
    "gradinversion": ("preset", "seeds", "group", "bn", "labels"),
    "ig": ("restarts", "labels"),
}


def attack_settings(cfg: AttackConfig, device: torch.device) -> AttackSettings:
    fields = dict(iterations=cfg.iterations, lr=cfg.lr, optimizer=cfg.optimizer, init=cfg.init, dtype=cfg.dtype,
                  seed=cfg.seed, device=str(device), log_every=cfg.log_every, progress=cfg.progress)
    extra = {k: getattr(cfg, k) for k in ATTACK_OPTIONS_ALL}
    known = set(AttackSettings.__dataclass_fields__)
    allowed = ATTACK_OPTIONS.get(cfg.attack, ATTACK_OPTIONS_ALL)
    for k, v in extra.items():
        if v is None:
            continue
        if k not in allowed:
            raise ConfigError(f"option --{k} does not apply to attack {cfg.attack!r}")
        # Inverting Gradients' restarts travel in AttackSettings.seeds (one batched computation,
        # like GradInversion's seeds).
        fields["seeds" if k == "restarts" else k] = v
    assert set(fields) <= known
    return AttackSettings(**fields)


class PSNRObserver:
    """Watches the attack's current images against the truth it holds (the attack never sees it)."""

    def __init__(self, truth: Batch):
        self.truth = truth.images
        self.points: dict[int, float] = {}

    def __call__(self, iteration: int, images: torch.Tensor) -> None:
        if images.ndim == 5:  # [G, K, ...] candidates: observe the first seed
            images = images[0]
        imgs = torch.nan_to_num(images.float().cpu()).clamp(0, 1)
        perm = match(imgs, self.truth)
        self.points[iteration] = float(psnr(imgs[perm], self.truth).mean())

    def get_state(self) -> dict[str, Any]:  # resumable runs: the points observed so far
        return {"points": dict(self.points)}

    def set_state(self, state: dict[str, Any]) -> None:
        points = state.get("points")
        if not isinstance(points, dict) or not all(isinstance(k, int) and isinstance(v, float) for k, v in points.items()):
            raise StateFileError("the saved PSNR observations are malformed")
        self.points = dict(points)


def versions(device: torch.device) -> dict[str, str]:
    import numpy

    info = {"gradleak": __version__, "torch": torch.__version__, "numpy": numpy.__version__,
            "python": platform.python_version(), "platform": platform.platform(), "device": str(device),
            "allocator": allocator()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def default_run_dir(attack: str) -> Path:
    base = Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{attack}"
    path, n = base, 1
    while path.exists() or state_dir_for(path).exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def check_out_dir(out: Path) -> None:
    check_output_dir(out)


def run(cfg: AttackConfig, *, write: bool = True, console: Any = None, resume: Path | str | None = None,
        shard: SeedShard | None = None) -> RunResult:
    """Run one attack as configured; write the run folder (atomically) unless ``write`` is False.

    While it runs, its resumable state goes to ``.<out>.state/`` next to the run folder every
    ``cfg.checkpoint_every`` iterations and on SIGINT/SIGTERM (then :class:`Interrupted` is
    raised); ``resume`` is such a state folder to continue from (``cfg`` must be the config saved
    in it). The state folder is removed once the run folder is written. A run whose attack
    diverged beyond its retries is written too, with ``metrics["status"] == "diverged"``.

    GradInversion over several processes (``cfg.nproc`` > 1, or launched by torchrun): see
    distributed.py, which calls this in every process with its ``shard``; rank 0 writes the run
    folder and returns the result, the others return a RunResult without metrics."""
    spread = shard is not None and shard.distributed
    if shard is None:
        from .distributed import run_distributed, wanted

        if wanted(cfg):
            return run_distributed(cfg, write=write, resume=resume)
    elif spread:
        if resume is not None:
            raise ConfigError("--resume continues one-process runs only (not --nproc > 1)")
        write = write and shard.rank == 0
    device = shard.device if spread and shard.device is not None else resolve_device(cfg.device)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if resume is not None and not write:
        raise ConfigError("resuming a run needs its run folder to be written")
    out = Path(cfg.out) if cfg.out else default_run_dir(cfg.attack)
    state_dir = Path(resume) if resume is not None else state_dir_for(out)
    if write:
        check_out_dir(out)
        if resume is None and (state_dir / "state.json").exists():
            raise ConfigError(f"{out} has the saved state of an interrupted run in {state_dir}; continue it with "
                              f"`gradleak attack --resume {out}` or delete that folder")
    # The run folder's staging folder exists before the attack starts: an output path that
    # cannot be written fails now, not after the work (paths.StagedDir).
    stage = StagedDir(out) if write else None
    try:
        pending = load_state(state_dir) if resume is not None else None
        case = prepare(cfg)
        settings = attack_settings(cfg, device)
        observer = PSNRObserver(case.truth) if case.truth is not None else None
        if spread and shard.rank != 0:
            observer = None  # rank 0 observes (the answer is the same on every process)
        session = Session(directory=state_dir if write and not spread else None, every=cfg.checkpoint_every,
                          retries=cfg.divergence_retries, pending=pending, resume_hint=str(out),
                          config=cfg.model_copy(update={"out": str(out)}).model_dump(mode="json"))
        if observer is not None:
            session.provide("observer", StateHooks(observer.get_state, observer.set_state))
        with session.active(), (session.signals() if write and not spread else contextlib.nullcontext()):
            if spread:
                from .attacks.gradinversion import gradinversion

                recon = gradinversion(case.update, case.model, settings, observer, shard=shard)
            else:
                recon = run_attack(cfg.attack, case.update, case.model, settings, observer)
        if spread and shard.rank != 0:
            return RunResult(run_dir=None, metrics={}, reconstruction=recon, rank=shard.rank)
        if session.pending is not None:
            raise StateFileError(f"the attack never reached the saved state's phase {session.pending.phase!r}")
        metrics = build_metrics(cfg, case, recon, device)
        metrics["status"] = "diverged" if session.diverged is not None else "finished"
        metrics["recoveries"] = session.recoveries
        if session.diverged is not None:
            metrics["divergence"] = session.diverged
        if session.resumed_at:
            metrics["resumed_at"] = session.resumed_at
        history = [dict(h) for h in recon.history]
        if observer is not None:
            for h in history:
                if int(h["iteration"]) in observer.points:
                    h["psnr"] = observer.points[int(h["iteration"])]
        result = RunResult(run_dir=None, metrics=metrics, reconstruction=recon, history=history)
        if write:
            used = {k: v for k, v in recon.extra.get("resolved", {}).items()
                    if k in AttackConfig.model_fields and getattr(cfg, k) is None}
            # An update file's run records what the file stands for, not the flags' defaults.
            from_file = update_file_values(cfg, case.update.meta) if cfg.update else {}
            resolved = cfg.model_copy(update={"out": str(out), **from_file, **used})
            result.run_dir = write_run_dir(out, resolved, case, recon, metrics, history, stage=stage)
            shutil.rmtree(state_dir, ignore_errors=True)  # finished: the run folder has everything
        return result
    except BaseException:
        if stage is not None:
            stage.discard()
        raise


def build_metrics(cfg: AttackConfig, case: Case, recon: Reconstruction, device: torch.device) -> dict[str, Any]:
    meta = case.update.meta
    metrics: dict[str, Any] = {
        "attack": cfg.attack, "model": meta.model, "data": case.data or cfg.data, "batch_size": meta.batch_size,
        "iterations": recon.iterations, "wall_seconds": round(recon.wall_seconds, 3),
        "psnr_mean": None, "ssim_mean": None, "mse_mean": None, "label_accuracy": None, "per_image": [],
        "label_method": recon.label_method, "labels_restored": recon.labels.tolist(),
        "threat": meta.threat, "defenses": list(meta.defenses), "bn_statistics_shared": meta.bn_statistics_shared,
        "seed": cfg.seed, "update": meta.to_dict(),
    }
    metrics.update({k: v for k, v in recon.extra.items() if isinstance(v, (int, float, str, bool, type(None)))})
    # what ran: the resolved config fields and, where the attack has them, all its constants (alphas)
    metrics["settings"] = {**recon.extra.get("resolved", {}), **recon.extra.get("settings", {})}
    if case.truth is not None:
        ev = evaluate(recon, case.truth)
        metrics.update(ev.to_dict())
        if cfg.paper_metrics:
            from .metrics.summary import paper_metrics  # GradInversion Sec. 4: FFT2D, RPSNR, LPIPS, IIP

            pool = iip_pool(cfg, case)
            summary, per_image = paper_metrics(ev.paired_images, case.truth.images, pool)
            metrics.update(summary)
            for row, extra in zip(metrics["per_image"], per_image):
                row.update(extra)
        metrics["class_names"] = list(case.truth.class_names)
        names = case.truth.names
        for row in metrics["per_image"]:
            if not row.get("name") and names:
                row["name"] = names[row["index"]]
    metrics["versions"] = versions(device)
    return metrics


IIP_POOL = 256  # real images searched besides the originals (evenly spaced over the source)


def iip_pool(cfg: AttackConfig, case: Case) -> torch.Tensor | None:
    """Other real images of the run's data source, at the batch's size, for IIP: up to IIP_POOL,
    evenly spaced over the source (deterministic). None when the source cannot be opened (e.g.
    an update file whose truth came from elsewhere): IIP then searches the originals only.

    For an update/truth file, only a *named* source recorded in the truth file is opened: a
    folder path written in a file is never walked (a file could name ``/``)."""
    assert case.truth is not None
    if cfg.update is not None:
        name = case.truth.source.strip().lower()
        if name not in SOURCE_NAMES:
            return None
        where = {"root": cfg.data_root} if cfg.data.strip().lower() == name else {}
    else:
        name, where = cfg.data, {"root": cfg.data_root}
    try:
        source = open_source(name, split=cfg.split, **where)
    except GradleakError:
        return None
    _, c, h, _ = case.truth.images.shape
    n = len(source)
    idx = sorted({int(i) for i in torch.linspace(0, n - 1, steps=min(n, IIP_POOL)).round().long()})
    return torch.stack([source.load(i, h, c) for i in idx]) if idx else None


def _history_csv(history: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["iteration", "loss", "psnr"])
    for h in history:
        p = h.get("psnr")
        w.writerow([int(h["iteration"]), repr(float(h["loss"])), "" if p is None else f"{p:.4f}"])
    return buf.getvalue()


def write_run_dir(out: Path, cfg: AttackConfig, case: Case, recon: Reconstruction, metrics: dict[str, Any],
                  history: list[dict[str, Any]], *, stage: StagedDir | None = None) -> Path:
    """Write every file into a hidden staging folder (``stage``, made up front by the caller, or
    made here), then rename it into place, so a crash never leaves a run folder that looks
    finished."""
    from safetensors.torch import save_file

    from .report import render_report, save_image_grid

    stage = stage if stage is not None else StagedDir(out)
    tmp = stage.path
    try:
        (tmp / "config.json").write_text(json.dumps(cfg.model_dump(mode="json"), indent=2) + "\n")
        (tmp / "history.csv").write_text(_history_csv(history))
        tensors = {"images": recon.images.contiguous(), "labels": recon.labels.contiguous()}
        if recon.candidates is not None:
            tensors["candidates"] = recon.candidates.contiguous()
        save_file(tensors, str(tmp / "reconstruction.safetensors"))
        if case.truth is not None:
            ev = evaluate(recon, case.truth)
            caps_t = [[f"label {s.label_true}"] for s in ev.per_image]
            caps_r = [[f"{s.psnr:.1f} dB / label {s.label_restored}"] for s in ev.per_image]
            save_image_grid(tmp / "reconstruction.png", [case.truth.images, ev.paired_images],
                            ["original", "reconstruction"], [sum(caps_t, []), sum(caps_r, [])])
        else:
            save_image_grid(tmp / "reconstruction.png", [recon.images], ["reconstruction"],
                            [[f"label {int(y)}" for y in recon.labels]])
        if recon.candidates is not None:
            rows = [c for c in recon.candidates] + [recon.images]
            titles = [f"seed {g}" for g in range(len(recon.candidates))] + ["final"]
            save_image_grid(tmp / "candidates.png", rows, titles)
        (tmp / "metrics.json").write_text(json.dumps(_jsonable(metrics), indent=2) + "\n")
        render_report(tmp)
        return stage.commit()
    except BaseException:
        stage.discard()
        raise


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


__all__ = ["Case", "RunResult", "run", "prepare", "simulate_client", "load_case", "attack_settings",
           "GradleakError", "write_run_dir", "build_metrics"]
