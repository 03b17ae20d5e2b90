"""SharedUpdate: what leaves the client, and its safetensors + JSON file format.

It holds tensors and public metadata only: never the data, never the labels.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..paths import atomic_write_bytes  # noqa: F401  re-exported (fl.update.atomic_write_bytes)

FORMAT = "gradleak.shared-update"
FORMAT_VERSION = 1


@dataclass
class UpdateMeta:
    """Public metadata of a shared update (what a server knows anyway).

    threat: {"name": "fedsgd"} or, for later threat models, their public hyper-parameters
            (fedavg: local steps, mini-batch size, lr, and, where not plain SGD, the optimizer and
            its constants, epochs, augmentation policy: fl.threats.ThreatModel.record).
    """

    model: str
    num_classes: int
    input_shape: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    batch_size: int
    loss: float
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    threat: dict[str, Any] = field(default_factory=lambda: {"name": "fedsgd"})
    defenses: list[str] = field(default_factory=list)
    bn_statistics_shared: bool = False
    # the BatchNorm running statistics (buffers) after local training: gradleak's clients share
    # only parameters (gradients or W_S - W_0), never them
    bn_buffers_shared: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["input_shape"] = list(self.input_shape)
        d["mean"], d["std"] = list(self.mean), list(self.std)
        return d


@dataclass
class SharedUpdate:
    """What a client shares, as the server receives it.

    gradients:      parameter name -> tensor shaped like the parameter. FedSGD: the gradient of
                    the mean loss over the batch.
    global_weights: state-dict key -> tensor: the model the client received (parameters and
                    buffers, e.g. BatchNorm running statistics).
    bn_statistics:  BN module name -> (batch mean [C], batch variance [C]) of the client's batch,
                    present only when the client shares them for global BN updates.
    """

    gradients: dict[str, torch.Tensor]
    global_weights: dict[str, torch.Tensor]
    meta: UpdateMeta
    bn_statistics: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def replace(self, **changes: Any) -> "SharedUpdate":
        """A copy with some fields changed (defenses are pure functions update -> update)."""
        fields = {"gradients": self.gradients, "global_weights": self.global_weights,
                  "meta": self.meta, "bn_statistics": self.bn_statistics}
        fields.update(changes)
        return SharedUpdate(**fields)


def is_finite_dict(tensors: dict[str, torch.Tensor]) -> str | None:
    """Name of the first tensor holding NaN/Inf, or None."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return name
    return None


def _float(x: float) -> float:
    return float(x) if math.isfinite(x) else float("nan")
