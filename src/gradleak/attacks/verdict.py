"""Did the attack converge? Judged from the attacker's side only (never the ground truth).

A reconstruction is only evidence about a client when the attack found inputs that explain the
shared update. The evidence each attack records (``Reconstruction.extra``):

* ``relative_gradient_distance``: ||u(x') - u||^2 / ||u||^2 over every shared tensor, with u the
  shared update and u(x') what the attack's answer x' (and its labels) would make the client
  share under the same threat model (attacks/simulate.py). 0 is a perfect explanation; 1 is what
  sharing nothing would score.
* ``plateau``: the objective stopped improving before the budget was spent, far from zero;
* ``restarts_used``: fresh starts the attack took beyond its first.

``converged`` is ``relative_gradient_distance <= threshold`` for the attack (CONVERGED_BELOW,
declared before measuring any defense). Measured on this project's CPU runs (benchmarks and
tests): iDLG/DLG that rebuild a photo (>= 50 dB) end at 1e-11..1e-8; stalled or 2-iteration runs
and attacks on aggregates end at 1e-2..2e-1. GradInversion and Inverting Gradients optimise
priors too (and IG a cosine), so their answer never explains the update exactly: on convnet
(width 16), batch 2 / 1, 300 steps, runs that rebuilt ~19 dB ended at 0.21-0.25 and 10-20-step
runs at 0.64-0.71, hence 0.4; a coarse line, stated as such. Text DLG is exact when it succeeds.
A run that did not converge is "inconclusive": its low PSNR says nothing about the client.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import torch

# relative squared distance at or below which the attack's answer explains the update
CONVERGED_BELOW: dict[str, float] = {"dlg": 1e-4, "idlg": 1e-4, "ig": 0.4, "gradinversion": 0.4,
                                     "text": 1e-4}


def relative_distance(simulated: Sequence[torch.Tensor], target: Sequence[torch.Tensor]) -> float:
    """||simulated - target||^2 / ||target||^2 over all tensors, in float64 (inf if not finite)."""
    with torch.no_grad():
        num = sum(float((s.detach().double() - t.detach().double()).pow(2).sum()) for s, t in zip(simulated, target))
        den = sum(float(t.detach().double().pow(2).sum()) for t in target)
    value = num / den if den > 0 else (0.0 if num == 0 else math.inf)
    return value if math.isfinite(value) else math.inf


@dataclass(frozen=True)
class Convergence:
    converged: bool
    relative_gradient_distance: float | None
    threshold: float
    plateau: bool
    restarts_used: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def verdict(attack_family: str, extra: dict[str, Any]) -> Convergence:
    """The verdict on an attack's own evidence (its Reconstruction.extra)."""
    threshold = CONVERGED_BELOW[attack_family]
    if extra.get("analytic"):  # read off the update, nothing optimised (text bag of words)
        exact = bool(extra.get("exact"))
        return Convergence(exact, None, threshold, False, 0,
                           "analytic: read off the update exactly" if exact else
                           "analytic, but the update did not reveal it exactly (noise or pruning): inconclusive")
    rel = extra.get("relative_gradient_distance")
    plateau = bool(extra.get("plateau", False))
    restarts = int(extra.get("restarts_used", 0) or 0)
    if rel is None or not isinstance(rel, (int, float)) or not math.isfinite(rel):
        return Convergence(False, None, threshold, plateau, restarts,
                           "the attack recorded no finite gradient distance")
    if rel <= threshold:
        return Convergence(True, float(rel), threshold, plateau, restarts,
                           f"the answer explains the shared update (relative distance {rel:.2e} <= {threshold:g})")
    why = "stalled on a plateau" if plateau else "did not get close enough within its budget"
    return Convergence(False, float(rel), threshold, plateau, restarts,
                       f"the attack {why}: relative distance {rel:.2e} > {threshold:g}; a low PSNR here is "
                       f"inconclusive, not evidence that the client is safe")


__all__ = ["CONVERGED_BELOW", "Convergence", "relative_distance", "verdict"]
