"""GradInversion (Yin et al., "See through Gradients: Image Batch Recovery via GradInversion",
CVPR 2021): batch labels from the classifier gradient, then images by gradient matching with
fidelity priors and group consistency over several seeds, optimised with Adam + Langevin noise."""

from __future__ import annotations

# The attack's declaration (gradleak/specs.py reads it without importing this module).
SPEC = {
    "name": "gradinversion",
    "summary": "GradInversion (Yin et al., CVPR 2021): labels by Eq. 8, then images with fidelity priors, "
               "BN statistics and group consistency over G seeds",
    "kind": "optimisation",
    # Verdict line: priors keep the answer from explaining the update exactly (attacks/verdict.py);
    # with every prior off it is held to DLG's line (verdict_line below).
    "converged_below": 0.4,
    "verdict_line": True,
    "needs": "the gradients (or update) and the model; the client's BN batch statistics for --bn exact",
    "flags": {
        "preset": ["str", "cpu", "GradInversion preset: cpu | paper | imagenet (imagenet also fills the case, "
                   "whatever the attack, for each field not given: --attack gradinversion, efficientnet-lite0, "
                   "imagenet-samples, batch 8, BN statistics shared; under it the sharing and --box cannot be "
                   "switched off: use --preset paper with flags)"],
        "iterations": 600, "lr": 0.1, "optimizer": "adam", "init": "randn", "dtype": "float32",
        "warmup": ["int[0,10000000]", 20, "GradInversion: warm-up steps of the cosine schedule"],
        "alpha_g": ["float>=0", 1.0, "GradInversion Eq. 3: alpha_G"],
        "distance": [["l2", "cosine"], "l2", "GradInversion Eq. 3: gradient distance, l2 (the paper's) or cosine "
                     "(1 - cosine similarity over all layers together, the paper's Table 5 alternative)"],
        "alpha_tv": ["float>=0", 3e-2, "GradInversion Eq. 9: total-variation scale"],
        "alpha_l2": ["float>=0", 1e-6, "GradInversion Eq. 9: alpha_l2"],
        "alpha_bn": ["float>=0", 1.0, "GradInversion Eq. 9-10: alpha_BN"],
        "alpha_group": ["float>=0", 1e-2, "GradInversion Eq. 11: alpha_group"],
        "alpha_n": ["float>=0", 0.2, "GradInversion Sec. 3.5: Langevin noise scale alpha_n"],
        "alpha_ce": ["float>=0", 0.0, "DeepInversion (Yin et al. 2020) Eq. 1: scale of its class term, the "
                     "cross-entropy of the restored labels on the received model in eval mode (0, GradInversion's "
                     "objective, has none; with --alpha-g 0 it is DeepInversion)"],
        "seeds": ["int[1,256]", 4, "GradInversion: G candidates per image"],
        "group": [["none", "lazy", "registered"], "registered", "GradInversion group consistency (Eq. 11-12)"],
        "bn": [["exact", "approx", "none"], "exact", "GradInversion BN-statistics prior (Eq. 10)"],
        "registration_start": ["int[0,10000000]", 150, "GradInversion: first registration step (Eq. 12)"],
        "registration_every": ["int[1,10000000]", 5, "GradInversion: registration re-estimated every N steps"],
        "registration_steps": ["int[1,100000]", 40, "GradInversion: Adam steps of one registration fit"],
        "labels": "gradinversion",
        "final": [["consensus", "best"], "consensus", "GradInversion: answer = the group consensus | the best seed"],
        "box": ["bool", False, "GradInversion: clamp the candidates to the pixel box [0, 1] after every step and "
                "its noise (DeepInversion's code, breaching's seethroughgradients); the paper and the cpu and "
                "paper presets do not, the imagenet preset does"],
    },
    # The two presets (Sec. 4's values for ResNet-50 at 224 px; "cpu": tuned for the convnet at
    # 32 px, see PRESET_NOTES below); the first is the default.
    "presets": {
        "cpu": {"iterations": 600, "lr": 0.1, "warmup": 20, "alpha_g": 1.0, "alpha_tv": 3e-2, "alpha_l2": 1e-6,
                "alpha_bn": 1.0, "alpha_group": 1e-2, "alpha_n": 0.2, "seeds": 4, "group": "registered",
                "bn": "exact", "registration_start": 150, "registration_every": 5, "registration_steps": 40,
                "labels": "gradinversion", "final": "consensus", "box": False, "distance": "l2"},
        "paper": {"iterations": 20_000, "lr": 0.1, "warmup": 50, "alpha_g": 1e-3, "alpha_tv": 1e-4,
                  "alpha_l2": 1e-6, "alpha_bn": 0.1, "alpha_group": 1e-2, "alpha_n": 0.2, "seeds": 8,
                  "group": "registered", "bn": "exact", "registration_start": 5_000, "registration_every": 100,
                  "registration_steps": 40, "labels": "gradinversion", "final": "consensus", "box": False,
                  "distance": "l2"},
        # the paper's alphas on the 224 px schedule that scored highest per CPU hour on 2 cores
        # (seeds2-box-600: two seeds, the registered group, the pixel box, 600 iterations, 105 min);
        # "cases" below adds its case
        "imagenet": {"iterations": 600, "lr": 0.1, "warmup": 50, "alpha_g": 1e-3, "alpha_tv": 1e-4,
                     "alpha_l2": 1e-6, "alpha_bn": 0.1, "alpha_group": 1e-2, "alpha_n": 0.2, "seeds": 2,
                     "group": "registered", "bn": "exact", "registration_start": 150, "registration_every": 3,
                     "registration_steps": 40, "labels": "gradinversion", "final": "consensus", "box": True,
                     "distance": "l2"},
    },
    # What --preset imagenet fills in where the user gives nothing (config.py), whatever the attack:
    # Sec. 4's setting, 8 ImageNet photos at 224 px on a pretrained BN network with the client's BN
    # statistics shared.
    "cases": {"preset": {"imagenet": {"attack": "gradinversion", "model": "efficientnet-lite0",
                                      "data": "imagenet-samples", "batch_size": 8, "share_bn_statistics": True}}},
    # the G seeds are independent until the group term: --nproc spreads them (pipeline/distributed.py)
    "shards": "seeds",
    "default_note": {
        "warmup": "at most a tenth of --iterations",
        "registration_start": "scaled with --iterations",
        "registration_every": "scaled with --iterations",
        "alpha_g": "the preset's value is for its model (cpu: convnet, 14 parameter tensors; paper: ResNet-50, 161) "
                   "and scaled by that count / the attacked model's",
        "alpha_bn": "the preset's value is for its model (cpu: convnet, 4 BN layers; paper: ResNet-50, 53) "
                    "and scaled by that count / the attacked model's",
    },
    "auto": {"order": 2, "one_image": False, "batch": True, "max_side": None},
    "resolve": True,
    # Data, not history: each tag is hashed into stored sweep cells' identities (sweep/spec.py), so
    # it stays word for word, its date included; a new tag says what changed, not when.
    "changed_defaults": {"alpha_g": "preset x reference / parameter tensors since 2026-11-25",
                         "alpha_bn": "preset x reference / BN layers since 2026-11-25"},
    # the flags every sweep cell identity hashes even unset (gradleak/specs.py); frozen, never extended
    "hashed_flags": ["preset", "iterations", "lr", "optimizer", "init", "dtype", "warmup",
                     "alpha_g", "alpha_tv", "alpha_l2", "alpha_bn", "alpha_group", "alpha_n", "seeds", "group", "bn",
                     "registration_start", "registration_every", "registration_steps", "labels", "final"],
}

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..catalog import unknown
from ..errors import ConfigError
from ..fl.update import SharedUpdate
from ..models import ModelSpec
from .base import DTYPES, start_images, to_pixels
from .group import GroupConsistency, group_penalty
from .labels import effective_label_method, restore_labels
from ..engine import AttackState, Engine, LoopHooks, LoopResult, LoopSettings, Observer, SeedShard
from .priors import (INITIAL_STATISTICS_NOTE, BNTargets, ClassTerm, bn_prior, bn_targets,
                     initial_running_statistics, l2_norm, total_variation)
from .reconstruction import Reconstruction
from .simulate import UpdateSimulator
from .verdict import relative_distance
from .configs import config_class

# the typed config of this attack, derived from its SPEC (attacks/configs.py)
GradInversionConfig = config_class(SPEC["name"])

FINAL_CHOICES = ("best", "consensus")


# The knobs (SPEC's flags; each is a field of the typed config, attacks/configs.py):
#   preset:             where the values not given came from ("cpu", "paper": SPEC's presets).
#   iterations, lr:     Adam steps and base learning rate lambda.
#   warmup:             linear warm-up steps of the cosine schedule.
#   alpha_g:            Eq. 3 scale of the gradient-matching loss.
#   distance:           Eq. 3's gradient distance: "l2" (the paper's, summed per layer) | "cosine"
#                       (1 - cosine similarity over all layers together, Table 5's alternative).
#   alpha_tv, alpha_l2, alpha_bn: Eq. 9 scales of the fidelity priors.
#   alpha_group:        Eq. 11 scale of the group consistency term.
#   alpha_n:            Sec. 3.5 Langevin noise scale (noise std = lambda(t) * alpha_n).
#   alpha_ce:           DeepInversion's class term (Eq. 1 of Yin et al. 2020); 0 here, on in Table 4's DeepInversion row.
#   seeds:              G, candidates optimised jointly (one batched computation).
#   group:              "none" | "lazy" (pixel mean) | "registered" (Eq. 12).
#   bn:                 "exact" (client's batch statistics) | "approx" (running stats) | "none".
#   registration_start, registration_every: when the registration is (re-)estimated (steps).
#   registration_steps: Adam steps of one registration fit.
#   labels:             label restoration method (labels.LABEL_METHODS).
#   final:              "consensus" (E of Eq. 11-12; the best seed when group is "none") |
#                       "best" (the seed with the lowest L_grad + R_fidelity).
#   box:                clamp the candidates to the pixel box after every step (and its noise).
#
# PRESETS (SPEC["presets"]): "paper" is Sec. 4 "Implementation details" (ResNet-50, 224 px,
# batch 8): Adam lr 0.1, cosine decay, 50 warm-up steps, 20k iterations, alphas as printed;
# 8 seeds (Sec. 4.1.2), registration after 5k iterations then every 100.
# "imagenet" is "paper" with the schedule that scored highest per CPU hour at 224 px on 2 cores
# (reproduction/gradinversion-imagenet, PSNR in ~105 min: seeds2-box-600 10.23 dB, box-1600
# 8.53, box-600 8.39 in 44 min; the box lifted every image): 2 seeds, registered group, the box,
# 600 iterations, the registration schedule the paper's fractions of them (150, every 3). Part
# of the two seeds' gain may be the consensus averaging towards flat (its gradient distance is
# worse, 2.30 against box-1600's 1.58): seeds2-box-600/reading.md.
# "cpu" is for the convnet (width 16-32, random init) at 32 px, batch 4, 2 CPU cores (~0.1 s per
# step for 4 seeds). Tuned on real CIFAR-10 batches (300 steps, one seed, PSNR after pairing):
# * alpha_G : alpha_BN = 1 : 1. The paper's 1e-3 : 0.1 lets R_BN dominate here (14.2 dB at
#   alpha_BN/alpha_G = 10 vs 18.0 dB at 1); the gradient term still matters (10.8 dB at
#   alpha_G = 0). Only ratios matter to Adam, so alpha_G is set to 1 for readability.
# * alpha_TV = 3e-2 (11.6 dB without TV, 16.3 at 1e-2, 18.0 at 3e-2, 16.2 at 1e-1): at 32 px
#   DeepInversion's L2 TV is ~100x smaller relative to Eq. 3 than at 224 px on ResNet-50.
# * alpha_group = 1e-2 as in the paper (registered consensus 19.4 dB; 1e-1: 19.2; 3e-1
#   collapses the seeds: 18.5); alpha_n = 0.2 and lr = 0.1 as in the paper (neutral here).
# * 600 steps, registration from step 150 (the paper's 5k/20k) every 5 steps (the paper's
#   100/20k would be 3; one fit costs ~0.1 s on 2 cores, 5 keeps it under 15% of the run).
PRESETS: dict[str, dict[str, object]] = SPEC["presets"]  # type: ignore[assignment]
SETTINGS_FIELDS = ("iterations", "lr", "warmup", "alpha_g", "alpha_tv", "alpha_l2", "alpha_bn", "alpha_group",
                   "alpha_n", "seeds", "group", "bn", "registration_start", "registration_every",
                   "registration_steps", "labels", "final", "box", "distance")


def verdict_line(settings: dict[str, Any]) -> str | None:
    """The verdict's hook (SPEC "verdict_line", attacks/verdict.py): a run with no prior and no
    group term (Eq. 3's gradient matching alone) is held to DLG's line; None: GradInversion's own.
    ``settings``: what the run recorded (settings_record)."""
    no_bn = settings.get("alpha_bn") == 0 or settings.get("bn") == "none"
    # one seed has no group to agree with: its consensus is itself
    no_group = settings.get("group") == "none" or settings.get("alpha_group") == 0 or settings.get("seeds") == 1
    if no_bn and no_group and settings.get("alpha_tv") == 0 and settings.get("alpha_l2") == 0:
        return "dlg"
    return None


def preset_values(name: str) -> dict[str, object]:
    """A copy of preset ``name``'s values (UnknownNameError for an unknown preset)."""
    if name not in PRESETS:
        raise unknown("GradInversion preset", name, PRESETS)
    return dict(PRESETS[name])


def settings_record(cfg: GradInversionConfig) -> dict[str, object]:
    """The constants a run used, as metrics.json records them (``name``: the preset); DeepInversion's
    class term only where it is on (GradInversion's objective has none, and its records keep their form)."""
    return {"name": cfg.preset, **{f: getattr(cfg, f) for f in SETTINGS_FIELDS},
            **({"alpha_ce": cfg.alpha_ce} if cfg.alpha_ce > 0 else {})}


# A preset's alpha_G and alpha_BN are given for the model it was set on and applied per layer:
# Eq. 3 sums one L2 norm per parameter tensor and Eq. 10 one term per BN layer, so with fixed
# alphas the gradient and BN terms of a deeper network outweigh the image priors (TV, l2, group:
# Eq. 9, 11), which do not grow with depth: on ResNet-18 (62 tensors, 20 BN layers) the cpu
# preset's TV weighed 4.4x less against L_grad than on the 14-tensor convnet it was tuned on.
# Measured on ResNet-18 (CIFAR stem), batches of 4, 200 steps, one seed, no group term, BN approx
# (benchmarks/presets.py, presets.json): the preset as is 9.3-9.8 dB, per layer 11.6-12.6 dB on
# three CIFAR-10 batches and four held-out scikit-image photos (one exploratory run with
# alpha_TV x 3.3 instead: 11.8 dB; breaching's seethroughgradients measured 11.8 dB on the first
# batch); with the full preset (4 seeds, group term, BN exact) +0.2 dB.
# So a preset's alpha_G is scaled by L_ref / L and its alpha_BN by B_ref / B, where L and B are
# the attacked model's parameter tensors and BN layers and L_ref, B_ref its reference model's:
# the reference model itself gets the preset's values unchanged. (Adam is invariant to the
# loss's overall scale, so this is the same as scaling the image priors up.) Constants given
# explicitly (--alpha-g, --alpha-bn) are used as given.
PRESET_MODELS: dict[str, tuple[str, int, int]] = {
    "cpu": ("convnet", 14, 4),       # the network the cpu preset was tuned on (any width)
    "paper": ("resnet50", 161, 53),  # the paper's ResNet-50
    "imagenet": ("resnet50", 161, 53),  # the paper's alphas, so the paper's reference
}


def layer_counts(module: torch.nn.Module) -> tuple[int, int]:
    """(parameter tensors that get a gradient, BatchNorm layers) of a network: the number of
    terms of Eq. 3 and of Eq. 10."""
    tensors = sum(1 for p in module.parameters() if p.requires_grad)
    bn = sum(1 for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm))
    return tensors, bn


def per_layer(preset: str, values: dict[str, object], layers: tuple[int, int] | None) -> dict[str, object]:
    """Preset ``preset``'s ``values`` for a model with ``layers`` = (parameter tensors, BN layers);
    None: the preset's reference model (values unchanged). See PRESET_MODELS."""
    if layers is None or preset not in PRESET_MODELS:
        return values
    _, ref_tensors, ref_bn = PRESET_MODELS[preset]
    tensors, bn = layers
    return {**values, "alpha_g": float(values["alpha_g"]) * (ref_tensors / max(1, tensors)),  # type: ignore[arg-type]
            "alpha_bn": float(values["alpha_bn"]) * (ref_bn / bn) if bn > 0 else values["alpha_bn"]}  # type: ignore[arg-type]


@dataclass
class SeedStreams(AttackState):
    """GradInversion's own resumable state: each seed's generator (its initial pixels, then its
    Langevin noise on a CPU), on a GPU each seed's noise generator, and the group term's
    registration transforms."""

    generators: list[torch.Generator]
    group: GroupConsistency
    noise_generators: list[torch.Generator] | None = None
    device: torch.device = field(default=torch.device("cpu"), metadata={"state": False})
    dtype: torch.dtype = field(default=torch.float32, metadata={"state": False})

    def set_state(self, saved: dict[str, object]) -> None:
        saved = dict(saved)
        grp = saved.get("group")
        if isinstance(grp, dict) and isinstance(grp.get("registration"), dict) \
                and isinstance(grp["registration"].get("theta"), torch.Tensor):
            reg = grp["registration"]
            saved["group"] = {**grp, "registration": {**reg, "theta": reg["theta"].to(self.device, self.dtype)}}
        if self.noise_generators is None:
            # on a CPU the seeds' generators go on, as saved (a GPU-saved noise stream is not used)
            saved["noise_generators"] = None
        elif not (isinstance(saved.get("noise_generators"), list)
                  and len(saved["noise_generators"]) == len(self.noise_generators)):  # type: ignore[arg-type]
            logging.getLogger("gradleak").warning(
                "gradleak: the saved state has no GPU noise generators (it was saved on a CPU); the "
                "resumed run draws its Langevin noise from freshly seeded ones")
            saved["noise_generators"] = [g.get_state() for g in self.noise_generators]
        super().set_state(saved)


def resolve(given: dict[str, object], context: Any) -> dict[str, object]:
    """The config values of a run (attacks/configs.py): the preset (default "cpu") per layer of the
    attacked model (``context.layers``, see per_layer), then ``--iterations``, which scales the
    registration schedule (fractions of the run: 5k/20k and 100/20k in the paper) and caps the
    warm-up at a tenth of the run, then every constant given. The BN prior defaults to "exact"
    when the update carries the client's BN batch statistics (``context.bn_statistics_shared``)
    and to "approx" (the model's running statistics: the paper's Sec. 4 implementation details and
    Table 4's "BN approx") when it does not; "exact" without them is a ConfigError."""
    preset = str(given.get("preset", "cpu"))
    base = per_layer(preset, preset_values(preset), context.layers)
    n = given.get("iterations")
    if n is not None and n != base["iterations"]:
        scale = int(n) / max(1, int(base["iterations"]))  # type: ignore[arg-type]
        base.update(iterations=int(n), registration_start=int(round(int(base["registration_start"]) * scale)),  # type: ignore[arg-type]
                    registration_every=max(1, int(round(int(base["registration_every"]) * scale))),  # type: ignore[arg-type]
                    warmup=min(int(base["warmup"]), int(n) // 10))  # type: ignore[arg-type]
    values = {**base, **given, "preset": preset}
    if "bn" not in given and values["bn"] == "exact" and not context.bn_statistics_shared:
        values["bn"] = "approx"
    if values["bn"] == "exact" and not context.bn_statistics_shared:
        raise ConfigError("--bn exact needs an update that carries the client's BN batch statistics "
                          "(simulate the client with --share-bn-statistics, or use --bn approx)")
    return values


def seed_generators(seed: int, count: int, start: int = 0, device: torch.device | str = "cpu") -> list[torch.Generator]:
    """One generator per candidate g in [start, start + count), seeded seed + g (initial pixels,
    then its Langevin noise); ``start`` is the first global seed index a process owns."""
    return [torch.Generator(device=device).manual_seed(int(seed) + g) for g in range(start, start + count)]


# Seed offset of the per-seed noise generators on a GPU (a stream apart from the initial pixels').
NOISE_STREAM = 7_919


def _pixel_box(model: ModelSpec, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The pixel box, [0, 1] per channel, in the model's normalised space: (low, high)."""
    lo = model.normalize(torch.zeros(1, *model.input_shape, dtype=dtype)).to(device)
    hi = model.normalize(torch.ones(1, *model.input_shape, dtype=dtype)).to(device)
    return lo, hi


@dataclass
class _Candidates:
    """The G seeds' candidate batches x [G, K, C, H, W] this process optimises, and what scores
    them: the simulated client with the restored labels, the BN targets, the group term."""

    cfg: GradInversionConfig
    model: ModelSpec
    victim: UpdateSimulator
    labels: torch.Tensor
    targets: BNTargets | None   # the BN statistics R_BN compares (priors.bn_targets), None without R_BN
    x: torch.Tensor
    group: GroupConsistency
    shard: SeedShard
    noise_gens: list[torch.Generator]
    box: tuple[torch.Tensor, torch.Tensor] | None
    label_method: str = "gradinversion"   # the rule restore_labels applied (labels.effective_label_method)
    class_term: ClassTerm | None = None   # DeepInversion's L(x^, y), None unless alpha_ce > 0
    last: dict[str, torch.Tensor] = field(default_factory=dict)   # the last step's terms

    @property
    def consensus(self) -> bool:
        """Whether the answer is the group's consensus E (else the best seed)."""
        return self.cfg.final == "consensus" and self.group.active

    def terms(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-candidate loss terms [G] (scaled by their alphas; "distance" = Eq. 3 without
        alpha_G), from one forward/backward."""
        cfg = self.cfg
        grads, stats = self.victim.batched(images, self.labels)
        if cfg.distance == "cosine":
            # Table 5's alternative: 1 - cosine similarity of the whole gradient, every layer
            # concatenated into one vector (Inverting Gradients' Eq. 4, the loss the paper cites
            # for it, and the same function as attacks/ig.py). A per-layer cosine would weigh a
            # bias of 16 entries as much as a convolution of thousands. "distance" stays Eq. 3's
            # l2 of the same gradients (a record, outside the objective), so that every run
            # reports its answer's fit on one scale whichever loss it optimised.
            distance = self.victim.gradient.layer_l2([g.detach() for g in grads])
            out = {"distance": distance, "grad": cfg.alpha_g * self.victim.gradient.cosine(grads)}
        else:
            distance = self.victim.gradient.layer_l2(grads)
            out = {"distance": distance, "grad": cfg.alpha_g * distance}          # Eq. 3
        fid = cfg.alpha_tv * total_variation(images) + cfg.alpha_l2 * l2_norm(images)   # Eq. 9
        if self.targets is not None:
            fid = fid + cfg.alpha_bn * bn_prior(stats, self.targets)                   # Eq. 10
        if self.class_term is not None:
            fid = fid + cfg.alpha_ce * self.class_term(images)                # DeepInversion Eq. 1
        out["fidelity"] = fid
        return out

    def objective(self) -> torch.Tensor:
        x, group, shard = self.x, self.group, self.shard
        parts = self.terms(x)
        total = parts["grad"] + parts["fidelity"]
        if group.active and self.cfg.alpha_group > 0:
            parts["group"] = self.cfg.alpha_group * group_penalty(x, group.consensus(x))  # Eq. 11
            total = total + parts["group"]
        self.last.update({n: v.detach() for n, v in parts.items()})
        loss = total.sum()  # candidates are independent terms: sum = G separate objectives
        if shard.distributed:  # report every seed's loss; the other processes' part is a constant
            loss = loss + (shard.all_reduce_sum(loss.detach()) - loss.detach())
        return loss

    def noise(self, v: torch.Tensor) -> torch.Tensor:
        """Sec. 3.5's eta ~ N(0, I), each seed's from its own generator."""
        eta = torch.stack([torch.randn(v.shape[1:], generator=g, dtype=v.dtype, device=g.device)
                           for g in self.noise_gens])
        return eta.to(v.device)

    def after_step(self, t: int) -> None:
        x, shard = self.x, self.shard
        if self.box is not None:
            lo, hi = self.box
            x.copy_(torch.maximum(torch.minimum(x, hi), lo))  # NaN stays NaN: divergence is still seen
        if shard.distributed and shard.any(not bool(torch.isfinite(x).all())):
            x.fill_(float("nan"))  # one process diverged: all of them go back to the last good state
            return
        self.group.maybe_register(t, x)

    def answer(self) -> torch.Tensor:
        """The answer as it stands (collective when the seeds are sharded)."""
        x, shard = self.x, self.shard
        if self.consensus:
            return self.group.consensus(x)
        score = self.last.get("grad", torch.zeros(x.shape[0])) + self.last.get("fidelity", torch.zeros(x.shape[0]))
        if shard.distributed:
            return shard.seed_tensor(x.detach(), int(torch.argmin(shard.all_gather_seeds(score))))
        return x.detach()[int(torch.argmin(score))]

    def logger(self, observer: Observer | None) -> Callable[[int], None]:
        """on_log: every process computes answer() (it is collective); the observer sees it."""
        model = self.model

        def log(t: int) -> None:
            images = to_pixels(model, self.answer())
            if observer is not None:
                observer(t, images)
        return log

    def final_scores(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
        """Every seed's score and Eq. 3 distance on the final images (no noise, no group term),
        the candidates (every seed on rank 0, None on the other processes) and the best seed."""
        x, shard = self.x, self.shard
        with torch.no_grad():
            final = self.terms(x.detach())
        score = torch.nan_to_num(final["grad"] + final["fidelity"], nan=float("inf"))
        distances = final["distance"]
        candidates: torch.Tensor | None = x.detach()
        if shard.distributed:  # every seed's scores everywhere; the candidates to rank 0 only
            score, distances = shard.all_gather_seeds(score), shard.all_gather_seeds(distances)
            candidates = shard.gather_seeds(x.detach())
        return score, distances, candidates, int(torch.argmin(score))

    def chosen(self, distances: torch.Tensor, best: int) -> tuple[torch.Tensor, float]:
        """The final answer (the consensus or the best seed) and its Eq. 3 distance."""
        x, shard = self.x, self.shard
        if self.consensus:
            chosen = self.group.consensus(x)
            with torch.no_grad():
                return chosen, float(self.terms(chosen.unsqueeze(0))["distance"][0])
        chosen = shard.seed_tensor(x.detach(), best) if shard.distributed else x.detach()[best]
        return chosen, float(distances[best])

    def reconstruction(self, result: LoopResult, notes: dict[str, str]) -> Reconstruction:
        cfg, shard, group, victim = self.cfg, self.shard, self.group, self.victim
        score, distances, candidates, best = self.final_scores()
        chosen, distance = self.chosen(distances, best)
        extra_dist = {"processes": shard.world} if shard.distributed else {}
        with torch.enable_grad():  # the verdict's evidence: how well the answer explains the update (verdict.py)
            relative = relative_distance(victim(chosen.detach(), self.labels, create_graph=False), victim.target)
        return Reconstruction(
            images=to_pixels(self.model, chosen), labels=self.labels.cpu().long(),
            candidates=to_pixels(self.model, candidates) if candidates is not None else None,
            history=result.history, iterations=result.iterations, wall_seconds=result.wall_seconds,
            label_method=self.label_method,
            extra={"gradient_distance": distance,
                   "candidate_gradient_distance": [float(v) for v in distances],
                   "candidate_score": [float(v) for v in score], "best_seed": best,
                   "answer": "consensus" if self.consensus else "best",
                   "seconds_per_iteration": result.wall_seconds / max(1, result.iterations),
                   "registrations": group.registration.fits if group.registration is not None else 0,
                   "settings": settings_record(cfg), "final_loss": result.final_loss, **extra_dist,
                   "relative_gradient_distance": relative, "plateau": False, "restarts_used": 0, **notes})


def run(cfg: GradInversionConfig, update: SharedUpdate, model: ModelSpec, engine: Engine) -> Reconstruction:
    """GradInversion on a shared update, with ``cfg`` its typed config (attacks/configs.py). Returns the final answer, every seed's candidate batch
    ([G, K, C, H, W] in ``candidates``) and the restored labels.

    ``engine.shard``: the seeds spread over processes (engine/shard.py; every process calls this with the
    same arguments and its own shard): this process optimises seeds ``shard.local_range`` and the
    processes exchange the consensus, the loss and, at the end, scores and candidates. Every
    process returns the same answer; ``candidates`` holds every seed on rank 0 only (None on the
    others). None: all seeds here.

    Under FedSGD this is the paper's attack. Under the fedavg and aggregate threat models
    (beyond the paper) Eq. 3 compares the update the candidates would produce, simulated by
    UpdateSimulator (local steps unrolled, clients averaged), and R_BN compares the BN
    statistics as the client shares them there (the mean over its local steps / over clients)."""
    observer, shard = engine.observer, engine.shard
    dtype, device = DTYPES[cfg.dtype], engine.device
    k = int(update.meta.batch_size)
    labels = restore_labels(update, model, k, cfg.labels).to(device)
    victim = UpdateSimulator(model, update, dtype=dtype, device=device)  # fedsgd, fedavg or aggregate
    targets = bn_targets(update, victim.bn_names, cfg.bn, dtype=dtype, device=device) if cfg.alpha_bn > 0 else None
    notes = ({"bn_prior_note": INITIAL_STATISTICS_NOTE} if cfg.bn == "approx" and initial_running_statistics(targets)
             else {})
    shard = shard if shard is not None else SeedShard(cfg.seeds)
    if shard.total != cfg.seeds:
        raise ConfigError(f"seed shard is for {shard.total} seeds, the run has {cfg.seeds}")
    mine = shard.local_range
    gens = seed_generators(cfg.seed, len(mine), start=mine.start)
    # Sec. 3.5's noise is drawn per seed every step. On a CPU each seed's generator goes on from
    # its initial pixels. On a GPU, drawing it on the CPU (the paper preset: 8 x 8 x 3 x 224 x 224
    # values, ~85 ms per step on one core here, then a copy) would leave the GPU idle each step,
    # so each seed gets a generator on the device, seeded seed + NOISE_STREAM + g: reproducible
    # per seed, and G batched seeds still draw what G single-seed runs draw.
    noise_gens = gens if device.type == "cpu" else \
        seed_generators(cfg.seed + NOISE_STREAM, len(mine), start=mine.start, device=device)
    shape = (k, *model.input_shape)
    x = torch.stack([start_images(model, shape, cfg.init, g, dtype, engine.start, labels) for g in gens]).to(device)
    x.requires_grad_(True)
    group = GroupConsistency(cfg.group, tuple(x.shape), start=cfg.registration_start,
                             every=cfg.registration_every, steps=cfg.registration_steps, shard=shard)
    run = _Candidates(cfg=cfg, model=model, victim=victim, labels=labels, targets=targets, x=x, group=group,
                      shard=shard, noise_gens=noise_gens, box=_pixel_box(model, dtype, device) if cfg.box else None,
                      label_method=effective_label_method(update, cfg.labels),
                      class_term=ClassTerm(model.module, update, labels, dtype=dtype, device=device)
                      if cfg.alpha_ce > 0 else None)
    state = SeedStreams(generators=gens, group=group, noise_generators=None if noise_gens is gens else noise_gens,
                        device=device, dtype=dtype)
    # answer() is collective: with sharded seeds every process takes part in the log
    log = run.logger(observer) if observer is not None or shard.distributed else None
    loop = LoopSettings(iterations=cfg.iterations, lr=cfg.lr, optimizer=cfg.optimizer,
                        schedule="cosine", warmup=cfg.warmup, langevin=cfg.alpha_n,
                        progress=engine.progress, description="gradinversion")
    result = engine.optimise([x], run.objective, loop,
                             LoopHooks(after_step=run.after_step, noise=run.noise, on_log=log, state=state))
    return run.reconstruction(result, notes)


__all__ = ["PRESETS", "PRESET_MODELS", "SPEC", "layer_counts", "per_layer", "preset_values", "resolve", "run",
           "settings_record", "verdict_line"]
