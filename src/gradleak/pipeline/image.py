"""The image modality: a simulated client (data source -> batch -> model -> threat model ->
defenses -> shared update) or an update file, judged by PSNR/SSIM/MSE after optimal pairing,
the restored labels and, optionally, GradInversion's paper metrics (FFT2D, RPSNR, LPIPS, IIP)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from ..attacks.auto import auto_portfolio
from ..attacks.configs import resolve_attack
from ..attacks.gradinversion import layer_counts
from ..attacks.reconstruction import Reconstruction
from ..config import AttackConfig
from ..data import SOURCE_NAMES, Batch, batch_of, open_source, sample_batch
from ..errors import ConfigError, GradleakError
from ..fl import SharedUpdate, load_truth, load_update
from ..fl.files import truth_bytes, update_bytes
from ..fl.threats import client_model_of, client_share, share
from ..metrics import evaluate, match, psnr
from ..modalities import IMAGE
from ..defenses.floor import noise_floor
from ..outcome import needs_truth_start
from ..models import ModelSpec, build_model, default_image_size
from ..models.server import server_model
from .case import Case, Observer, defended_file_update, file_values, modality, threat_model
from .record import versions

# The image modality's declaration (modalities.py reads it without importing this module; see
# modalities.Modality for the keys): share, report name functions of this module.
MODALITY_SPEC = {
    "name": "image", "summary": "images: PSNR, SSIM and the images identified against the truth", "default": True,
    "share": "simulate_client", "report": "render_image_report", "attack_kind": "attack", "model_kind": "model",
    "model_extra": " or package.module:callable", "data_sources": True, "files": "reconstruction.png",
    "summary_keys": ["psnr_mean", "zero_psnr_mean", "above_zero_image", "ssim_mean", "mse_mean", "label_accuracy",
                     "fft2d_mean", "rpsnr_mean", "lpips_mean", "iip", "gradient_distance", "iterations",
                     "wall_seconds"],
    "no_value": "n/a (no ground truth)", "measures": "images", "nothing": "rebuilt nothing recognisable",
    "update_format": "gradleak.shared-update",
}


def render_image_report(folder: Path) -> Path:
    """report.html of an image run folder (the renderer imported only when a report is written)."""
    from ..report import render_report

    return render_report(folder)


def client_batch(cfg: AttackConfig) -> tuple[Batch, str, int]:
    """The client's private batch (all N clients' samples under ``aggregate``, client by client,
    labels distinct within each one): the items ``--indices`` names, else a draw by ``--seed``;
    with the source's name and class count."""
    threat = threat_model(cfg)
    threat.check_batch(cfg.batch_size * threat.clients)  # e.g. local mini-batches larger than a client's data
    source = open_source(cfg.data, root=cfg.data_root, split=cfg.split)
    size = cfg.image_size or default_image_size(cfg.model)
    channels = source.native_channels
    total = cfg.batch_size * threat.clients
    if cfg.indices:
        if len(cfg.indices) != total:
            raise ConfigError(f"--indices names {len(cfg.indices)} items but the batch holds {total} "
                              f"(--batch-size {cfg.batch_size} x {threat.clients} client(s))")
        if max(cfg.indices) >= len(source):
            raise ConfigError(f"--indices {max(cfg.indices)} is past the end of {source.name} ({len(source)} items)")
        batch = batch_of(source, list(cfg.indices), size, channels)
    else:
        batch = sample_batch(source, total, cfg.seed, image_size=size, channels=channels,
                             allow_repeats=cfg.allow_repeats, clients=threat.clients)
    return batch, source.name, source.num_classes


def simulate_client(cfg: AttackConfig) -> "ImageCase":
    """Draw the client's batch, build the global model and compute what the server receives.
    What the client shares (BN statistics included) is the config's alone, never the attack's."""
    batch, source_name, num_classes = client_batch(cfg)
    size = int(batch.images.shape[-1])
    model = build_model(cfg.model, num_classes=cfg.num_classes or num_classes, channels=int(batch.images.shape[1]),
                        image_size=size, seed=cfg.model_seed, width=cfg.width)
    if cfg.checkpoint:
        from ..training import apply_checkpoint  # the global model is a trained checkpoint

        apply_checkpoint(model, cfg.checkpoint)
    # what the server sent: the global model, or a malicious server's modification of it
    model = server_model(model, cfg.server)
    update = client_update(cfg, model, batch, share_bn_statistics=cfg.share_bn_statistics)
    return ImageCase(update=update, model=model, truth=batch, data=source_name)


def client_update(cfg: AttackConfig, model: ModelSpec, batch: Batch, *, share_bn_statistics: bool) -> SharedUpdate:
    """What the server receives for ``batch`` under the configured threat model, each client's
    update defended as configured before any aggregation. The clients' private shuffling seed is
    derived from --seed and never recorded."""
    threat = threat_model(cfg)
    private_seed = cfg.seed * 100_003 + 17
    defenses = []
    if cfg.defense:
        from ..defenses import parse_defenses, split_defenses  # defenses sit between client and attacker

        defenses = parse_defenses(cfg.defense)
        client_side, _ = split_defenses(defenses)
        if client_side is not None and threat.client_threat != "fedsgd":
            raise ConfigError("dpsgd is applied to FedSGD gradients; use it with --threat fedsgd (or --inner fedsgd)")
    gen = torch.Generator().manual_seed(cfg.seed)

    def one_client(b: Batch, seed: int) -> SharedUpdate:
        if defenses and threat.client_threat == "fedsgd":
            from ..defenses import client_update as defended_fedsgd

            up = defended_fedsgd(model, b, defenses, gen, share_bn_statistics=share_bn_statistics)
        else:
            up = client_share(model, b, threat, private_seed=seed, share_bn_statistics=share_bn_statistics)
            if defenses:
                from ..defenses import apply_defenses

                up = apply_defenses(up, defenses, gen)
        if threat.name != "aggregate":
            up.meta.threat = threat.record(b.size)
        return up

    return share(model, batch, threat, private_seed=private_seed, client_fn=one_client)


# Config fields that describe the client: with --update the file decides them (case.py).
UPDATE_DECIDES = ("model", "width", "batch_size", "image_size", "num_classes", "threat", "local_steps",
                  "local_batch_size", "local_lr", "clients", "inner", "server")
CLIENT_ONLY = ("model_seed", "allow_repeats", "checkpoint", "share_bn_statistics", "indices")


def update_file_values(cfg: AttackConfig, meta: Any) -> dict[str, Any]:
    """The image config values an update file stands for (see case.file_values)."""
    return file_values(cfg, meta, UPDATE_DECIDES, CLIENT_ONLY)


def load_case(cfg: AttackConfig) -> "ImageCase":
    """An update file (and optional truth file) as the attacker receives it."""
    assert cfg.update is not None
    # A module:callable model only when the user chose it (--model), never because a file names it.
    update, model = load_update(cfg.update, modality="image", user_model=cfg.model if ":" in cfg.model else None)
    update_file_values(cfg, update.meta)
    truth = load_truth(cfg.truth, update.meta) if cfg.truth else None
    return ImageCase(update=defended_file_update(cfg, update), model=model, truth=truth,
                     data=truth.source if truth is not None else "")


@modality("image")
def build_image_case(cfg: AttackConfig) -> "ImageCase":
    if cfg.truth and not cfg.update:
        raise ConfigError("--truth needs --update (a truth file belongs to an update file)")
    if cfg.update and not cfg.truth:  # no data is opened at all: data flags would be ignored
        for name in ("data", "data_root", "split"):
            if name in cfg.model_fields_set and getattr(cfg, name) != AttackConfig.model_fields[name].default:
                raise ConfigError(f"--{name.replace('_', '-')} does not apply to an update file without --truth")
    if cfg.indices and cfg.allow_repeats:
        raise ConfigError("--allow-repeats applies to a draw by --seed, not to --indices (which names the items)")
    case = load_case(cfg) if cfg.update else simulate_client(cfg)
    if case.truth is not None:   # the verdict's identification searches it, with or without --paper-metrics
        case.load_iip_pool(cfg)   # decoded now: a broken image is an error before the attack, not after it
    return case


class PSNRObserver(Observer):
    """PSNR (after pairing) of the attack's current images against the truth."""

    def __init__(self, truth: Batch):
        super().__init__()
        self.truth = truth.images

    def __call__(self, iteration: int, images: torch.Tensor) -> None:
        if images.ndim == 5:  # [G, K, ...] candidates: observe the first seed
            images = images[0]
        imgs = torch.nan_to_num(images.float().cpu()).clamp(0, 1)
        perm = match(imgs, self.truth)
        self.points[iteration] = float(psnr(imgs[perm], self.truth).mean())


def _has_batchnorm(model: ModelSpec) -> bool:
    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.module.modules())


def truth_distance(model: ModelSpec, update: SharedUpdate, truth: Batch, device: torch.device) -> float | None:
    """The true batch's relative gradient distance to the shared update, as the attacks measure
    their answers' (attacks/verdict.py, under the same threat model: attacks/simulate.py), in
    float64; None when the update cannot be simulated from it (e.g. a model without double)."""
    import copy

    from ..attacks.simulate import UpdateSimulator
    from ..attacks.verdict import relative_distance

    try:
        victim = copy.deepcopy(model)
        sim = UpdateSimulator(victim, update, dtype=torch.float64, device=device)
        with torch.enable_grad():
            x = victim.normalize(truth.images.double().to(sim.target[0].device))
            return relative_distance(sim(x, truth.labels.to(x.device), create_graph=False), sim.target)
    except (GradleakError, RuntimeError, ValueError):
        return None


IIP_POOL = 256  # real images searched besides the originals (evenly spaced over the source)



def image_attack_config(values: dict[str, Any], update: SharedUpdate, model: ModelSpec) -> Any:
    """The typed attack config of flat config ``values`` resolved on this update and model: the
    BN prior follows what the update carries (a model without BatchNorm has no batch statistics to
    share: "exact" is then vacuous), auto's portfolio follows the case (a batch, an aggregate, one
    image: attacks/auto.py), defaults scale to the model's depth."""
    shared = bool(update.meta.bn_statistics_shared) or not _has_batchnorm(model)
    portfolio = auto_portfolio(update) if values.get("attack") == "auto" else None
    return resolve_attack(values, bn_statistics_shared=shared, portfolio=portfolio, layers=layer_counts(model.module))


def attack_update(update: SharedUpdate, model: ModelSpec, attack: str, *, observer: Observer | None = None,
                  device: str = "cpu", log_every: int = 10, progress: bool = False, **flags: Any) -> Reconstruction:
    """Attack one shared update with the named image attack, as ``gradleak attack --update`` does
    (no files, no ground truth): ``flags`` are the attack's flat constants (``iterations=200``,
    ``seeds=2``, ...) and ``seed``, resolved on this update and model exactly as a run resolves
    them (unknown or inapplicable flags are a ConfigError), then run by an Engine with
    ``observer`` (e.g. a PSNR observer holding a truth the attack never sees). Threads: the CLI's
    policy (runtime.threads_for_run): ``threads=N``, else fewer than torch's default on a CPU whose
    cores other work keeps busy; the caller's torch threads are restored after."""
    import logging

    from ..engine import Engine
    from ..config import make_config
    from ..runtime import threads_for_run, torch_threads

    values = make_config(attack=attack, **flags).model_dump()  # the CLI's validation of every flag
    config = image_attack_config(values, update, model)
    threads, note = threads_for_run(values["threads"], device)
    if note:
        logging.getLogger("gradleak").info("%s", note)
    with torch_threads(threads):
        return Engine(device=device, observer=observer, log_every=log_every, progress=progress).run(config, update,
                                                                                                    model)

@dataclass
class ImageCase(Case):
    #: IIP's pool of other real images (:meth:`iip_pool`), once loaded (``iip_loaded``)
    iip_images: torch.Tensor | None = field(default=None, repr=False)
    iip_loaded: bool = False
    #: the decoy test's record (:meth:`decoy_record`), once measured
    decoys: dict[str, Any] | None = field(default=None, repr=False)
    #: the truth-start test's answers (:meth:`truth_start_record`) as (attack, answer), when it ran
    truth_start: list[tuple[str, Reconstruction]] = field(default_factory=list, repr=False)

    history_columns: ClassVar[tuple[str, ...]] = ("psnr",)
    spec = IMAGE

    def attack_config(self, cfg: AttackConfig) -> Any:
        return image_attack_config(cfg.model_dump(), self.update, self.model)

    def observer(self) -> PSNRObserver | None:
        return PSNRObserver(self.truth) if self.truth is not None else None

    def undefended(self) -> "ImageCase":
        """The positive control's case for an update file with its truth file: the same model
        (as the file records it) and the true batch, shared without the defenses. Only for FedSGD
        of one client, which the files determine; FedAvg's private shuffling and an aggregate's
        other clients are not in them (ConfigError, and the verdict stays inconclusive)."""
        from ..fl import fedsgd
        from ..fl.threats import ThreatModel

        meta = self.update.meta
        threat = ThreatModel.from_record(meta.threat)
        if self.truth is None:
            raise ConfigError("a positive control needs the client's true batch (--truth)")
        if threat.name != "fedsgd" or threat.clients > 1:
            raise ConfigError(f"a positive control of a {threat.name} update file needs what the files do not hold "
                              "(the client's private shuffling, the other clients' data): run the attack on a "
                              "simulated client (no --update) to get one")
        update = fedsgd(self.model, self.truth, share_bn_statistics=meta.bn_statistics_shared)
        return ImageCase(update=update, model=self.model, truth=self.truth, data=self.data,
                         iip_images=self.iip_images, iip_loaded=self.iip_loaded)

    def recorded_config(self, cfg: AttackConfig) -> dict[str, Any]:
        if cfg.update:
            return update_file_values(cfg, self.update.meta)
        # the server's modification as resolved (defaults filled), so a rerun builds the same model
        server = self.model.kwargs.get("server")
        return {"server": server} if server else {}

    def metrics(self, cfg: AttackConfig, recon: Reconstruction, device: torch.device) -> dict[str, Any]:
        meta = self.update.meta
        metrics: dict[str, Any] = {
            # an update file without a truth file does not say where its data came from
            "attack": cfg.attack, "model": meta.model, "batch_size": meta.batch_size,
            "data": self.data or ("unknown (update file)" if cfg.update else cfg.data),
            "iterations": recon.iterations, "wall_seconds": round(recon.wall_seconds, 3),
            "psnr_mean": None, "ssim_mean": None, "mse_mean": None, "label_accuracy": None, "per_image": [],
            "label_method": recon.label_method, "labels_restored": recon.labels.tolist(),
            "threat": meta.threat, "defenses": list(meta.defenses), "bn_statistics_shared": meta.bn_statistics_shared,
            "client_model": client_model_of(meta.threat, meta.batch_size),  # how completely the attacker models it
            "seed": cfg.seed, "update": meta.to_dict(),
        }
        if self.truth is not None:
            ev = evaluate(recon, self.truth)
            metrics.update(ev.to_dict())
            metrics.update(self.zero_image_scores(metrics["per_image"]))
            if not self.iip_loaded:
                self.load_iip_pool(cfg)
            self.recognisability_scores(ev.paired_images, metrics["per_image"])
            if cfg.paper_metrics:
                from ..metrics.summary import paper_metrics  # GradInversion Sec. 4: FFT2D, RPSNR, LPIPS, IIP

                summary, per_image = paper_metrics(ev.paired_images, self.truth.images, self.iip_images)
                metrics.update(summary)
                for row, extra in zip(metrics["per_image"], per_image, strict=True):
                    row.update(extra)
            # How well the true data explain the (defended) update, on the attacker's own measure:
            # an answer that fits worse than the truth is an optimisation failure (outcome.py)
            metrics["truth_relative_distance"] = truth_distance(self.model, self.update, self.truth, device)
            if meta.defenses:   # can the defended update tell the true batch from public decoys? (outcome.py)
                metrics["decoy_test"] = self.decoy_record(metrics["truth_relative_distance"], device)
                # separated, yet no leak: does the attack leave the truth? (outcome.py) Not under a defense
                # the attacker's simulation does not reproduce: leaving the truth may be that mismatch
                if needs_truth_start(metrics) and not noise_floor(self.update).unmodelled:
                    record = self.truth_start_record(cfg, recon, device)
                    if record is not None:
                        metrics["truth_start_test"] = record
            metrics["class_names"] = list(self.truth.class_names)
            names = self.truth.names
            for row in metrics["per_image"]:
                if not row.get("name") and names:
                    row["name"] = names[row["index"]]
        metrics["versions"] = versions(device)
        return metrics

    def decoy_record(self, truth_relative: float | None, device: torch.device) -> dict[str, Any] | None:
        """The decoy test of this defended update (pipeline/decoys.py), once per case: it depends
        on the update and the truth only, not on the answer (auto's members share it)."""
        from ..defenses.floor import noise_floor
        from .decoys import decoy_test

        if self.decoys is None:
            floor = noise_floor(self.update)
            self.decoys = {} if truth_relative is None else decoy_test(
                self.model, self.update, self.truth, floor.tolerance, device, scaled=bool(floor.unmodelled)) or {}
        return self.decoys or None

    def truth_start_record(self, cfg: AttackConfig, recon: Reconstruction, device: torch.device) -> dict[str, Any] | None:
        """The truth-start test (pipeline/truth_start.py) of the attack that gave ``recon`` and of
        PRIOR_ATTACK: each started from the true batch on this defended update (its own config
        and budget, one start), its answer scored image by image as any answer is. None for a
        closed form, or for an answer auto did not keep (its other members count when they leak)."""
        from ..config import make_config
        from ..outcome import TRUTH_START_TEST, truth_start_leak
        from .truth_start import TRUTH_START_SHARE, run_truth_start, truth_start_attacks, truth_start_config

        assert self.truth is not None
        if cfg.attack == "auto" and "attack_used" not in recon.extra:
            return None
        name = str(recon.extra.get("attack_used") or cfg.attack)
        own = truth_start_config(self.attack_config(cfg), name)
        if own is None:
            return None
        runs, answers = [], []
        for attack in truth_start_attacks(name, int(self.truth.images.shape[-1])):
            # the run's own attack as it ran; the prior attack at its defaults (the run's flags are another attack's)
            config = own if attack == name else truth_start_config(
                image_attack_config(make_config(attack=attack, seed=cfg.seed).model_dump(), self.update, self.model),
                attack)
            if config is None:
                continue
            start = run_truth_start(config, self.update, self.model, self.truth, device)
            answers.append((attack, start))
            runs.append(self.truth_start_run(attack, config, start))
        self.truth_start = answers
        leak = truth_start_leak({"runs": runs})
        return {"test": TRUTH_START_TEST, "attack": name, "walked_away": leak == "", "leak": leak or "",
                "budget_share": TRUTH_START_SHARE, "runs": runs}

    def truth_start_run(self, attack: str, config: Any, start: Reconstruction) -> dict[str, Any]:
        """One truth-start answer's record: PSNR, SSIM and the recognisability evidence per image."""
        from ..outcome import truth_start_leak

        assert self.truth is not None
        ev = evaluate(start, self.truth)
        scored = ev.to_dict()
        rows = scored["per_image"]
        self.zero_image_scores(rows)
        self.recognisability_scores(ev.paired_images, rows)
        keep = ("index", "name", "psnr", "ssim", "coarse_ssim", "zero_coarse_ssim", "prior_coarse_ssim", "identified",
                "identified_among", "recognisable", "recognisable_reason")
        names = self.truth.names
        per_image = [{k: r[k] for k in keep if k in r} | ({"name": names[r["index"]]} if names and not r.get("name")
                                                            else {}) for r in rows]
        leak = truth_start_leak({"per_image": per_image})
        return {"attack": attack, "walked_away": leak == "", "leak": leak or "", "psnr_mean": scored.get("psnr_mean"),
                "ssim_mean": scored.get("ssim_mean"), "per_image": per_image,
                "relative_gradient_distance": start.extra.get("relative_gradient_distance"),
                "iterations": start.iterations, "budget_iterations": int(getattr(config, "iterations", 0) or 0),
                "seconds": round(start.wall_seconds, 3)}

    def reference_distances(self, recon: Reconstruction, device: torch.device) -> dict[str, list[float]] | None:
        """Without truth, the yardsticks of a converged answer (pipeline/decoys.py): the attacks'
        starts and public decoy batches with the answer's restored labels, on this update."""
        from .decoys import reference_distances

        return reference_distances(self.model, self.update, recon.images.shape, recon.labels, device)

    def zero_image_scores(self, per_image: list[dict[str, Any]]) -> dict[str, Any]:
        """The zero image of the model's input space (a flat image of its normalisation mean),
        scored against each true image: what an answer that reads nothing of the update gets.
        A PSNR at or below it shows no leakage PSNR can see (not that nothing leaked). Adds
        ``zero_psnr`` to each row; returns ``zero_psnr_mean`` and ``above_zero_image`` (images
        whose PSNR is above their own zero image's)."""
        assert self.truth is not None
        truth = self.truth.images.detach().to("cpu", torch.float32)
        zero = self.model.denormalize(torch.zeros_like(truth[:1])).clamp(0.0, 1.0)
        scores = psnr(zero.expand_as(truth), truth)
        for row in per_image:
            row["zero_psnr"] = float(scores[row["index"]])
        return {"zero_psnr_mean": float(scores.double().mean()),
                "above_zero_image": sum(1 for row in per_image if row["psnr"] > row["zero_psnr"])}

    def recognisability_scores(self, paired: torch.Tensor, per_image: list[dict[str, Any]]) -> None:
        """Adds to each row what says whether its image is recognisable whatever the pixel noise
        (metrics/recognisable.py: coarse SSIM of the answer, the zero image and the public prior
        image; identification among the IIP pool with its public decoys) and the judgement
        (outcome.recognisable_row: ``recognisable`` and ``recognisable_reason``)."""
        from ..metrics.recognisable import recognisability
        from ..outcome import recognisable_row

        assert self.truth is not None
        truth = self.truth.images.detach().to("cpu", torch.float32)
        zero = self.model.denormalize(torch.zeros_like(truth[:1])).clamp(0.0, 1.0)
        for row, extra in zip(per_image, recognisability(paired, truth, zero, self.iip_images), strict=True):
            row.update(extra)
            why = recognisable_row(row)
            row["recognisable"], row["recognisable_reason"] = bool(why), why

    def load_iip_pool(self, cfg: AttackConfig) -> None:
        """Decode IIP's pool (:meth:`iip_pool`) into ``iip_images``: the case builder does it
        before the attack, so that a truncated or unreadable image of the source fails the run
        before its first step (no state saved, nothing to resume) instead of after the attack."""
        from ..metrics.recognisable import candidate_pool

        assert self.truth is not None
        self.iip_images, self.iip_loaded = candidate_pool(self.iip_pool(cfg), self.truth.images), True

    def iip_pool(self, cfg: AttackConfig) -> torch.Tensor | None:
        """Other real images of the run's data source, at the batch's size, for IIP: up to
        IIP_POOL, evenly spaced over the source (deterministic). None when the source cannot be
        opened (e.g. an update file whose truth came from elsewhere): IIP then searches the
        originals and the public decoys (load_iip_pool adds those in every case).

        For an update/truth file, only a *named* source recorded in the truth file is opened: a
        folder path written in a file is never walked (a file could name ``/``)."""
        assert self.truth is not None
        if cfg.update is not None:
            name = self.truth.source.strip().lower()
            if name not in SOURCE_NAMES:
                return None
            where = {"root": cfg.data_root} if cfg.data.strip().lower() == name else {}
        else:
            name, where = cfg.data, {"root": cfg.data_root}
        try:
            source = open_source(name, split=cfg.split, **where)
        except GradleakError:
            return None
        _, c, h, _ = self.truth.images.shape
        n = len(source)
        idx = sorted({int(i) for i in torch.linspace(0, n - 1, steps=min(n, IIP_POOL)).round().long()})
        return torch.stack([source.load(i, h, c) for i in idx]) if idx else None

    def write_files(self, folder: Path, recon: Reconstruction) -> None:
        from safetensors.torch import save_file

        from ..report import save_image_grid

        tensors = {"images": recon.images.contiguous(), "labels": recon.labels.contiguous()}
        if recon.candidates is not None:
            tensors["candidates"] = recon.candidates.contiguous()
        save_file(tensors, str(folder / "reconstruction.safetensors"))
        if self.truth is not None:
            ev = evaluate(recon, self.truth)
            caps_t = [[f"label {s.label_true}"] for s in ev.per_image]
            caps_r = [[f"{s.psnr:.1f} dB / label {s.label_restored}"] for s in ev.per_image]
            save_image_grid(folder / "reconstruction.png", [self.truth.images, ev.paired_images],
                            ["original", "reconstruction"], [sum(caps_t, []), sum(caps_r, [])])
        else:
            save_image_grid(folder / "reconstruction.png", [recon.images], ["reconstruction"],
                            [[f"label {int(y)}" for y in recon.labels]])
        for name, alt in getattr(recon, "alternatives", []):   # auto's other attacks: each answer too
            if self.truth is not None:
                ev = evaluate(alt, self.truth)
                save_image_grid(folder / f"reconstruction-{name}.png", [self.truth.images, ev.paired_images],
                                ["original", name], [[f"label {s.label_true}" for s in ev.per_image],
                                                     [f"{s.psnr:.1f} dB / label {s.label_restored}" for s in ev.per_image]])
            else:
                save_image_grid(folder / f"reconstruction-{name}.png", [alt.images], [name],
                                [[f"label {int(y)}" for y in alt.labels]])
        if self.truth is not None and self.truth_start:   # the truth-start test's answers (outcome.py)
            scored = [(name, evaluate(ans, self.truth)) for name, ans in self.truth_start]
            save_image_grid(folder / "truth-start.png", [self.truth.images, *(ev.paired_images for _, ev in scored)],
                            ["original", *(f"{name} from the original" for name, _ in scored)],
                            [[f"label {s.label_true}" for s in scored[0][1].per_image],
                             *([f"{s.psnr:.1f} dB" for s in ev.per_image] for _, ev in scored)])
        if recon.candidates is not None:
            rows = [c for c in recon.candidates] + [recon.images]
            titles = [f"seed {g}" for g in range(len(recon.candidates))] + ["answer"]
            save_image_grid(folder / "candidates.png", rows, titles)

    def file_bytes(self) -> tuple[bytes, bytes | None]:
        return update_bytes(self.update), truth_bytes(self.truth) if self.truth is not None else None


__all__ = ["CLIENT_ONLY", "ImageCase", "PSNRObserver", "UPDATE_DECIDES", "attack_update", "build_image_case",
           "client_batch", "client_update", "image_attack_config", "load_case", "simulate_client", "threat_model", "update_file_values"]
