"""DLG and iDLG: the two original gradient-matching attacks.

DLG (Zhu, Liu, Han, NeurIPS 2019, Algorithm 1): optimise dummy inputs x' and dummy soft labels y'
jointly so that the model's gradient on (x', y') matches the shared one in squared L2, with L-BFGS.
iDLG (Zhao, Mopuri, Bilen 2020): restore the label analytically from the sign of the classifier's
weight gradient first, then optimise the image alone.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import torch

from ..errors import GradleakError
from ..fl.update import SharedUpdate
from ..models import ModelSpec
from ..runtime import attack_precision
from .base import AttackSettings, Observer, initial_images, to_pixels
from .labels import gradinversion_labels, idlg_label
from .engine import Engine
from .loop import LoopSettings
from .objectives import squared_l2
from .reconstruction import Reconstruction
from .simulate import UpdateSimulator, label_evidence
from .state import AttackState, StateFileError

# L-BFGS, lr 1, torch's 20 evaluations per step and 300 steps are DLG's settings: its published
# code loops 300 times (the paper's text says 1200 for images; 300 already end below the paper's
# MSE on the default job, so the code's number is kept). float64: in float32 the attack stalls
# around MSE 5e-5 (gradient differences drown in rounding); in float64 it reaches the paper's
# ~3e-6 and beyond on the sigmoid LeNet. The L-BFGS is torch's algorithm with its direction in
# compact form (lbfgs.py).
LBFGS_LINE_SEARCH = None
# A trial that stalls on a plateau is replaced by a fresh random start (at most DLG_RESTARTS times).
DLG_RESTARTS = 3
DLG_DEFAULTS = dict(iterations=300, lr=1.0, optimizer="lbfgs", dtype="float64")


STALL_PATIENCE = 10        # L-BFGS steps without any change of the loss ...
STALL_RELATIVE = 1e-6      # ... while the loss is still above this fraction of the first one


@dataclass
class DLGTrials(AttackState):
    """DLG's own state across its trials (a trial stalled on a plateau is replaced by a fresh
    start): the earlier trials' loss records, steps and time, and the best trial so far."""

    images_shape: tuple[int, ...] = field(default=(), metadata={"state": False})
    history: list = field(default_factory=list)
    wall: float = 0.0
    done: int = 0
    trials: int = 0
    best_distance: float | None = None
    best_images: torch.Tensor | None = None
    best_labels: torch.Tensor | None = None

    def validate(self) -> None:
        best = (self.best_distance, self.best_images, self.best_labels)
        if any(v is None for v in best) and not all(v is None for v in best):
            raise ValueError("DLG's saved best trial is incomplete")
        if self.best_images is not None and (tuple(self.best_images.shape) != self.images_shape
                                             or tuple(self.best_labels.shape) != self.images_shape[:1]):
            raise ValueError("DLG's saved best trial does not fit this batch")


def _stalled(history: list[dict[str, float]]) -> bool:
    """L-BFGS stuck on a saturated plateau (sigmoid LeNet, unlucky init): the loss stopped moving
    while far from zero. Only the gradient distance is used, never ground truth."""
    if len(history) < STALL_PATIENCE:
        return False
    recent = [h["loss"] for h in history[-STALL_PATIENCE:]]
    first = history[0]["loss"]
    return max(recent) - min(recent) <= 1e-12 * max(abs(recent[-1]), 1e-300) and recent[-1] > STALL_RELATIVE * first


@attack_precision
def _run(update: SharedUpdate, model: ModelSpec, settings: AttackSettings, observer: Observer | None,
         *, restore_labels: bool, name: str, restarts: int, engine: Engine | None) -> Reconstruction:
    engine = engine if engine is not None else Engine(device=settings.device, observer=observer)
    observer = engine.observer
    s = settings.with_defaults(**DLG_DEFAULTS)
    dtype = s.torch_dtype()
    device = s.torch_device()
    k = update.meta.batch_size
    victim = UpdateSimulator(model, update, dtype=dtype, device=device)  # fedsgd, fedavg or aggregate
    labels: torch.Tensor | None = None
    label_method = "soft"
    if restore_labels:
        fc = label_evidence(update, model.classifier_name)
        if k == 1:
            labels, label_method = torch.tensor([idlg_label(fc)]), "idlg"
        else:  # iDLG is defined for one sample; for batches use the batch rule (GradInversion Eq. 8)
            labels, label_method = gradinversion_labels(fc, k), "gradinversion"
        labels = labels.to(device)
    tight = dtype == torch.float64  # float64 can follow the gradient far below float32's noise floor
    loop = LoopSettings(iterations=int(s.iterations), lr=float(s.lr), optimizer=str(s.optimizer),
                        progress=s.progress, description=name, lbfgs_line_search=LBFGS_LINE_SEARCH,
                        lbfgs_tolerance_grad=1e-14 if tight else 1e-7,
                        lbfgs_tolerance_change=1e-16 if tight else 1e-9)
    # Everything outside the current trial (the attack's resumable state): earlier trials'
    # history, steps and time, the best trial so far (the trial index is the phase "trial-<r>").
    outer = DLGTrials(images_shape=(k, *model.input_shape))

    first = 0
    resuming = engine.resume_phase()
    if resuming is not None:
        match = re.fullmatch(r"trial-(\d+)", resuming)
        if match is None or int(match.group(1)) > restarts:
            raise StateFileError(f"the saved state belongs to phase {resuming!r}, not to a {name} trial")
        first = int(match.group(1))
    for trial in range(first, restarts + 1):
        outer.trials += 1
        # Trial r draws its start from seed (s.seed, r): reproducible, and trial 0 is plain DLG.
        gen = torch.Generator().manual_seed(s.seed + 1_000_003 * trial)
        x = initial_images(model, (k, *model.input_shape), s.init, gen, dtype).to(device).requires_grad_(True)
        y_soft = None
        if labels is None:
            # DLG's dummy label: N(0, 1) logits, softmax'd in the loss.
            y_soft = torch.randn((k, model.num_classes), generator=gen, dtype=dtype).to(device).requires_grad_(True)
        variables = [x] if y_soft is None else [x, y_soft]
        target_labels = y_soft if y_soft is not None else labels

        def objective() -> torch.Tensor:
            return squared_l2(victim(x, target_labels), victim.target)

        log = None
        if observer is not None:
            def log(t: int) -> None:
                observer(outer.done + t, to_pixels(model, x))
        res = engine.optimise(variables, objective, loop, generator=gen, on_log=log, log_every=s.log_every,
                       should_stop=_stalled if trial < restarts else None,
                       state=outer, phase=f"trial-{trial}")
        done = outer.done
        outer.history = [*outer.history, *({"iteration": done + h["iteration"], "loss": h["loss"], "trial": trial}
                                           for h in res.history)]
        outer.done = done + res.iterations
        outer.wall += res.wall_seconds
        with torch.enable_grad():
            dist = float(squared_l2([g.detach() for g in victim(x.detach(), target_labels.detach(), create_graph=False)],
                                    victim.target))
        trial_labels = y_soft.detach().argmax(dim=-1) if y_soft is not None else labels
        if outer.best_distance is None or (math.isfinite(dist) and not dist >= outer.best_distance):
            outer.best_distance, outer.best_images = dist, x.detach().clone()
            outer.best_labels = trial_labels.clone()
        if res.diverged is not None:
            break  # the loop gave up on this trial: the run stops here (the runner reports it)
        if not _stalled(res.history) and math.isfinite(res.final_loss):
            break
    history, done, wall, trials = outer.history, outer.done, outer.wall, outer.trials
    assert outer.best_images is not None and outer.best_labels is not None and outer.best_distance is not None
    dist, x_best, labels_best = outer.best_distance, outer.best_images.to(device, dtype), outer.best_labels.to(device)
    return Reconstruction(images=to_pixels(model, x_best), labels=labels_best.cpu().long(), history=history,
                          iterations=done, wall_seconds=wall, label_method=label_method,
                          extra={"gradient_distance": dist, "trials": trials,
                                 "resolved": {"iterations": s.iterations, "lr": s.lr, "optimizer": s.optimizer,
                                              "dtype": s.dtype}})


def dlg(update: SharedUpdate, model: ModelSpec, settings: AttackSettings, observer: Observer | None = None, *,
        restarts: int = DLG_RESTARTS, engine: Engine | None = None) -> Reconstruction:
    """Deep Leakage from Gradients: images and soft labels jointly."""
    return _run(update, model, settings, observer, restore_labels=False, name="dlg", restarts=restarts,
                engine=engine)


def idlg(update: SharedUpdate, model: ModelSpec, settings: AttackSettings, observer: Observer | None = None, *,
         restarts: int = DLG_RESTARTS, engine: Engine | None = None) -> Reconstruction:
    """iDLG: label from the classifier gradient's sign, then the image alone."""
    return _run(update, model, settings, observer, restore_labels=True, name="idlg", restarts=restarts,
                engine=engine)


__all__ = ["dlg", "idlg", "DLG_DEFAULTS", "GradleakError"]
