"""DLG and iDLG: the two original gradient-matching attacks.

DLG (Zhu, Liu, Han, NeurIPS 2019, Algorithm 1): optimise dummy inputs x' and dummy soft labels y'
jointly so that the model's gradient on (x', y') matches the shared one in squared L2, with L-BFGS.
iDLG (Zhao, Mopuri, Bilen 2020): restore the label analytically from the sign of the classifier's
weight gradient first, then optimise the image alone.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError, GradleakError
from ..fl.update import SharedUpdate
from ..models import ModelSpec
from .base import AttackSettings, Observer, initial_images, to_pixels
from .labels import fc_weight_gradient, gradinversion_labels, idlg_label
from .loop import LoopSettings, optimise
from .objectives import squared_l2
from .reconstruction import Reconstruction
from .victim import DummyGradient

# L-BFGS, lr 1 and torch's 20 evaluations per step are DLG's settings. float64: in float32 the
# attack stalls around MSE 5e-5 (gradient differences drown in rounding); in float64 it reaches
# the paper's ~3e-6 and beyond on the sigmoid LeNet.
LBFGS_LINE_SEARCH = None
DLG_DEFAULTS = dict(iterations=60, lr=1.0, optimizer="lbfgs", dtype="float64")


def _check_fedsgd(update: SharedUpdate, attack: str) -> None:
    threat = update.meta.threat.get("name", "fedsgd")
    if threat != "fedsgd":
        raise ConfigError(f"attack {attack} matches FedSGD gradients; this update is {threat!r}")


def _run(update: SharedUpdate, model: ModelSpec, settings: AttackSettings, observer: Observer | None,
         *, restore_labels: bool, name: str) -> Reconstruction:
    _check_fedsgd(update, name)
    s = settings.with_defaults(**DLG_DEFAULTS)
    dtype = s.torch_dtype()
    device = torch.device(s.device)
    k = update.meta.batch_size
    gen = torch.Generator().manual_seed(s.seed)
    victim = DummyGradient(model, update, dtype=dtype, device=device)
    x = initial_images(model, (k, *model.input_shape), s.init, gen, dtype).to(device).requires_grad_(True)
    if restore_labels:
        fc = fc_weight_gradient(update.gradients, model.classifier_name)
        if k == 1:
            labels = torch.tensor([idlg_label(fc)])
            label_method = "idlg"
        else:  # iDLG is defined for one sample; for batches use the batch rule (GradInversion Eq. 8)
            labels = gradinversion_labels(fc, k)
            label_method = "gradinversion"
        labels = labels.to(device)
        variables = [x]
        y_soft = None
    else:
        # DLG's dummy label: N(0, 1) logits, softmax'd in the loss.
        y_soft = torch.randn((k, model.num_classes), generator=gen, dtype=dtype).to(device).requires_grad_(True)
        variables = [x, y_soft]
        label_method = "soft"

    def objective() -> torch.Tensor:
        return squared_l2(victim(x, y_soft if y_soft is not None else labels), victim.target)

    log = None
    if observer is not None:
        def log(t: int) -> None:
            observer(t, to_pixels(model, x))
    tight = dtype == torch.float64  # float64 can follow the gradient far below float32's noise floor
    loop = LoopSettings(iterations=int(s.iterations), lr=float(s.lr), optimizer=str(s.optimizer),
                        progress=s.progress, description=name,
                        lbfgs_line_search=LBFGS_LINE_SEARCH,
                        lbfgs_tolerance_grad=1e-14 if tight else 1e-7,
                        lbfgs_tolerance_change=1e-16 if tight else 1e-9)
    res = optimise(variables, objective, loop, generator=gen, on_log=log, log_every=s.log_every)
    if y_soft is not None:
        labels = y_soft.detach().argmax(dim=-1)
    with torch.enable_grad():
        final = float(squared_l2([g.detach() for g in victim(x.detach(), y_soft.detach() if y_soft is not None else labels,
                                                              create_graph=False)], victim.target))
    return Reconstruction(images=to_pixels(model, x), labels=labels.cpu().long(), history=res.history,
                          iterations=res.iterations, wall_seconds=res.wall_seconds, label_method=label_method,
                          extra={"gradient_distance": final, "optimizer": s.optimizer, "dtype": s.dtype,
                                 "lr": s.lr})


def dlg(update: SharedUpdate, model: ModelSpec, settings: AttackSettings, observer: Observer | None = None) -> Reconstruction:
    """Deep Leakage from Gradients: images and soft labels jointly."""
    return _run(update, model, settings, observer, restore_labels=False, name="dlg")


def idlg(update: SharedUpdate, model: ModelSpec, settings: AttackSettings, observer: Observer | None = None) -> Reconstruction:
    """iDLG: label from the classifier gradient's sign, then the image alone."""
    return _run(update, model, settings, observer, restore_labels=True, name="idlg")


__all__ = ["dlg", "idlg", "DLG_DEFAULTS", "GradleakError"]
