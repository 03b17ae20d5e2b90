"""The one pipeline: case -> attack -> evaluate -> write. Every entry point runs an attack through
:func:`run` (the CLI's attack command, ``--resume``, sweeps and experiments through the sweep
worker, the multi-process path once per process); nothing else assembles a run.

    case   = build_case(cfg)                  # modality plug-in: update, model, truth kept apart
    attack = case.attack_config(cfg)          # typed, every field resolved before the run starts
    engine = Engine(session, observer, shard) # run services, passed to the attack
    recon  = engine.run(attack, case.update, case.model)
    metrics = case.metrics(cfg, recon)        # what leaked (truth stays with the case)
    write_run(out, recorded config, case, recon, metrics, history)
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from ..engine import Engine, SeedShard, Session, StateFileError
from ..engine.checkpoints import load_state, state_dir_for
from ..attacks.verdict import verdict
from ..defenses.floor import noise_floor
from ..config import AttackConfig
from ..errors import ConfigError
from ..modalities import modality_named
from ..outcome import evidence_from_metrics, judge, needs_control
from ..paths import StagedDir, check_apart, check_output_dir, name_max, one_line, run_inputs
from ..runtime import resolve_device, threads_for_run, torch_threads
from .case import Case, build_case
from ..specs import attack_specs, member_flags
from .record import RunResult, default_run_dir, write_run


def run_name(cfg: AttackConfig) -> str:
    """The default run folder's name: the modality's prefix and the attack."""
    return modality_named(cfg.modality).run_prefix + cfg.attack


def run(cfg: AttackConfig, *, write: bool = True, resume: Path | str | None = None,
        shard: SeedShard | None = None) -> RunResult:
    """Run one attack as configured; write the run folder (atomically) unless ``write`` is False.

    While it runs, its resumable state goes to ``.<out>.state/`` next to the run folder every
    ``cfg.checkpoint_every`` iterations and on SIGINT/SIGTERM (then :class:`Interrupted` is
    raised); ``resume`` is such a state folder to continue from (``cfg`` must be the config saved
    in it). The state folder is removed once the run folder is written. A run whose attack
    diverged beyond its retries is written too, with ``metrics["status"] == "diverged"``.

    GradInversion over several processes (``cfg.nproc`` > 1, or launched by torchrun): see
    distributed.py, which calls :func:`run_shard` in every process; rank 0 writes the run folder
    and returns the result, the others return a RunResult without metrics.

    Threads: without ``cfg.threads``, the CLI's policy (runtime.threads_for_run): on a CPU whose
    cores other work keeps busy, only the idle ones (logged on the "gradleak" logger, recorded in
    config.json, the caller's torch threads restored after)."""
    from .distributed import run_distributed, wanted

    if shard is not None:  # this process's part, in a process group the caller made
        return _run(cfg, write=write and shard.rank == 0, resume=resume, shard=shard)
    if wanted(cfg):
        return run_distributed(cfg, run_shard, write=write, resume=resume)
    threads, note = threads_for_run(cfg.threads, cfg.device, cfg.nproc)
    if threads == cfg.threads:
        return _run(cfg, write=write, resume=resume, shard=None)
    logging.getLogger("gradleak").info("%s", note)
    with torch_threads(threads):
        return _run(cfg.model_copy(update={"threads": threads}), write=write, resume=resume, shard=None)


def run_shard(cfg: AttackConfig, shard: SeedShard, write: bool) -> RunResult:
    """This process's part of a run spread over processes (distributed.py)."""
    return _run(cfg, write=write and shard.rank == 0, resume=None, shard=shard)


def _run(cfg: AttackConfig, *, write: bool, resume: Path | str | None, shard: SeedShard | None) -> RunResult:
    spread = shard is not None and shard.distributed
    if spread and resume is not None:
        raise ConfigError("--resume continues one-process runs only (not --nproc > 1)")
    device = shard.device if spread and shard.device is not None else resolve_device(cfg.device)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if resume is not None and not write:
        raise ConfigError("resuming a run needs its run folder to be written")
    out = Path(cfg.out) if cfg.out else default_run_dir(run_name(cfg))
    state_dir = Path(resume) if resume is not None else state_dir_for(out)
    if write:
        check_output_dir(out)
        check_apart([("--out", out)], run_inputs(cfg))   # a run folder never lands among the data it reads
        if not spread:  # runs over several processes save no resumable state
            check_state_name(out, state_dir)
        if resume is None and (state_dir / "state.json").exists():
            raise ConfigError(f"{out} has the saved state of an interrupted run in {state_dir}; continue it with "
                              f"`gradleak attack --resume {out}` or delete that folder")
    # The run folder's staging folder exists before the attack starts: an output path that
    # cannot be written fails now, not after the work (paths.StagedDir).
    stage = StagedDir(out) if write else None
    try:
        pending = load_state(state_dir) if resume is not None else None
        case = build_case(cfg)
        session = Session(directory=state_dir if write and not spread else None, every=cfg.checkpoint_every,
                          retries=cfg.divergence_retries, pending=pending, resume_hint=str(out),
                          # only the fields the user gave (and out): a resumed run must tell a given
                          # flag from a default, as the first one did (an --update file decides the
                          # rest; several --text sentences form the batch unless --batch-size is given).
                          # The attack always: a default can change between versions (dlg -> auto).
                          config={**cfg.model_dump(mode="json", exclude_unset=True), "attack": cfg.attack,
                                  "out": str(out)})
        with session.signals() if write and not spread else contextlib.nullcontext():
            result, attack = attack_case(cfg, case, session=session, shard=shard, device=device)
        if result.rank:
            return result
        if needs_control(evidence_from_metrics(result.metrics)):
            result.metrics = with_control(cfg, case, result.metrics, device)
        if write:
            result.run_dir = write_run(out, recorded_config(cfg, case, attack, out), case, result.reconstruction,
                                       result.metrics, result.history, attack=attack, stage=stage)
            shutil.rmtree(state_dir, ignore_errors=True)  # finished: the run folder has everything
        return result
    except BaseException:
        if stage is not None:
            stage.discard()
        raise


def check_state_name(out: Path, state_dir: Path) -> None:
    """A run keeps its resumable state in ``.<name>.state`` beside its run folder: a name that
    leaves no room for it on its file system is refused before the attack (ConfigError)."""
    limit = name_max(state_dir.parent)
    if len(os.fsencode(state_dir.name)) > limit:
        room = limit - (len(os.fsencode(state_dir.name)) - len(os.fsencode(out.name)))
        raise ConfigError(f"--out {one_line(out.name, 60)!r}: a run folder's name may be at most {room} bytes "
                          f"here (its resumable state goes to .NAME.state beside it, and names are at most "
                          f"{limit} bytes on this file system); give a shorter name")


def attack_case(cfg: AttackConfig, case: Case, *, session: Session | None = None, shard: SeedShard | None = None,
                device: torch.device | None = None) -> tuple[RunResult, Any]:
    """Attack ``case`` as ``cfg`` says and score it (no files): the typed attack config resolved
    on this case, an engine with ``session`` (default: in memory), the case's observer and
    ``shard``, then the metrics. Returns the result and the attack config that ran. Also what
    the Flower audit calls on each client update it receives."""
    device = device if device is not None else resolve_device(cfg.device)
    spread = shard is not None and shard.distributed
    attack = case.attack_config(cfg)  # typed and resolved before anything runs
    observer = case.observer() if not (spread and shard.rank != 0) else None  # rank 0 observes
    session = session if session is not None else Session(every=0, retries=cfg.divergence_retries)
    engine = Engine(device=device, session=session, observer=observer, shard=shard, log_every=cfg.log_every,
                    progress=cfg.progress)
    if observer is not None:
        engine.provide("observer", observer.get_state, observer.set_state)
    recon = engine.run(attack, case.update, case.model)
    if spread and shard.rank != 0:
        return RunResult(run_dir=None, metrics={}, reconstruction=recon, rank=shard.rank), attack
    if session.pending is not None:
        raise StateFileError(f"the attack never reached the saved state's phase {session.pending.phase!r}")
    metrics = run_metrics(cfg, case, attack, recon, session, device)
    history = observed_history(case, recon, observer)
    return RunResult(run_dir=None, metrics=metrics, reconstruction=recon, history=history), attack


def recorded_config(cfg: AttackConfig, case: Case, attack: Any, out: Path) -> AttackConfig:
    """config.json's run part: the flat config with what the case stands for (an update file's
    values, the model a default resolved to). Its attack part is ``attack``, the typed config
    that ran, every constant resolved (record.write_run, config.record_json)."""
    return cfg.model_copy(update={"out": str(out), **case.recorded_config(cfg)})


def run_metrics(cfg: AttackConfig, case: Case, attack: Any, recon: Any, session: Session,
                device: torch.device) -> dict[str, Any]:
    metrics = case.metrics(cfg, recon, device)
    add_prior_baseline(case, metrics)
    # as resolved (aggregates default to GradInversion; "auto" names the attack it used)
    family = str(recon.extra.get("attack_used") or attack.attack)
    metrics["attack"] = family
    # the attack's own numbers (scalars, and lists of numbers such as each seed's distance)
    for k, v in recon.extra.items():
        if isinstance(v, (int, float, str, bool, type(None))) or (
                isinstance(v, list) and all(isinstance(x, (int, float)) for x in v)):
            metrics.setdefault(k, v)
    # the structured evidence of the closed-form attacks and the chooser (JSON-able dicts)
    for k in ("auto", "rank_analysis"):
        if k in recon.extra:
            metrics[k] = recon.extra[k]
    # what ran: the typed attack config, every constant included
    metrics["settings"] = {**recon.extra.get("settings", {}), **attack.model_dump()}
    # the verdict, from the attacker's side only (attacks/verdict.py)
    conv = verdict(case.spec.verdict_family or family, recon.extra, noise_floor(case.update, case.matched(recon))).to_dict()
    clients = case.update.meta.threat.get("clients", 1) if isinstance(case.update.meta.threat, dict) else 1
    if not conv["converged"] and family in ("dlg", "idlg") and int(clients or 1) > 1:
        conv["reason"] += (f"; {family} attacks the average of {clients} clients as one batch of all their images "
                           f"(it rebuilds them when it converges, not which client sent which; auto runs "
                           f"GradInversion and Inverting Gradients on aggregates too)")
    if session.diverged is not None:
        conv.update(converged=False, reason="the attack diverged (NaN/Inf) beyond its retries")
    metrics["converged"], metrics["convergence"] = conv["converged"], conv
    metrics["status"] = "diverged" if session.diverged is not None else "finished"
    metrics["recoveries"] = session.recoveries
    if session.diverged is not None:
        metrics["divergence"] = session.diverged
    if session.resumed_at:
        metrics["resumed_at"] = session.resumed_at
    epsilon = dp_epsilon_of(case.update.meta.defenses)
    if epsilon is not None:
        metrics["dp_epsilon"], metrics["dp_delta"] = epsilon
    add_references(case, recon, metrics, device)
    if getattr(recon, "alternatives", None) and case.truth is not None:
        score_portfolio(cfg, case, recon, metrics, device)
    # the verdict on the client (outcome.py): the same rules for every surface
    metrics.update(judge(evidence_from_metrics(metrics)).to_dict())
    return metrics


def score_portfolio(cfg: AttackConfig, case: Case, recon: Any, metrics: dict[str, Any], device: torch.device) -> None:
    """With ground truth, the answers of the other attacks ``auto`` ran are scored as well, each
    judged on its own (recorded in ``metrics["auto"]["tried"]``): the run's verdict is the worst
    case over all of them (outcome.py: a leak by any is a leak of the client), while the answer
    kept and shown stays the attacker's choice, the one that explains the update best."""
    entries = {t.get("attack"): t for t in metrics["auto"]["tried"]}
    for name, alt in recon.alternatives:
        m = case.metrics(cfg, alt, device)
        floor = noise_floor(case.update, case.matched(alt))   # on the tensors its distance was measured on
        conv = verdict(case.spec.verdict_family or name, alt.extra, floor).to_dict()
        m.update(attack=name, relative_gradient_distance=alt.extra.get("relative_gradient_distance"),
                 converged=conv["converged"], convergence=conv)
        add_references(case, alt, m, device)
        judged = judge(evidence_from_metrics(m))
        entries[name].update(**{k: m.get(k) for k in case.spec.portfolio_keys}, verdict=judged.verdict,
                             verdict_reason=judged.reason)
    own = judge(evidence_from_metrics({k: v for k, v in metrics.items() if k != "auto"}))   # the kept answer alone
    entries[metrics["attack"]].update(**{k: metrics.get(k) for k in case.spec.portfolio_keys}, verdict=own.verdict,
                                      verdict_reason=own.reason)


def add_prior_baseline(case: Case, metrics: dict[str, Any]) -> None:
    """The second leak-free yardstick beside the zero image (metrics.prior_psnr: the public photos'
    mean image scored against each true image), where the case scored images against a truth:
    ``prior_psnr`` on each row, ``prior_psnr_mean`` and ``above_prior_image`` (images whose
    PSNR, paired by pixels, is above their own prior image's)."""
    from ..metrics import prior_psnr

    images = getattr(getattr(case, "truth", None), "images", None)
    rows = metrics.get("per_image")
    if not rows or not isinstance(images, torch.Tensor):
        return
    scores = prior_psnr(images)
    if scores is None:
        return
    for row in rows:
        row["prior_psnr"] = float(scores[row["index"]])
    metrics["prior_psnr_mean"] = float(scores.mean())
    metrics["above_prior_image"] = sum(1 for row in rows if row["psnr"] > row["prior_psnr"])


def add_references(case: Case, recon: Any, metrics: dict[str, Any], device: torch.device) -> None:
    """A converged answer's yardsticks without truth (``reference_distances``: the attacks' starts
    and public decoy batches with its restored labels, pipeline/decoys.py), where the modality
    measures them: "presumed leaked" needs the answer far below them (outcome.PRESUME_RATIO)."""
    measure = getattr(case, "reference_distances", None)
    if metrics.get("converged") is not True or measure is None:
        return
    refs = measure(recon, device)
    if refs is not None:
        metrics["reference_distances"] = refs


def dp_epsilon_of(defenses: Any) -> tuple[float, float] | None:
    """(epsilon, delta): the DP guarantee of this one update under DP-SGD (Opacus' RDP accountant,
    defenses/dpsgd.py), or None without DP-SGD (or with noise 0: no guarantee)."""
    import math

    from ..defenses import DPSGD, parse_defenses

    for d in parse_defenses(list(defenses or [])):
        if isinstance(d, DPSGD):
            eps = d.epsilon
            return (eps, d.delta) if math.isfinite(eps) else None
    return None


def with_control(cfg: AttackConfig, case: Case, metrics: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """``metrics`` judged with a positive control: the same attack, model, data and seed on the
    update without the defenses (outcome.py: "defended" needs the undefended update to leak): a
    simulated client is simulated again without ``--defense``; an update file's is its truth shared
    without defenses (Case.undefended). Run only when everything else says "defended"; recorded
    under ``control``."""
    # the same attack as the one judged (auto: the member it used), not auto again, which could
    # leak through another attack and prove nothing about this one
    attack = str(metrics.get("attack") or cfg.attack)
    reads = attack_specs().get(attack)   # a member named for a chooser (auto's) is no flag of that attack
    cleared = dict.fromkeys(f for f in member_flags() if reads is None or f not in reads.flags)
    ccfg = cfg.model_copy(update={"defense": [], "out": None, "progress": False, "attack": attack, **cleared})
    try:
        cres, _ = attack_case(ccfg, build_case(ccfg) if cfg.update is None else case.undefended(), device=device)
    except Exception as exc:   # noqa: BLE001 - no control (any error): the verdict stays inconclusive, the run ends
        metrics["control"] = {"verdict": "failed", "attack": attack,
                              "verdict_reason": one_line(f"{type(exc).__name__}: {exc}")}
        metrics.update(judge(evidence_from_metrics(metrics, control="failed")).to_dict())
        return metrics
    c = cres.metrics
    metrics["control"] = {"verdict": c["verdict"], "verdict_reason": c["verdict_reason"], "psnr_mean": c.get("psnr_mean"),
                          "converged": c.get("converged"), "attack": attack, "wall_seconds": c.get("wall_seconds")}
    metrics.update(judge(evidence_from_metrics(metrics, control=c["verdict"])).to_dict())
    return metrics


def observed_history(case: Case, recon: Any, observer: Any) -> list[dict[str, Any]]:
    history = [dict(h) for h in recon.history]
    if observer is not None:
        key = case.observed_key
        for h in history:
            if int(h["iteration"]) in observer.points:
                h[key] = observer.points[int(h["iteration"])]
    return history


__all__ = ["add_prior_baseline", "add_references", "attack_case", "check_state_name", "observed_history", "recorded_config", "run", "run_metrics", "run_name",
           "run_shard", "score_portfolio"]
