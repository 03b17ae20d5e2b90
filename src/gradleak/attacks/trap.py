"""The trap-weights attack ("When the Curious Abandon Honesty", Boenisch et al., EuroS&P 2023):
analytic, no optimisation."""

from __future__ import annotations

# The attack's declaration (gradleak/specs.py reads it without importing this module).
SPEC = {
    "name": "trap",
    "summary": "a malicious server's trap weights (Boenisch et al., EuroS&P 2023): inputs read off rows one sample fired",
    "kind": "closed-form",
    "converged_below": 1e-3,   # exact answers measured 1e-12..1.6e-4 (ResNet-18, float32 updates), mixtures 0.3-2
    "needs": "a model carrying the server's trap layer (--server trap)",
    "flags": {},
    "auto": {"order": 1},
}

import copy
import math
from typing import Any, Callable

import torch

from ..errors import ConfigError, ModelMismatchError, NonFiniteError
from ..fl.threats import ThreatModel
from ..fl.update import SharedUpdate
from ..models import ModelSpec
from .analytic import ACTIVE_ABOVE, assign_labels, analytic
from .cpa import no_stop, stop_poll
from .reconstruction import Reconstruction
from ..engine import Engine
from .configs import config_class

# the typed config of this attack, derived from its SPEC (attacks/configs.py)
TrapConfig = config_class(SPEC["name"])

LAYER = "trap.linear0"
W0, B0, W2 = f"{LAYER}.weight", f"{LAYER}.bias", "trap.linear2.weight"

# The server's rows must look the way trap rows do: in pixel space, most rows have a negative sum
# (their positive entries were scaled down). A layer whose rows do not lean negative is no trap: an
# honest layer's rows have sums of either sign, half of them negative give or take the sampling
# (2000 N(0, 1) rows: 0.5 +- 0.011, so a line at 0.5 was a coin flip), at most 0.55 on the honest
# layers benchmarks/inspect_models.json measured; the server's default trap 0.90, a trap firing at
# a rate of 1/4 0.78 (fl/inspect.py's TRAP_NEGATIVE draws the same line). A "trap" firing for 40 %
# of the images (0.595) is refused: at that rate its rows rarely hold one sample of a batch anyway
# (use the analytic attack on such a layer).
NEGATIVE_ROWS_ABOVE = 0.6

# The attack compares every active row's candidate with every other (analytic.py's clustering: a
# rows x rows float64 distance matrix): more active rows than fit in this many bytes are refused
# before it is allocated (1 GiB: 11585 rows; the server's default layer has at most 2000).
MAX_PAIRWISE_BYTES = 1 << 30

MISSING_LAYER = ("trap: the update was not computed on a model with the server's trap layer "
                 "(share with --server trap)")


def _pixel_row_sums(weight: torch.Tensor, model: ModelSpec) -> torch.Tensor:
    """Each row's sum seen on pixels: for x = (x_pix - mean) / std, W x = (W / std) x_pix - W (mean / std),
    so row i sums to W_i . (1 / std): one matrix-vector product, no copy of the layer (891 x 150528
    entries at 224 px)."""
    c = len(model.std)
    hw = weight.shape[1] // c
    inv_std = 1.0 / torch.tensor(model.std, dtype=weight.dtype, device=weight.device).repeat_interleave(hw)
    return weight @ inv_std


def check_trap(update: SharedUpdate, model: ModelSpec) -> str:
    """Refuse an update the trap attack cannot read (typed errors, one line each):
    ModelMismatchError without the server's trap layer, with one of another shape, or with rows that
    do not lean negative; NonFiniteError for NaN/Inf in it; ConfigError for FedAvg with several
    local steps. Returns the layer's name."""
    for key, where in ((W0, update.gradients), (B0, update.gradients), (W0, update.global_weights),
                       (B0, update.global_weights), (W2, update.global_weights)):
        if key not in where:
            raise ModelMismatchError(MISSING_LAYER if key == W0 else
                                     f"trap: the update holds no {key!r} (share with --server trap)")
    d = 1
    for v in model.input_shape:
        d *= int(v)
    weight = update.global_weights[W0]
    if weight.ndim != 2 or weight.shape[1] != d:
        raise ModelMismatchError(f"trap: the trap layer's weight is {tuple(weight.shape)}, expected [rows, {d}] "
                                 f"for images {tuple(model.input_shape)}")
    n = int(weight.shape[0])
    for label, where in (("global weight", update.global_weights), ("gradient", update.gradients)):
        for key, shape in ((W0, (n, d)), (B0, (n,))):
            t = where[key]
            if tuple(t.shape) != shape:
                raise ModelMismatchError(f"trap: {label} {key!r} is {tuple(t.shape)}, expected {list(shape)}")
            if not bool(torch.isfinite(t).all()):
                raise NonFiniteError(f"trap: {label} {key!r} holds NaN or Inf")
    threat = ThreatModel.from_record(update.meta.threat)  # ConfigError on a malformed record
    if threat.client_threat == "fedavg" and threat.local_steps > 1:
        raise ConfigError(f"trap: FedAvg with {threat.local_steps} local steps is not supported: the trap layer "
                          "moves between the steps (one local step, FedSGD or an aggregate of them)")
    threat.check_one_gradient("trap")
    negative = float((_pixel_row_sums(weight.detach(), model) < 0).double().mean())
    if negative <= NEGATIVE_ROWS_ABOVE:
        raise ModelMismatchError(f"trap: only {negative:.0%} of the layer's rows lean negative on pixels: "
                                 "not the server's trap weights")
    check_active_rows(update.gradients[B0])
    return LAYER


def check_active_rows(bias_grad: torch.Tensor) -> int:
    """The number of active rows (|db_j| above analytic.ACTIVE_ABOVE of the largest), or a
    ConfigError when comparing them pairwise would take more than MAX_PAIRWISE_BYTES: a layer
    whose rows nearly all fire holds few inputs alone, and the comparison's cost is quadratic."""
    db = bias_grad.detach().abs()
    largest = float(db.max()) if db.numel() else 0.0
    active = int((db > ACTIVE_ABOVE * largest).sum()) if largest > 0 else 0
    limit = math.isqrt(MAX_PAIRWISE_BYTES // 8)
    if active > limit:
        raise ConfigError(f"trap: {active} of the trap layer's {db.numel()} rows are active: comparing them pairwise "
                          f"needs {active * active * 8 / 2 ** 30:.1f} GiB (at most {limit} active rows); a trap "
                          "layer whose rows fire this often holds few inputs alone (share with fewer rows or a lower "
                          "rate)")
    return active


def classifier_labels(model: ModelSpec, update: SharedUpdate, name: str, x: torch.Tensor,
                      slot_rows: list[torch.Tensor | None], target: torch.Tensor, multiset: torch.Tensor) -> torch.Tensor:
    """The label multiset assigned to the slots from the classifier's weight gradient: one
    forward pass, no backward (analytic.py's per-slot pullbacks cost K x classes backward passes:
    ~45 s for 8 slots of ResNet-18 here).

    For a classifier z = V h + c and the mean cross-entropy over the K samples,
    dL/dV = (1/K) sum_k (p_k - e_{y_k}) h_k^T (iDLG's observation, per sample), so
    T = sum_k p_k h_k^T - K dL/dV has row c = sum_{k: y_k = c} h_k: the features of the samples of
    class c. The slots read off pure rows are run through the model together (train mode, as the
    client's batch); the coefficients a_ck of T_c = sum_k a_ck h_k (least squares over the slots'
    features) are 1 for the slots of class c and 0 elsewhere when the answer is exact, repeated
    classes included (a first version scored ||T_c - h_k||, which fails on repeated labels);
    slot k's misfit with class c is (1 - a_ck)^2 and the Hungarian solver assigns the multiset. ``target`` (the layer's bias gradient) is not read; the classifier's gradient
    is taken in gradient units (a one-step FedAvg update divided by -lr)."""
    k = x.shape[0]
    read = [slot for slot, rows in enumerate(slot_rows) if rows is not None and len(rows)]
    classes, column = torch.unique(multiset, return_inverse=True)
    misfit = torch.ones(k, len(classes), dtype=torch.float64)
    key = f"{model.classifier_name}.weight"
    if not read or key not in update.gradients:
        return assign_labels(misfit[:, column], multiset)
    module = copy.deepcopy(model.module).double()
    module.load_state_dict({n: t.double() if t.is_floating_point() else t for n, t in update.global_weights.items()})
    module.train()
    classifier = dict(module.named_modules())[model.classifier_name]
    seen: list[torch.Tensor] = []
    hook = classifier.register_forward_hook(lambda m, inp, out: seen.append(inp[0].detach()))
    try:
        with torch.no_grad():
            p = torch.softmax(module(x[read].double()), dim=-1)
    finally:
        hook.remove()
    h = seen[0].flatten(1)  # [read, F]
    dv = update.gradients[key].detach().double().cpu()
    threat = ThreatModel.from_record(update.meta.threat)
    if threat.client_threat == "fedavg":  # one local step: W_1 - W_0 = -lr grad
        dv = dv / (-threat.local_lr)
    t = p.T @ h - k * dv  # [C, F]: row c = the sum of the features of class c's samples
    # T_c = sum_k a_ck h_k with a_ck = 1 when slot k holds class c: solved for a by least squares
    # over the slots' features (exact when they are independent), so a class held by several
    # samples is explained by their sum; the misfit of slot k with class c is (1 - a_ck)^2
    a = torch.linalg.lstsq(h.T, t[classes].T).solution  # [read, classes]
    misfit[read] = (1.0 - a).pow(2)
    return assign_labels(misfit[:, column], multiset)


def trap_attack(update: SharedUpdate, model: ModelSpec, *, device: str | torch.device = "cpu",
                poll: Callable[[], None] = no_stop) -> Reconstruction:
    """Rebuild the client's images from the trap layer's gradient (see the module's notes in docs/). ``model``:
    the trapped spec (gradleak.models.trap.trap_model), as the update file rebuilds it. extra:
    "separated" (inputs at least two rows agree on, at most K), "pure_clusters", "active_rows",
    "trap_rows", "exact" (every slot separated and no defense recorded: the attacker's own claim).
    ``poll`` raises to stop the run (cpa.stop_poll): called between the attack's phases."""
    layer = check_trap(update, model)
    poll()

    def labeller(*args: Any) -> torch.Tensor:  # the labels' forward pass between two polls
        poll()
        labels = classifier_labels(*args)
        poll()
        return labels

    rec = analytic(update, model, device=device, layer=layer, labeller=labeller)
    poll()
    k = int(update.meta.batch_size)
    rec.extra["trap_rows"] = int(update.global_weights[W0].shape[0])
    rec.extra["exact"] = rec.extra["separated"] == k and not update.meta.defenses
    if rec.extra["separated"] < k:
        rec.extra["why_not_exact"] = (f"{rec.extra['separated']} of {k} inputs were alone on at least two rows; "
                                      "the other slots are mixtures")
    return rec


def run(config: TrapConfig, update: SharedUpdate, model: ModelSpec, engine: Engine) -> Reconstruction:
    """The attack on the engine (a closed form: no constants, nothing to resume)."""
    return trap_attack(update, model, device=engine.device, poll=stop_poll(engine))


check = check_trap  # auto's test of whether it applies (a typed GradleakError when it does not)


__all__ = ["LAYER", "MAX_PAIRWISE_BYTES", "SPEC", "check", "check_active_rows", "check_trap", "run", "trap_attack"]
