"""The Cocktail Party Attack (Kariyappa et al., "Cocktail Party Attack: Breaking Aggregation-Based
Privacy in Federated Learning using Independent Component Analysis", ICML 2023): the batch is
unmixed from the gradient of a fully connected first layer by blind source separation."""

from __future__ import annotations

# The attack's declaration (gradleak/specs.py reads it without importing this module).
SPEC = {
    "name": "cpa",
    "summary": "Cocktail Party Attack (Kariyappa et al. 2023): a batch unmixed from a fully connected first layer "
               "(exact peel, then ICA)",
    "kind": "closed-form",
    "converged_below": 1e-4,   # as analytic: an exact unmixing explains the update to rounding
    "needs": "a fully connected first layer (with a bias for the exact scale) that sees the image, at least as "
             "wide as the batch",
    "flags": {
        "ica_iterations": ["int[1,100000]", 400, "cpa: most FastICA iterations"],
        "ica_only": ["bool", False, "cpa: the paper's unmixing alone, without the exact peel before it "
                                    "(this project's addition)"],
    },
    "auto": {"order": 2.5},
}

import copy
import time
import warnings
from typing import Any, Callable

import numpy as np
import torch
from scipy.optimize import linprog
from sklearn.decomposition import FastICA
from sklearn.exceptions import ConvergenceWarning

from ..errors import ConfigError, ModelMismatchError, NonFiniteError, Terminated
from ..fl.threats import ThreatModel
from ..fl.update import SharedUpdate
from ..models import ModelSpec
from .analytic import slot_labels, first_linear
from .labels import restore_labels
from .reconstruction import Reconstruction
from .simulate import UpdateSimulator
from .verdict import relative_distance
from ..engine import Engine
from .configs import config_class

# the typed config of this attack, derived from its SPEC (attacks/configs.py)
CPAConfig = config_class(SPEC["name"])

# singular values of dW above this fraction of the largest count towards its rank (float32
# gradients: the K-th of a batch is ~1e-3 of the first at K = 64, the (K+1)-th ~1e-9)
RANK_ABOVE = 1e-6
# a slot's bias scale |d_k| below this fraction of the largest is not trusted (the box prior scales it)
SCALE_ABOVE = 1e-6
# the two signs' largest box scales tie within this relative difference (a source read off a float32
# gradient carries ~1e-7 relative rounding: a symmetric box must not be decided by it)
SIGN_TIE = 1e-3
# FastICA's tolerance (the change of the unmixing between iterations)
ICA_TOL = 1e-4
# a candidate input is certified when the smallest singular value of A's span on the units it
# leaves inactive is below this fraction of the largest (a true input's column of A vanishes there:
# measured 1e-8 with float32 gradients; other vertices 0.1 and more)
CERTIFY_BELOW = 1e-5
# a certified column is non-zero on every unit its input activates: above this fraction of its largest
SUPPORT_ABOVE = 1e-6
# a residual row is read when |db_r,i| is above this fraction of the largest (analytic's rule)
ACTIVE_ABOVE = 1e-6
# a row's candidate is certified only when its pixels lie in the box, within this fraction of its width
BOX_MARGIN = 0.01
# two certified inputs closer than this (relative) are one
DISTINCT_ABOVE = 1e-6
# a slot's rows for the label assignment: |K a_ik| above this fraction of its largest
ROW_ABOVE = 1e-3


def first_layer(model: ModelSpec) -> tuple[str, bool]:
    """(name, has_bias) of the fully connected layer that sees the flattened image, checked on a
    forward pass (analytic.first_linear, a bias not required); ModelMismatchError otherwise."""
    name = first_linear(model, attack="cpa", bias=False)
    return name, dict(model.module.named_modules())[name].bias is not None


def check_cpa(update: SharedUpdate, model: ModelSpec) -> str:
    """Whether the attack applies (its first layer's name) or the typed error why not: a first
    layer that is not fully connected or does not see the image, several FedAvg local steps, a
    layer narrower than the batch, an update without the layer's gradient."""
    name, has_bias = first_layer(model)
    threat = ThreatModel.from_record(update.meta.threat)
    if threat.client_threat == "fedavg" and threat.local_steps != 1:
        raise ConfigError(f"cpa: a FedAvg update over {threat.local_steps} local steps moves the first layer between "
                          "steps; the unmixing needs one gradient (fedsgd, an aggregate of fedsgd clients, or one step)")
    threat.check_one_gradient("cpa")
    keys = [f"{name}.weight"] + ([f"{name}.bias"] if has_bias else [])
    for key in keys:
        if key not in update.gradients:
            raise ModelMismatchError(f"cpa: the update does not share {key}")
    out, inp = update.gradients[keys[0]].shape
    k = int(update.meta.batch_size)
    if k > min(out, inp):
        raise ConfigError(f"cpa: {k} samples need a first layer of at least {k} units and {k} inputs "
                          f"({name} is {inp} -> {out}): its gradient has rank at most {min(out, inp)}")
    return name


class _Peel:
    """Exact inputs read off before the unmixing (docs notes, step 0). The state is the residual
    update in the K-dimensional bases of dW: dW_r = U_K m V_K, db_r = U_K d (``base_u`` [out, K],
    ``base_v`` [K, in]); ``weight``/``bias`` are the layer's own W, b (which units an input leaves
    inactive)."""

    def __init__(self, svd: tuple[torch.Tensor, torch.Tensor, torch.Tensor], db: torch.Tensor, k: int,
                 weight: torch.Tensor, bias: torch.Tensor, model: ModelSpec, poll: Callable[[], None]) -> None:
        u, s, vt = svd  # of dW
        self.poll = poll  # raises when the run was asked to stop (checked between candidates)
        self.base_u, self.base_v = u[:, :k], vt[:k]
        self.m, self.d = torch.diag(s[:k]), u[:, :k].T @ db
        self.k, self.weight, self.bias = k, weight, bias
        c, h, w = model.input_shape
        mean = torch.tensor(model.mean, dtype=db.dtype).repeat_interleave(h * w)
        std = torch.tensor(model.std, dtype=db.dtype).repeat_interleave(h * w)
        self.lo, self.hi, self.std = -mean / std, (1 - mean) / std, std
        self.found: list[torch.Tensor] = []
        self.columns: list[torch.Tensor] = []
        self.by_rows = 0
        self.seen: dict[bytes, torch.Tensor | None] = {}

    def certify(self, x: torch.Tensor) -> torch.Tensor | None:
        """alpha [K] with A's column of x = t U_K alpha when x is one of the inputs, else None: the
        column vanishes on every unit x leaves inactive, so U_K has a null vector there. Each
        activation pattern is judged once (a second row of an input taken gives the same one)."""
        inactive = self.weight @ x + self.bias <= 0
        key = inactive.numpy().tobytes()
        if key not in self.seen:
            alpha = None
            if int(inactive.sum()) >= self.k:
                _, sv, right = torch.linalg.svd(self.base_u[inactive], full_matrices=False)
                column = (self.base_u @ right[-1]).abs()
                # the column must vanish on the inactive units and nowhere else: a blend of inputs
                # whose inactive units all lie in one input's would pass the first test alone
                if float(sv[-1]) <= CERTIFY_BELOW * float(sv[0]) and \
                        bool((column[~inactive] > SUPPORT_ABOVE * float(column.max())).all()):
                    alpha = right[-1]
            self.seen[key] = alpha
            return alpha
        return None  # this pattern was judged before: not an input, or one already taken

    def take(self, x: torch.Tensor, alpha: torch.Tensor) -> bool:
        """Remove the certified input x from the residual (rank-one deflation: the scale t that
        drops the rank, t = 1 / (beta^T m^+ alpha)); False for one already taken."""
        if any(float((x - f).norm()) <= DISTINCT_ABOVE * float(f.norm()) for f in self.found):
            return False
        beta = self.base_v @ x
        t = 1.0 / float(beta @ torch.linalg.pinv(self.m, rtol=RANK_ABOVE) @ alpha)
        self.m = self.m - t * torch.outer(alpha, beta)
        self.d = self.d - t * alpha
        self.found.append(x)
        self.columns.append(t * (self.base_u @ alpha))
        return True

    def rows(self) -> int:
        """One pass over the residual's rows: a row active for one remaining input only gives it
        exactly, x = dW_r,i / db_r,i (Phong et al.'s ratio); each candidate inside the pixel box is
        certified. The number of inputs taken."""
        db_r = self.base_u @ self.d
        strong = db_r.abs() > ACTIVE_ABOVE * float(db_r.abs().max())
        rows = torch.nonzero(strong).flatten()
        rows = rows[torch.argsort(db_r[rows].abs(), descending=True)]
        cand = (self.base_u[rows] @ self.m @ self.base_v) / db_r[rows, None]
        margin = BOX_MARGIN * (self.hi - self.lo)
        inside = ((cand >= self.lo - margin) & (cand <= self.hi + margin)).all(1)
        taken = 0
        for x in cand[inside]:
            if len(self.found) >= self.k - 1:
                break
            self.poll()
            alpha = self.certify(x)
            if alpha is not None and self.take(x, alpha):
                taken += 1
        self.by_rows += taken
        return taken

    def _remaining(self) -> tuple[np.ndarray, np.ndarray]:
        """The remaining inputs' span [left, in] and g [left]: each input's coefficients c satisfy
        g^T c = 1 (the bias's affine constraint, docs notes step 3)."""
        left = self.k - len(self.found)
        um, sm, vmt = torch.linalg.svd(self.m)
        um, sm, vm = um[:, :left], sm[:left], vmt[:left].T
        return (vm.T @ self.base_v).numpy(), ((um.T @ self.d) / sm).numpy()

    def darkest(self) -> bool:
        """The darkest vertex of {x in the remaining inputs' affine span: pixels in [0, 1]} (an LP,
        scipy's HiGHS; an input with a small support is such a vertex), taken when certified."""
        span, g = self._remaining()
        result = linprog(span @ self.std.numpy(), A_ub=np.concatenate([span.T, -span.T]),
                         b_ub=np.concatenate([self.hi.numpy(), -self.lo.numpy()]), A_eq=g[None], b_eq=[1.0],
                         bounds=[(None, None)] * span.shape[0], method="highs")
        if result.status != 0:
            return False
        x = torch.from_numpy(result.x @ span)
        alpha = self.certify(x)
        return alpha is not None and self.take(x, alpha)

    def run(self) -> None:
        while len(self.found) < self.k - 1:
            self.poll()
            if not self.rows() and (len(self.found) >= self.k - 1 or not self.darkest()):
                break

    def residual(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """dW_r [out, in], db_r [out] and the right singular vectors of dW_r [K, in] (from m's SVD)."""
        return self.base_u @ self.m @ self.base_v, self.base_u @ self.d, torch.linalg.svd(self.m)[2] @ self.base_v


def no_stop() -> None:
    """The poll of a run nobody can stop (the API without an engine)."""


def stop_poll(engine: Any) -> Callable[[], None]:
    """A poll for the engine's stop request: it raises :class:`gradleak.errors.Terminated` (exit
    128 + the signal) once SIGINT/SIGTERM reached the engine's session. The loop checks the same
    flag after each step (engine/loop.py); a closed form calls this between its phases and inside
    its own loops (the peel's candidates), where a signal that only set the flag was lost before."""
    session = getattr(engine, "session", None)

    def poll() -> None:
        signum = getattr(session, "interrupted", None)
        if signum is not None:
            raise Terminated(int(signum))
    return poll


def _unmix(v: torch.Tensor, k: int, seed: int, iterations: int) -> tuple[torch.Tensor, int, bool]:
    """FastICA (logcosh) on the K-dimensional span: v [K, in] -> the sources S_hat [K, in]
    (uncentred, arbitrary sign and scale), its iterations, whether it converged. One call: run in
    chunks restarted from the last unmixing (``w_init``), it converged no more (16 CIFAR-10
    photos: 92 iterations in one call, not converged in 400 restarted every 10 or 30)."""
    if k == 1:
        return v.clone(), 0, True
    # Sec. 4.2, Eq. 5-6: negentropy with G(u) = log cosh(u); the symmetric decorrelation plays Eq. 7
    ica = FastICA(n_components=k, whiten="unit-variance", fun="logcosh", max_iter=iterations, tol=ICA_TOL,
                  random_state=seed)
    x = v.T.numpy()  # [in, K]: each pixel one observation of the K mixtures
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        ica.fit(x)
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    sources = torch.from_numpy(x @ ica.components_.T).T.contiguous()  # B V_K, uncentred
    return sources, int(ica.n_iter_), converged


def _box_scale(s: torch.Tensor, model: ModelSpec) -> torch.Tensor:
    """The box prior's signed scale t per slot: the largest |t| with denormalize(t s) in [0, 1]
    (per channel: pixel = std x + mean), the sign whose largest scale is larger, a tie (within
    SIGN_TIE) going to the image with more black pixels (at the box's lower bound), then to the
    darker majority. s [K, C, H, W] -> t [K]."""
    mean = torch.tensor(model.mean, dtype=s.dtype).view(1, -1, 1, 1)
    std = torch.tensor(model.std, dtype=s.dtype).view(1, -1, 1, 1)
    lo, hi = (-mean / std).expand_as(s), ((1 - mean) / std).expand_as(s)  # the box in input space
    tiny = torch.finfo(s.dtype).tiny

    def largest(sign: float) -> torch.Tensor:
        u = sign * s
        up = torch.where(u > 0, hi / u.clamp_min(tiny), torch.full_like(u, torch.inf))
        down = torch.where(u < 0, lo / u.clamp_max(-tiny), torch.full_like(u, torch.inf))
        t = torch.minimum(up, down).flatten(1).min(1).values
        return torch.where(torch.isfinite(t), t, torch.zeros_like(t))

    plus, minus = largest(1.0), largest(-1.0)
    image, flipped, low, high = plus[:, None] * s.flatten(1), -minus[:, None] * s.flatten(1), lo.flatten(1), hi.flatten(1)
    black_at = low + SIGN_TIE * (high - low)
    black = (image <= black_at).sum(1) - (flipped <= black_at).sum(1)
    darker = torch.where(black != 0, black > 0, (image < (low + high) / 2).double().mean(1) >= 0.5)
    tie = (plus - minus).abs() <= SIGN_TIE * torch.maximum(plus, minus).clamp_min(tiny)
    use_plus = torch.where(tie, darker, plus > minus)
    return torch.where(use_plus, plus, -minus)


def _scale(dw: torch.Tensor, db: torch.Tensor | None, sources: torch.Tensor,
           model: ModelSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inputs x [K, in] from the unmixed sources, the estimated mixing columns a_k [out, K]
    of x_k (dW = sum_k a_k x_k^T), and which slots the bias scaled [K] (docs notes, step 3)."""
    k = sources.shape[0]
    mixing = dw @ torch.linalg.pinv(sources)  # A_hat [out, K]: the columns of S_hat
    # sign and scale from the bias: db = sum_k a_k = A_hat d, x_k = S_hat_k / d_k
    d = torch.zeros(k, dtype=dw.dtype)
    if db is not None:
        d = torch.linalg.lstsq(mixing, db[:, None]).solution[:, 0]
    largest = float(d.abs().max())
    from_bias = d.abs() > SCALE_ABOVE * largest if largest > 0 else torch.zeros(k, dtype=torch.bool)
    box = _box_scale(sources.reshape(k, *model.input_shape), model)  # x = t S_hat
    factor = torch.where(from_bias, 1.0 / torch.where(from_bias, d, torch.ones_like(d)), box)
    x = sources * factor[:, None]
    usable = factor != 0
    a = torch.where(usable[None, :], mixing / torch.where(usable, factor, torch.ones_like(factor))[None, :],
                    torch.zeros_like(mixing))
    return x, a, from_bias


def _first_layer(update: SharedUpdate, name: str, k: int) -> tuple[torch.Tensor, Any, tuple, int]:
    """The first layer's weight and bias gradients, the SVD of dW and its rank, checked against
    the claimed batch (Eq. 2: dW = A S mixes the K inputs; Sec. 4.1: V_K spans the sources)."""
    dw = update.gradients[f"{name}.weight"].detach().double().cpu()
    bias = update.gradients.get(f"{name}.bias")
    db = bias.detach().double().cpu() if bias is not None else None
    if not bool(torch.isfinite(dw).all()) or (db is not None and not bool(torch.isfinite(db).all())):
        raise NonFiniteError(f"cpa: the gradient of the first layer {name} holds NaN or Inf")
    u, s, vt = torch.linalg.svd(dw, full_matrices=False)  # the one SVD of dW (the peel reuses it)
    if float(s[0]) == 0:
        raise ConfigError("cpa: the first layer's gradient is zero: the update reveals no input")
    rank = int((s > RANK_ABOVE * s[0]).sum())
    if rank < k:
        raise ConfigError(f"cpa: the update claims a batch of {k} but the gradient of its first layer {name} has rank "
                          f"{rank}: it holds at most {rank} distinct inputs (metadata that does not match the "
                          "tensors, or repeated inputs)")
    return dw, db, (u, s, vt), rank


def _slot_labels(update: SharedUpdate, threat: ThreatModel, model: ModelSpec, name: str, images: torch.Tensor,
                 a: torch.Tensor, all_exact: bool, labels: torch.Tensor) -> tuple[torch.Tensor, str]:
    """Each slot's label from its share of the bias gradient (its column a_k of the mixing
    matrix), with how it was chosen."""
    k = len(images)
    # slot k's share of the bias gradient (a one-step FedAvg update is -lr times the gradient)
    target = a.T / (-threat.local_lr if threat.client_threat == "fedavg" else 1.0)
    rows = [torch.nonzero(t.abs() > ROW_ABOVE * float(t.abs().max())).flatten() if float(t.abs().max()) > 0
            else None for t in target]
    # every slot read off exactly (its column a_k too): each slot's own best class, free of the
    # multiset (whose counts are estimates); otherwise the multiset, assigned
    choices = torch.arange(model.num_classes).repeat(k) if all_exact else labels
    with torch.enable_grad():
        return (slot_labels(model, update, name, model.normalize(images.double()), rows, target, choices),
                "per-slot columns" if all_exact else "counts")


def cpa(update: SharedUpdate, model: ModelSpec, *, seed: int = 0, ica_iterations: int = 400,
        peel: bool = True, device: str | torch.device = "cpu", poll: Callable[[], None] = no_stop) -> Reconstruction:
    """The batch unmixed from the first fully connected layer's gradient (see the module's notes in docs/).
    Returns K = update.meta.batch_size slots, pixels in [0, 1], the labels assigned to them.
    ``peel`` False: the paper's unmixing alone (steps 1-3), without step 0. ``poll`` raises to
    stop the run (:func:`stop_poll`); it is called between the phases and the peel's candidates.

    ConfigError (before the peel and the unmixing, whose cost grows with K) when the gradient's
    rank is below K: it carries at most that many distinct inputs, so a larger batch is a claim
    the update does not back (metadata that does not match the tensors, or repeated inputs)."""
    start = time.perf_counter()
    name = check_cpa(update, model)
    k = int(update.meta.batch_size)
    dw, db, (u, s, vt), rank = _first_layer(update, name, k)
    found: list[torch.Tensor] = []
    columns: list[torch.Tensor] = []
    by_rows = 0
    residual_w, residual_b = dw, db
    layer_w, layer_b = update.global_weights.get(f"{name}.weight"), update.global_weights.get(f"{name}.bias")
    if peel and db is not None and k > 1 and layer_w is not None and layer_b is not None:
        peel = _Peel((u, s, vt), db, k, layer_w.detach().double().cpu(), layer_b.detach().double().cpu(), model, poll)
        peel.run()
        found, columns, by_rows = peel.found, peel.columns, peel.by_rows
        residual_w, residual_b, vt = peel.residual()
    left = k - len(found)
    poll()
    sources, iterations, converged = _unmix(vt[:left], left, seed, ica_iterations)
    poll()
    x, a, from_bias = _scale(residual_w, residual_b, sources, model)
    if found:
        x = torch.cat([torch.stack(found), x])
        a = torch.cat([torch.stack(columns, 1), a], 1)
        from_bias = torch.cat([torch.ones(len(found), dtype=torch.bool), from_bias])
    x = x.reshape(k, *model.input_shape)
    images = model.denormalize(x).clamp(0, 1).float()
    labels = restore_labels(update, model, k, method="counts")
    label_method = "counts"
    threat = ThreatModel.from_record(update.meta.threat)
    poll()
    if k > 1 and db is not None:
        labels, label_method = _slot_labels(update, threat, model, name, images, a, len(found) == k - 1, labels)
    poll()
    victim = copy.deepcopy(model)
    sim = UpdateSimulator(victim, update, dtype=torch.float64, device=device)
    with torch.enable_grad():
        answer = victim.normalize(images.double().to(sim.target[0].device))
        rel = relative_distance(sim(answer, labels.to(answer.device), create_graph=False), sim.target)
    extra = {"relative_gradient_distance": rel, "closed_form": True, "plateau": False, "restarts_used": 0,
             "layer": name,
             "components": k, "rank": rank, "ica": "sklearn FastICA (logcosh)", "ica_iterations": iterations,
             "ica_converged": converged, "exact_inputs": len(found), "exact_by_rows": by_rows,
             "scale_from_bias": int(from_bias.sum()), "scale": "bias" if db is not None else "box prior (no bias)"}
    return Reconstruction(images=images.cpu(), labels=labels.cpu().long(), history=[{"iteration": 0, "loss": rel}],
                          iterations=0, wall_seconds=time.perf_counter() - start, label_method=label_method, extra=extra)


def run(config: CPAConfig, update: SharedUpdate, model: ModelSpec, engine: Engine) -> Reconstruction:
    """The attack on the engine (a closed form: nothing to resume)."""
    return cpa(update, model, seed=int(config.seed), ica_iterations=int(config.ica_iterations),
               peel=not bool(config.ica_only), device=engine.device, poll=stop_poll(engine))


check = check_cpa  # auto's test of whether it applies (a typed GradleakError when it does not)


__all__ = ["SPEC", "check", "check_cpa", "cpa", "first_layer", "no_stop", "run", "stop_poll"]
