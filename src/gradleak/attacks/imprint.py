"""The imprint attack of "Robbing the Fed" (Fowl et al., ICLR 2022): analytic, no optimisation."""

from __future__ import annotations

# The attack's declaration (gradleak/specs.py reads it without importing this module).
SPEC = {
    "name": "imprint",
    "summary": "a malicious server's imprint module (Fowl et al., ICLR 2022): inputs read off its bins",
    "kind": "closed-form",
    "converged_below": 1e-4,   # judged analytically: exact when every sample sat alone in its bin
    "needs": "a model carrying the imprint block (--server imprint)",
    "flags": {},
    "auto": {"order": 1},
}

import time
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError, ModelMismatchError, NonFiniteError
from ..fl.threats import ThreatModel
from ..fl.update import SharedUpdate
from ..models import ModelSpec
from .labels import restore_labels
from .reconstruction import Reconstruction
from ..engine import Engine
from .configs import config_class

# the typed config of this attack, derived from its SPEC (attacks/configs.py)
ImprintConfig = config_class(SPEC["name"])

W0, B0, W2 = "imprint.linear0.weight", "imprint.linear0.bias", "imprint.linear2.weight"

# A bin difference is empty when |db_i - db_{i+1}| <= EMPTY_BIN_TOLERANCE x the largest |db| of
# the update's bins and differences. The two bins of an empty difference sum the same samples, so
# their difference is 0 or float32 rounding (~1e-7 relative; measured: exactly 0 on ResNet-18);
# a sample's own |g_k| below 1e-5 of the largest would count as empty too.
EMPTY_BIN_TOLERANCE = 1e-5

# FedAvg shares W_1 - W_0, rounded at the weights' precision: each bias entry carries up to half
# an ulp of the bias (<= eps |b| / 2), so a difference of two bins up to eps (|b_i| + |b_{i+1}|) / 2
# of rounding alone; below that a difference is empty too. Measured (ResNet-18, 4 photos, one
# step, lr 0.01 / 0.1, gain 1e-4 / 1e-3): empty differences at <= 0.28 of this bound, the
# samples' at >= 1.06 (4 to 840).
ROUNDING_BOUND = 0.5

# The server's block must be what the attack assumes: rows parallel to one measurement w, and
# linear2's columns identical (relative deviation at most this much).
STRUCTURE_TOLERANCE = 1e-4

# A recovered bin image with more than MIXED_FRACTION of its pixels outside
# [-PIXEL_MARGIN, 1 + PIXEL_MARGIN] is not a photo: several samples with opposite-sign g share the
# bin. Measured on ResNet-18: single samples 0 (FedSGD, and FedAvg rounding at 30-60 dB), mixed
# bins 0.27-0.59. A mix with same-sign g is a convex blend, inside the range: not detected.
PIXEL_MARGIN = 0.1
MIXED_FRACTION = 0.05

# What fills a slot no bin isolated, when no sample was recovered at all: mid-grey pixels.
MID_GREY = 0.5

MISSING_BLOCK = ("imprint: the update was not computed on a model with the server's imprint block "
                 "(share with --server imprint)")


def _relative_spread(t: torch.Tensor, ref: torch.Tensor) -> float:
    scale = float(ref.abs().max())
    return float((t - ref).abs().max()) / scale if scale > 0 else float("inf")


def _row_scales(weight: torch.Tensor) -> torch.Tensor:
    """a_i with row_i = a_i w (w = row 0), [N]; ModelMismatchError when the rows are not parallel
    to one measurement or a row looks the other way (a_i <= 0: not a cumulative bin)."""
    ref = weight[0]
    norm2 = float(ref.pow(2).sum())
    if norm2 <= 0:
        raise ModelMismatchError("imprint: the block's first measurement row is zero")
    scales = weight @ ref / norm2
    if _relative_spread(weight, scales[:, None] * ref[None, :]) > STRUCTURE_TOLERANCE:
        raise ModelMismatchError("imprint: the block's linear0 rows are not one shared measurement")
    if not bool((scales > 0).all()):
        raise ModelMismatchError("imprint: a linear0 row measures with the opposite sign (not a cumulative bin)")
    return scales


def check_imprint(update: SharedUpdate, model: ModelSpec) -> None:
    """Refuse an update the imprint attack cannot read (typed errors, one line each):
    ModelMismatchError without the server's imprint block or with a block of another structure or
    shape; NonFiniteError for NaN/Inf in the block's tensors; ConfigError for a malformed threat
    record or FedAvg with more than one local step. A batch larger than the bins is attacked: n
    bins separate at most n inputs (the rest are filler slots, and ``separated`` says how many were
    read off), whatever the metadata's batch size says."""
    if W0 not in update.gradients:
        raise ModelMismatchError(MISSING_BLOCK)
    for key, where in ((B0, update.gradients), (W0, update.global_weights), (B0, update.global_weights),
                       (W2, update.global_weights)):
        if key not in where:
            raise ModelMismatchError(f"imprint: the update holds no {key!r}, so it was not computed on a model "
                                     "with the server's imprint block (share with --server imprint)")
    weight, w2 = update.global_weights[W0], update.global_weights[W2]
    d = 1
    for v in model.input_shape:
        d *= int(v)
    if weight.ndim != 2 or weight.shape[1] != d or weight.shape[0] < 1:
        raise ModelMismatchError(f"imprint: linear0 weight is {tuple(weight.shape)}, expected [bins, {d}] "
                                 f"for images {tuple(model.input_shape)}")
    n = int(weight.shape[0])
    expected = {W0: (n, d), B0: (n,), W2: (d, n)}
    for key, shape in expected.items():
        for label, where in (("global weight", update.global_weights), ("gradient", update.gradients)):
            if key in where and tuple(where[key].shape) != shape:
                raise ModelMismatchError(f"imprint: {label} {key!r} is {tuple(where[key].shape)}, expected {list(shape)}")
    for label, where in (("gradient", update.gradients), ("global weight", update.global_weights)):
        for key in (W0, B0, W2):
            t = where.get(key)
            if t is not None and not bool(torch.isfinite(t).all()):
                raise NonFiniteError(f"imprint: {label} {key!r} holds NaN or Inf")
    threat = ThreatModel.from_record(update.meta.threat)  # ConfigError on a malformed record
    if threat.client_threat == "fedavg" and threat.local_steps > 1:
        raise ConfigError(f"imprint: FedAvg with {threat.local_steps} local steps is not supported: the imprint "
                          "weights move between the steps (one local step, FedSGD or an aggregate of them)")
    threat.check_one_gradient("imprint")
    if int(update.meta.batch_size) < 1:
        raise ConfigError(f"imprint: batch size must be >= 1, got {update.meta.batch_size}")
    _row_scales(weight.detach().double().cpu())
    cols = w2.detach().double().cpu()
    if _relative_spread(cols, cols[:, :1].expand_as(cols)) > STRUCTURE_TOLERANCE:
        raise ModelMismatchError("imprint: the block's linear2 columns are not identical (bins would not share g_k)")


def _label_model(update: SharedUpdate, model: ModelSpec) -> ModelSpec:
    """The spec label restoration reads: ``model`` if its classifier is in the update (the
    imprinted spec), else the victim's spec seen under the ImprintedNet's ``net.`` prefix."""
    if f"{model.classifier_name}.weight" in update.gradients:
        return model
    wrapped = replace(model, module=nn.ModuleDict({"net": model.module}))
    if f"{wrapped.classifier_name}.weight" in update.gradients:
        return wrapped
    raise ModelMismatchError(f"imprint: the update holds no gradient for the classifier {model.classifier_name!r}")


def _empty_tolerance(update: SharedUpdate, bias: torch.Tensor, db: torch.Tensor, ddb: torch.Tensor) -> torch.Tensor:
    """Per bin difference (threshold order), the |db difference| at or below which it is empty:
    EMPTY_BIN_TOLERANCE of the largest |db|, and in FedAvg at least the bias rounding
    (ROUNDING_BOUND). ``bias``: the bins' biases in threshold order."""
    scale = float(torch.cat([db.abs(), ddb.abs()]).max())
    tolerance = torch.full_like(ddb, EMPTY_BIN_TOLERANCE * scale)
    threat = ThreatModel.from_record(update.meta.threat)
    if threat.client_threat == "fedavg":  # a weight difference, rounded at the weights' precision
        sent = update.global_weights[B0]
        eps = torch.finfo(sent.dtype).eps if sent.is_floating_point() else 0.0
        b = bias.abs()
        tolerance = torch.maximum(tolerance, ROUNDING_BOUND * eps * torch.cat([b[:-1] + b[1:], b[-1:]]))
    return tolerance


def _flat_pixels(model: ModelSpec, measure: torch.Tensor, c_sorted: torch.Tensor, chosen: torch.Tensor,
                 n: int) -> torch.Tensor:
    """For each chosen bin, the flat image whose measurement w . x is the bin's middle brightness
    (pixels; mid-grey when w sums to 0). ``c_sorted``: the n thresholds in ascending order."""
    shape = tuple(int(v) for v in model.input_shape)
    separated = int(chosen.numel())
    width = float(c_sorted[-1] - c_sorted[-2]) if n > 1 else 1.0
    upper = torch.cat([c_sorted[1:], c_sorted[-1:] + width])
    middle = (c_sorted + upper) / 2  # the top bin: half a bin width above its threshold
    total = float(measure.sum())
    flat = torch.zeros(separated, *shape, dtype=torch.float64)
    if total != 0:
        flat = (middle[chosen] / total).view(-1, 1, 1, 1).expand(separated, *shape)
    return model.denormalize(flat) if total != 0 else torch.full((separated, *shape), MID_GREY)


def _fill_slots(recovered: torch.Tensor, mixed: torch.Tensor, filled: int,
                shape: tuple[int, ...]) -> tuple[torch.Tensor, str]:
    """``recovered`` with ``filled`` slots no bin isolated appended, and what filled them: the
    mixed bins' flat images, else the mean of the recovered images, else mid-grey."""
    clean = recovered[~mixed]
    if bool(mixed.any()):  # a mixed bin holds at least one sample more than its slot
        fill, pool = "mixed-bin brightness", recovered[mixed]
    elif len(clean):
        fill, pool = "mean", clean.mean(dim=0, keepdim=True)
    else:
        fill, pool = "mid-grey", torch.full((1, *shape), MID_GREY)
    extra_slots = pool[torch.arange(filled) % len(pool)]
    return torch.cat([recovered, extra_slots]), fill


def _why_not_exact(defended: bool, n_nonempty: int, k: int, mixed: int) -> str:
    """Why the attacker cannot claim every input (the verdict's reason)."""
    if defended:
        return "a defense was applied: the attacker cannot tell the bins' noise from samples"
    if n_nonempty != k:
        return f"{n_nonempty} non-empty bins for {k} samples: some shared a bin or fell below the lowest threshold"
    return f"{mixed} bins held samples of opposite gradient signs"


def _bin_differences(update: SharedUpdate, weight: torch.Tensor,
                     bias: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The bins' thresholds, their order and the adjacent differences of their gradients in that
    order (Fowl et al. Sec. 3: bin i minus bin i+1 holds the samples between the two thresholds),
    with which differences are non-empty (above the empty-bin tolerance)."""
    scales = _row_scales(weight)
    # Row i is a_i w, so bin i is active when w . x > -b_i / a_i: its threshold (Sec. 3)
    thresholds = -bias / scales
    order = torch.argsort(thresholds)
    dw = update.gradients[W0].detach().double().cpu()[order]
    db = update.gradients[B0].detach().double().cpu()[order]
    # Adjacent differences in threshold order; the top bin stands alone (no bin above it).
    ddw = torch.cat([dw[:-1] - dw[1:], dw[-1:]])
    ddb = torch.cat([db[:-1] - db[1:], db[-1:]])
    nonempty = (ddb.abs() > _empty_tolerance(update, bias[order], db, ddb)) & (ddb != 0)
    return thresholds, order, ddw, ddb, nonempty


def _photos(model: ModelSpec, ratios: torch.Tensor, shape: tuple[int, ...], weight: torch.Tensor,
            sorted_thresholds: torch.Tensor, chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The chosen bins' images, dW / db per difference (Sec. 3), in [0, 1], and which bins are
    mixed (their slot a flat image at the bin's brightness)."""
    pixels = model.denormalize(ratios.view(len(chosen), *shape))
    # A bin holding one sample gives a photo (pixels in [0, 1]); samples whose g have opposite
    # signs give a ratio far outside: such a bin certainly held several samples (a "mixed" bin).
    # Its slot becomes a flat image at the bin's brightness, the best guess for any of them
    # (a clamped extrapolation is worse than that, and steals the pairing of the exact slots).
    outside = ((pixels < -PIXEL_MARGIN) | (pixels > 1 + PIXEL_MARGIN)).flatten(1).double().mean(1)
    mixed = outside > MIXED_FRACTION
    flat_pixels = _flat_pixels(model, weight[0], sorted_thresholds, chosen, int(sorted_thresholds.numel()))
    return torch.where(mixed.view(-1, 1, 1, 1), flat_pixels, pixels).clamp(0.0, 1.0).float(), mixed


def _record(k: int, n: int, n_nonempty: int, mixed: torch.Tensor, filled: int, fill: Any,
            recovered_bins: list[int], defended: bool) -> dict[str, Any]:
    """The reconstruction's extra (see :func:`imprint_attack`), with why the answer is not exact."""
    separated = min(n_nonempty, k)
    extra = {
        "analytic": True,
        "closed_form": True,
        "exact": n_nonempty == k and not defended and not bool(mixed.any()),
        "separated": separated,
        "bins": n,
        "nonempty_bins": n_nonempty,
        "collided_or_lost": k - separated,
        "mixed_bins": int(mixed.sum()),
        "filled": filled,
        "fill": fill,
        "empty_bin_tolerance": EMPTY_BIN_TOLERANCE,
        "recovered_bins": recovered_bins,
        "plateau": False,
        "restarts_used": 0,
    }
    if not extra["exact"]:  # why the attacker cannot claim every input (the verdict's reason)
        extra["why_not_exact"] = _why_not_exact(defended, n_nonempty, k, int(mixed.sum()))
    if n_nonempty > k:
        extra["note"] = (f"{n_nonempty} non-empty bins for {k} samples: noise (a defense) or a "
                         "mismatched batch size; the strongest K were kept")
    return extra


def imprint_attack(update: SharedUpdate, model: ModelSpec) -> Reconstruction:
    """Rebuild the client's images from the imprint block's gradients (Fowl et al. Sec. 3).

    ``model``: the imprinted spec (gradleak.models.imprint.imprint_model) or the victim's own spec;
    only its input shape, normalisation and classifier are read. The thresholds are the ones the
    server sent (update.global_weights), never the server's configuration.

    Returns K = update.meta.batch_size slots: the K non-empty bin differences with the largest
    |db difference| (all of them if there are fewer) in brightness order, pixels clamped to
    [0, 1]; a difference that is no photo (MIXED_FRACTION of its pixels far outside [0, 1]: a mix
    of samples) becomes a flat image at its bin's brightness. Slots no bin isolated are filled:
    with the mixed bins' flat images when there are some (each holds a sample more than its slot),
    else the mean of the recovered images, else mid-grey; extra["fill"] says which.

    extra: "analytic" True; "exact" True only when exactly K differences are non-empty (every
    sample alone in its interval: judged from the update alone), none is mixed and no defense is
    recorded; "separated" (non-empty differences, at most K), "bins", "nonempty_bins",
    "collided_or_lost" (K - separated), "mixed_bins", "filled", "fill", "recovered_bins" (the
    server's bin indices used). In FedAvg (one step) "exact" means separated: the values carry
    the float32 rounding of W_1 - W_0.

    Labels: the label multiset from the classifier bias gradient ("counts", repeats allowed; the
    imprint bins carry no label, so the multiset is not assigned to slots).
    """
    start = time.perf_counter()
    check_imprint(update, model)
    k = int(update.meta.batch_size)
    weight = update.global_weights[W0].detach().double().cpu()
    bias = update.global_weights[B0].detach().double().cpu()
    thresholds, order, ddw, ddb, nonempty = _bin_differences(update, weight, bias)
    n = int(ddb.numel())
    n_nonempty = int(nonempty.sum())
    separated = min(n_nonempty, k)
    candidates = torch.nonzero(nonempty).flatten()
    # the K strongest differences, back in threshold (brightness) order
    chosen = candidates[torch.argsort(ddb[candidates].abs(), descending=True)[:separated]].sort().values
    shape = tuple(int(v) for v in model.input_shape)
    recovered, mixed = _photos(model, ddw[chosen] / ddb[chosen, None], shape, weight, thresholds[order], chosen)
    filled = k - separated
    fill = None
    if filled:
        recovered, fill = _fill_slots(recovered, mixed, filled, shape)
    labels = restore_labels(update, _label_model(update, model), k, method="counts")
    extra = _record(k, n, n_nonempty, mixed, filled, fill, [int(order[i]) for i in chosen.tolist()],
                    bool(update.meta.defenses))
    return Reconstruction(images=recovered.contiguous(), labels=labels, history=[], iterations=0,
                          wall_seconds=time.perf_counter() - start, label_method="counts", extra=extra)


def run(config: ImprintConfig, update: SharedUpdate, model: ModelSpec, engine: Engine) -> Reconstruction:
    """The attack on the engine (a closed form: no constants, nothing to resume)."""
    return imprint_attack(update, model)


check = check_imprint  # auto's test of whether it applies (a typed GradleakError when it does not)


__all__ = ["EMPTY_BIN_TOLERANCE", "SPEC", "check", "check_imprint", "imprint_attack", "run"]
