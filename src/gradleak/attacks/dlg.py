"""DLG and iDLG: the two original gradient-matching attacks.

DLG (Zhu, Liu, Han, NeurIPS 2019, Algorithm 1): optimise dummy inputs x' and dummy soft labels y'
jointly so that the model's gradient on (x', y') matches the shared one in squared L2, with L-BFGS.
iDLG (Zhao, Mopuri, Bilen 2020): restore the label analytically from the sign of the classifier's
weight gradient first, then optimise the image alone.
"""

from __future__ import annotations

import math
import re

import torch

from ..errors import GradleakError
from ..fl.update import SharedUpdate
from ..models import ModelSpec
from ..runtime import attack_precision
from .base import AttackSettings, Observer, initial_images, to_pixels
from .labels import gradinversion_labels, idlg_label
from .loop import LoopSettings, optimise
from .objectives import squared_l2
from .reconstruction import Reconstruction
from .simulate import UpdateSimulator, label_evidence
from .state import StateFileError, StateHooks, resume_phase

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
         *, restore_labels: bool, name: str, restarts: int) -> Reconstruction:
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
    # Everything outside the current trial (resumable runs, state.py): earlier trials' history,
    # steps and time, the best trial so far, and the trial index (the phase "trial-<r>").
    outer: dict[str, object] = {"history": [], "best": None, "wall": 0.0, "done": 0, "trials": 0}

    def get_state() -> dict[str, object]:
        best = outer["best"]
        return {**outer, "best": None if best is None else {"distance": best[0], "images": best[1], "labels": best[2]}}

    def set_state(state: dict[str, object]) -> None:
        best = state.get("best")
        ok = (isinstance(state.get("history"), list) and isinstance(state.get("wall"), float)
              and isinstance(state.get("done"), int) and isinstance(state.get("trials"), int))
        if best is not None:
            ok = ok and isinstance(best, dict) and isinstance(best.get("distance"), float) \
                and isinstance(best.get("images"), torch.Tensor) and best["images"].shape == (k, *model.input_shape) \
                and isinstance(best.get("labels"), torch.Tensor) and best["labels"].shape == (k,)
        if not ok:
            raise ValueError("DLG's saved trial state is malformed")
        outer.update(history=list(state["history"]), wall=state["wall"], done=state["done"], trials=state["trials"],
                     best=None if best is None else (best["distance"], best["images"].to(device, dtype),
                                                     best["labels"].to(device)))

    first = 0
    resuming = resume_phase()
    if resuming is not None:
        match = re.fullmatch(r"trial-(\d+)", resuming)
        if match is None or int(match.group(1)) > restarts:
            raise StateFileError(f"the saved state belongs to phase {resuming!r}, not to a {name} trial")
        first = int(match.group(1))
    for trial in range(first, restarts + 1):
        outer["trials"] = int(outer["trials"]) + 1  # type: ignore[call-overload]
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
                observer(int(outer["done"]) + t, to_pixels(model, x))  # type: ignore[call-overload]
        res = optimise(variables, objective, loop, generator=gen, on_log=log, log_every=s.log_every,
                       should_stop=_stalled if trial < restarts else None,
                       state=StateHooks(get_state, set_state), phase=f"trial-{trial}")
        done = int(outer["done"])  # type: ignore[call-overload]
        outer["history"] = [*outer["history"],  # type: ignore[misc]
                            *({"iteration": done + h["iteration"], "loss": h["loss"], "trial": trial}
                              for h in res.history)]
        outer["done"] = done + res.iterations
        outer["wall"] = float(outer["wall"]) + res.wall_seconds  # type: ignore[arg-type]
        with torch.enable_grad():
            dist = float(squared_l2([g.detach() for g in victim(x.detach(), target_labels.detach(), create_graph=False)],
                                    victim.target))
        trial_labels = y_soft.detach().argmax(dim=-1) if y_soft is not None else labels
        best = outer["best"]
        if best is None or (math.isfinite(dist) and not dist >= best[0]):  # type: ignore[index]
            outer["best"] = (dist, x.detach().clone(), trial_labels.clone())
        if res.diverged is not None:
            break  # the loop gave up on this trial: the run stops here (the runner reports it)
        if not _stalled(res.history) and math.isfinite(res.final_loss):
            break
    best = outer["best"]
    history, done, wall, trials = outer["history"], outer["done"], outer["wall"], outer["trials"]
    assert best is not None
    dist, x_best, labels_best = best
    return Reconstruction(images=to_pixels(model, x_best), labels=labels_best.cpu().long(), history=history,
                          iterations=done, wall_seconds=wall, label_method=label_method,
                          extra={"gradient_distance": dist, "trials": trials,
                                 "resolved": {"iterations": s.iterations, "lr": s.lr, "optimizer": s.optimizer,
                                              "dtype": s.dtype}})


def dlg(update: SharedUpdate, model: ModelSpec, settings: AttackSettings, observer: Observer | None = None) -> Reconstruction:
    """Deep Leakage from Gradients: images and soft labels jointly."""
    return _run(update, model, settings, observer, restore_labels=False, name="dlg", restarts=DLG_RESTARTS)


def idlg(update: SharedUpdate, model: ModelSpec, settings: AttackSettings, observer: Observer | None = None) -> Reconstruction:
    """iDLG: label from the classifier gradient's sign, then the image alone."""
    return _run(update, model, settings, observer, restore_labels=True, name="idlg", restarts=DLG_RESTARTS)


__all__ = ["dlg", "idlg", "DLG_DEFAULTS", "GradleakError"]
