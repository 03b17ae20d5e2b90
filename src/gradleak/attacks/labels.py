"""Label restoration from the classifier's gradient (no optimisation needed)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..errors import GradleakError

if TYPE_CHECKING:
    from ..fl.update import SharedUpdate
    from ..models import ModelSpec


def fc_weight_gradient(gradients: dict[str, torch.Tensor], classifier_name: str) -> torch.Tensor:
    """The FC layer's weight gradient, [N classes, M features] (torch's Linear layout)."""
    key = f"{classifier_name}.weight" if classifier_name else "weight"
    if key not in gradients:
        raise GradleakError(f"the update holds no gradient for the classifier weight {key!r}")
    return gradients[key]


def idlg_label(fc_grad: torch.Tensor) -> int:
    """iDLG (Zhao et al. 2020), one sample: with non-negative FC inputs, the gradient row of the
    true class is the only one with a negative sum (Eq. 6 of GradInversion with K = 1)."""
    return int(fc_grad.sum(dim=1).argmin())


def sum_rule_labels(fc_grad: torch.Tensor, k: int) -> torch.Tensor:
    """iDLG's sum rule extended to batches (GradInversion Eq. 7): s_n = sum_m dW_{m,n};
    the K most negative entries of s are the labels (assumes no repeats). Returns [K]."""
    s = fc_grad.sum(dim=1)
    return torch.argsort(s)[:k].sort().values


def gradinversion_labels(fc_grad: torch.Tensor, k: int) -> torch.Tensor:
    """GradInversion Eq. 8: argsort(min_m dW_{m,n})[:K] (assumes no repeats). Returns [K]."""
    s = fc_grad.min(dim=1).values
    return torch.argsort(s)[:k].sort().values


LABEL_METHODS = ("gradinversion", "sum", "counts", "llg", "idlg")
#: The rules that return K distinct classes (Eq. 7, Eq. 8): exact only when no label repeats.
DISTINCT_METHODS = ("gradinversion", "sum")


def effective_label_method(update: "SharedUpdate", method: str) -> str:
    """The rule restore_labels applies: a distinct-class rule becomes "counts" on an aggregate of
    several clients, whose batches are drawn independently (two clients may hold the same class,
    as in a real federation), so the averaged update's labels can repeat."""
    from ..fl.threats import ThreatModel

    if method in DISTINCT_METHODS and ThreatModel.from_record(update.meta.threat).clients > 1:
        return "counts"
    return method


def label_gradients(update: "SharedUpdate", classifier_name: str) -> dict[str, torch.Tensor]:
    """The shared tensors label restoration reads, signed like gradients: the gradients for
    FedSGD (and an aggregate of FedSGD clients), and for FedAvg the classifier's -(W_S - W_0)
    (local SGD moves the weights against the sum of the step gradients, so the signs and the
    relative magnitudes the rules use are those of a sum of gradients)."""
    from ..fl.threats import ThreatModel

    if ThreatModel.from_record(update.meta.threat).client_threat != "fedavg":
        return update.gradients
    prefix = f"{classifier_name}." if classifier_name else ""
    out = dict(update.gradients)
    for key in (f"{prefix}weight", f"{prefix}bias"):
        if key in out:
            out[key] = -out[key]
    return out


def restore_labels(update: "SharedUpdate", model: "ModelSpec", k: int | None = None,
                   method: str = "gradinversion") -> torch.Tensor:
    """The batch's labels [K] (int64, sorted) from the shared classifier gradient, no optimisation.

    method (on an aggregate of several clients a distinct-class rule is read as "counts":
    effective_label_method):
      "gradinversion"  Eq. 8, K distinct classes (the paper's rule; assumes no repeats)
      "sum"            Eq. 7, iDLG's sum rule extended to batches, K distinct classes
      "counts"         label multiset with repeats (label_counts.count_labels, bias-corrected
                       proportional counts); with no repeats it agrees with the sign rule
      "llg"            label multiset, Wainakh et al.'s LLG-style impact subtraction
      "idlg"           iDLG, K = 1 only
    """
    from ..errors import ConfigError
    from .label_counts import classifier_signal, count_labels, llg_counts

    k = int(update.meta.batch_size if k is None else k)
    method = effective_label_method(update, method)
    if k < 1:
        raise ConfigError(f"labels: batch size must be >= 1, got {k}")
    gradients = label_gradients(update, model.classifier_name)
    fc = fc_weight_gradient(gradients, model.classifier_name).detach()
    if k > fc.shape[0] and method in ("gradinversion", "sum"):
        raise ConfigError(f"labels: method {method!r} returns distinct classes but the batch has {k} "
                          f"samples and the model only {fc.shape[0]} classes; use 'counts'")
    if method == "gradinversion":
        out = gradinversion_labels(fc, k)
    elif method == "sum":
        out = sum_rule_labels(fc, k)
    elif method in ("counts", "llg"):
        signal = classifier_signal(gradients, model.classifier_name)[0]
        rule = count_labels if method == "counts" else llg_counts
        out = rule(signal, k, presence=fc.min(dim=1).values)
    elif method == "idlg":
        if k != 1:
            raise ConfigError(f"labels: 'idlg' restores one sample's label; the batch has {k} (use 'gradinversion')")
        out = torch.tensor([idlg_label(fc)])
    else:
        raise ConfigError(f"labels: unknown method {method!r}; known: {', '.join(LABEL_METHODS)}")
    return out.long().cpu()
