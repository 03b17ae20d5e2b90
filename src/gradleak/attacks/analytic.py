"""Analytic recovery through a fully connected first layer (Phong et al., "Privacy-Preserving Deep
Learning via Additively Homomorphic Encryption", IEEE TIFS 2018 / ATIS 2017, Sec. 3.2; the same
observation as breaching's "analytic" attack): no optimisation."""

from __future__ import annotations

# The attack's declaration (gradleak/specs.py reads it without importing this module).
SPEC = {
    "name": "analytic",
    "summary": "closed form through a fully connected first layer (Phong et al. 2017): x = dW_i / db_i",
    "kind": "closed-form",
    "converged_below": 1e-4,   # exact when it rebuilds the input (1e-13..1e-10 measured)
    "needs": "a fully connected first layer with a bias that sees the image",
    "flags": {},
    "auto": {"order": 2},
}

import copy
import time

from typing import Any

import torch
from scipy.optimize import linear_sum_assignment
from torch import nn

from ..errors import ConfigError, ModelMismatchError, NonFiniteError
from ..fl.threats import ThreatModel
from ..fl.update import SharedUpdate
from ..models import ModelSpec
from .labels import restore_labels
from .reconstruction import Reconstruction
from .simulate import UpdateSimulator
from .verdict import relative_distance
from ..engine import Engine
from .configs import config_class

# the typed config of this attack, derived from its SPEC (attacks/configs.py)
AnalyticConfig = config_class(SPEC["name"])

# a row is used when |dL/db_i| is above this fraction of the largest |dL/db| (below, the ratio is
# dominated by rounding: rows of a ReLU layer that no sample activated are exactly 0)
ACTIVE_ABOVE = 1e-6
# two rows' candidates belong to one sample when ||x_i - x_j|| <= AGREE_BELOW ||x_i||. Measured
# (mlp, batches of 4-8, the truth's activation sets): pure rows of one sample agree to ~3e-8, while
# rows mixing the same pair of samples can agree to 5e-5..1e-3 (their weights are alike); 1e-6
# keeps the first and splits the second (a first version at 1e-3 counted such mixtures as inputs)
AGREE_BELOW = 1e-6
# rows a cluster needs to count as one separated input (a single row could be a mixture)
MIN_ROWS = 2


def first_linear(model: ModelSpec, *, attack: str = "analytic", bias: bool = True) -> str:
    """The name of the fully connected layer that sees the flattened image, checked on a forward
    pass (its input must be the image itself); ModelMismatchError naming the reason otherwise
    (``attack`` names the caller in the message; ``bias``: the layer must have one)."""
    module = model.module
    first = next(((n, m) for n, m in module.named_modules() if not list(m.children())
                  and any(True for _ in m.parameters(recurse=False))), None)
    if first is None:
        raise ModelMismatchError(f"{attack}: the model has no layer with parameters")
    name, layer = first
    if not isinstance(layer, nn.Linear) or (bias and layer.bias is None):
        what = "a fully connected layer with a bias" if bias else "a fully connected layer"
        raise ModelMismatchError(f"{attack}: the first layer {name} is {type(layer).__name__}, not {what} "
                                 "(use --model mlp, or an optimisation attack)")
    seen: list[torch.Tensor] = []
    hook = layer.register_forward_hook(lambda m, inp, out: seen.append(inp[0].detach()))
    x = torch.randn(2, *model.input_shape, generator=torch.Generator().manual_seed(0))
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            module(x)
    finally:
        hook.remove()
        module.train(was_training)
    if not seen or seen[0].shape != x.flatten(1).shape or not torch.allclose(seen[0], x.flatten(1)):
        raise ModelMismatchError(f"{attack}: the first fully connected layer {name} does not see the image itself")
    return name


def check_analytic(update: SharedUpdate, model: ModelSpec) -> str:
    """Whether the analytic attack applies (its first layer's name) or the typed error why not."""
    name = first_linear(model)
    threat = ThreatModel.from_record(update.meta.threat)
    if threat.client_threat == "fedavg" and threat.local_steps != 1:
        raise ConfigError(f"analytic: a FedAvg update over {threat.local_steps} local steps moves the first layer "
                          "between steps; the closed form needs one gradient (fedsgd, an aggregate of fedsgd clients, "
                          "or one local step)")
    threat.check_one_gradient("analytic")
    for key in (f"{name}.weight", f"{name}.bias"):
        if key not in update.gradients:
            raise ModelMismatchError(f"analytic: the update does not share {key}")
    return name


def _clusters(cand: torch.Tensor, strength: torch.Tensor) -> list[torch.Tensor]:
    """Groups of rows (indices) whose candidates agree, strongest rows first."""
    order = torch.argsort(strength, descending=True)
    cand = cand[order]
    near = torch.cdist(cand, cand) <= AGREE_BELOW * cand.norm(dim=1, keepdim=True).clamp_min(1e-30)
    free = torch.ones(len(order), dtype=torch.bool)
    groups = []
    for i in range(len(order)):
        if not free[i]:
            continue
        close = near[i] & free
        free &= ~close
        groups.append(order[close])
    return groups


# Values of one chunk of the batched vector-Jacobian products in slot_labels ([classes, logits]).
SLOT_CHUNK_VALUES = 1 << 22


def slot_labels(model: ModelSpec, update: SharedUpdate, name: str, x: torch.Tensor, slot_rows: list[torch.Tensor],
                 target: torch.Tensor, multiset: torch.Tensor) -> torch.Tensor:
    """The restored label multiset assigned to the slots: the misfit of class c on slot k is
    ||dL(x_k, c)/dy_k - K db||^2 / ||K db||^2 over the slot's pure rows (slots without pure rows
    fit every class alike).

    Only the multiset's distinct classes are scored (the assignment reads no other column), with
    one forward pass of the slots that have pure rows (train mode, as the client's batch: a
    BatchNorm layer behind the attacked layer couples the samples) and batched vector-Jacobian products:
    dL(x_k, c)/dz_k = softmax(z_k) - onehot(c) for slot k's logits, pulled back to the layer's
    output y and read at slot k. The work is one forward pass and the multiset's classes (at most
    K) per slot, whatever the number of classes of the model."""
    k = x.shape[0]
    classes, column = torch.unique(multiset, return_inverse=True)
    misfit = torch.ones(k, len(classes), dtype=torch.float64)
    if all(rows is None or len(rows) == 0 for rows in slot_rows):
        return assign_labels(misfit[:, column], multiset)
    module = copy.deepcopy(model.module).double()
    module.load_state_dict({n: t.double() if t.is_floating_point() else t for n, t in update.global_weights.items()})
    module.train()
    layer = dict(module.named_modules())[name]
    captured: list[torch.Tensor] = []
    hook = layer.register_forward_hook(lambda m, inp, out: captured.append(out))
    read = [slot for slot, rows in enumerate(slot_rows) if rows is not None and len(rows)]
    try:
        # the slots read off pure rows in one forward pass, as the client's batch was (a BatchNorm
        # layer behind the layer couples the samples: one slot alone, or with the filler slots'
        # mixtures, sees other statistics; measured on ResNet-18 behind a trap layer: labels of
        # separated slots wrong with either, right with the separated slots alone)
        logits = module(x[read])  # [separated, C]
        y = captured[0]
        p = torch.softmax(logits.detach(), dim=-1)
        step = max(1, SLOT_CHUNK_VALUES // max(1, len(read) * logits.shape[-1]))
        for at, slot in enumerate(read):
            rows = slot_rows[slot]
            want = k * (target[slot] if target.dim() == 2 else target)[rows]  # [K, H]: one target per slot (cpa)
            scale = want.pow(2).sum().clamp_min(1e-300)
            for s in range(0, len(classes), step):
                chunk = classes[s:s + step]
                v = torch.zeros(len(chunk), *logits.shape, dtype=logits.dtype)
                v[:, at] = p[at]
                v[torch.arange(len(chunk)), at, chunk] -= 1.0  # dCE(z_slot, c)/dz per class c
                got = _pullback(logits, y, v)[:, at, rows]  # [chunk, rows]
                misfit[slot, s:s + len(chunk)] = (got - want).pow(2).sum(1) / scale
    finally:
        hook.remove()
    return assign_labels(misfit[:, column], multiset)


def _pullback(logits: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """v [m, K, C] (each a gradient w.r.t. the batch's logits) -> [m, K, H] the gradients w.r.t.
    y, batched (one vmapped backward); one backward per row where an operation cannot be vmapped."""
    try:
        g = torch.autograd.grad(logits, y, grad_outputs=v, retain_graph=True, is_grads_batched=True)[0]
        return g.reshape(v.shape[0], y.shape[0], -1)
    except RuntimeError:
        return torch.stack([torch.autograd.grad(logits, y, grad_outputs=row, retain_graph=True)[0].reshape(y.shape[0], -1)
                            for row in v])


def assign_labels(cost_matrix: torch.Tensor, multiset: torch.Tensor) -> torch.Tensor:
    """Hungarian assignment of the multiset's labels to the slots (cost [slots, multiset])."""
    k = cost_matrix.shape[0]
    r, col = linear_sum_assignment(cost_matrix.numpy())
    labels = torch.empty(k, dtype=torch.long)
    labels[torch.as_tensor(r)] = multiset[torch.as_tensor(col)]
    return labels


def _separate(dw: torch.Tensor, db: torch.Tensor, rows: torch.Tensor,
              k: int) -> tuple[torch.Tensor, int, int, list[torch.Tensor | None]]:
    """A batch's K inputs from the active rows: each row's candidate x = dW_i / db_i (Phong et
    al. Sec. 3.2, exact for a row that one input alone activates), rows that agree grouped, the K
    largest pure groups (at least MIN_ROWS rows) first, then mixed groups, then blanks."""
    cand = dw[rows] / db[rows, None]
    groups = _clusters(cand, db[rows].abs())
    pure = [g for g in groups if len(g) >= MIN_ROWS]
    pure.sort(key=lambda g: -len(g))
    chosen = pure[:k]
    picks = [cand[g].mean(0) for g in chosen]
    slot_rows: list[torch.Tensor | None] = [rows[g] for g in chosen]
    rest = [g for g in groups if not any(g is c for c in chosen)]
    for g in rest[:k - len(picks)]:
        picks.append(cand[g].mean(0))
        slot_rows.append(None)
    while len(picks) < k:
        picks.append(torch.zeros_like(cand[0]))  # nothing left: a blank (mid-grey after denormalising)
        slot_rows.append(None)
    return torch.stack(picks), len(chosen), len(pure), slot_rows


def analytic(update: SharedUpdate, model: ModelSpec, *, device: str | torch.device = "cpu",
             layer: str | None = None, labeller: Any = None) -> Reconstruction:
    """The inputs read off the first fully connected layer's gradient (see the module's notes in docs/).
    ``layer``: the name of that layer when the caller has checked it (the trap attack reads the
    server's trap layer); by default the model's first layer, checked by :func:`check_analytic`.
    ``labeller``: a function with :func:`slot_labels`'s signature that assigns the restored
    label multiset to the slots of a batch (default :func:`slot_labels`)."""
    start = time.perf_counter()
    name = check_analytic(update, model) if layer is None else layer
    k = int(update.meta.batch_size)
    dw = update.gradients[f"{name}.weight"].detach().double()
    db = update.gradients[f"{name}.bias"].detach().double()
    if not (bool(torch.isfinite(dw).all()) and bool(torch.isfinite(db).all())):
        raise NonFiniteError(f"analytic: the gradient of the first layer {name} holds NaN or Inf")
    active = db.abs() > ACTIVE_ABOVE * float(db.abs().max()) if float(db.abs().max()) > 0 else db != 0
    if not bool(active.any()):
        raise ConfigError("analytic: the first layer's bias gradient is zero: the update reveals no input")
    rows = torch.nonzero(active).flatten()
    if k == 1:
        # least squares over every active row: x = sum_i db_i dW_i / sum_i db_i^2
        x = (db[rows, None] * dw[rows]).sum(0, keepdim=True) / db[rows].pow(2).sum()
        separated, clusters, slot_rows = 1, 1, [rows]
    else:
        x, separated, clusters, slot_rows = _separate(dw, db, rows, k)
    x = x.reshape(k, *model.input_shape)
    images = model.denormalize(x).clamp(0, 1).float()
    method = "idlg" if k == 1 else "counts"
    labels = restore_labels(update, model, k, method=method)
    if k > 1:
        with torch.enable_grad():
            # a one-step FedAvg update is -lr times the gradient
            threat = ThreatModel.from_record(update.meta.threat)
            grad_db = db / (-threat.local_lr) if threat.client_threat == "fedavg" else db
            labels = (labeller or slot_labels)(model, update, name, x, slot_rows, grad_db, labels)
    # the attacker's own check (verdict.py): the update the answer would produce vs the shared one
    victim = copy.deepcopy(model)
    sim = UpdateSimulator(victim, update, dtype=torch.float64, device=device)
    with torch.enable_grad():
        answer = victim.normalize(images.double().to(sim.target[0].device))
        rel = relative_distance(sim(answer, labels.to(answer.device), create_graph=False), sim.target)
    wall = time.perf_counter() - start
    extra = {"relative_gradient_distance": rel, "closed_form": True, "plateau": False, "restarts_used": 0,
             "separated": separated,
             "pure_clusters": clusters, "active_rows": int(len(rows)), "layer": name}
    if separated < k:  # what the closed form could not read off (the verdict's reason)
        extra["why_not_exact"] = f"{separated} of {k} inputs were read off alone; the other slots are mixtures"
    return Reconstruction(images=images.cpu(), labels=labels.cpu().long(), history=[{"iteration": 0, "loss": rel}],
                          iterations=0, wall_seconds=wall, label_method=method, extra=extra)


def run(config: AnalyticConfig, update: SharedUpdate, model: ModelSpec, engine: Engine) -> Reconstruction:
    """The attack on the engine (a closed form: no constants, nothing to resume)."""
    return analytic(update, model, device=engine.device)


check = check_analytic  # auto's test of whether it applies (a typed GradleakError when it does not)


__all__ = ["AGREE_BELOW", "MIN_ROWS", "SPEC", "analytic", "check", "check_analytic", "first_linear", "run"]
