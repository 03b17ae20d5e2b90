"""Did the attack converge? Judged from the attacker's side only (never the ground truth): the
answer's relative gradient distance against the attack's declared line, the defenses' noise
floor added (defenses/floor.py). The lines and how they were measured: docs/reference/verdicts.md."""

from __future__ import annotations

import importlib
import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import torch

from ..defenses.floor import NoiseFloor
from ..outcome import CONVERGED_BELOW
from ..specs import attack_specs

# relative squared distance at or below which the attack's answer explains the update: declared
# with the other verdict lines in gradleak/outcome.py (the one place every surface reads them)


def relative_distance(simulated: Sequence[torch.Tensor], target: Sequence[torch.Tensor]) -> float:
    """||simulated - target||^2 / ||target||^2 over all tensors, in float64 (inf if not finite)."""
    with torch.no_grad():
        num = sum(float((s.detach().double() - t.detach().double()).pow(2).sum()) for s, t in zip(simulated, target, strict=True))
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
    noise_floor: float = 0.0            # the truth's own relative distance (defenses/floor.py)
    floor_tolerance: float = 0.0
    unmodelled_defenses: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def converged_below(attack_family: str, floor: NoiseFloor | None = None, threshold: float | None = None) -> float:
    """The relative distance at or below which the attack's answer explains the update: the
    family's threshold (or ``threshold``) on the clean part, plus the defenses' noise floor and
    its tolerance."""
    threshold = CONVERGED_BELOW[attack_family] if threshold is None else threshold
    if floor is None or (floor.mean == 0 and floor.tolerance == 0):
        return threshold
    return threshold * max(1.0 - floor.mean, 0.0) + floor.mean + floor.tolerance


def line_family(attack_family: str, extra: dict[str, Any]) -> str:
    """The family whose line judges this run: ``attack_family``, or what the attack's own hook
    says from the settings the run recorded (SPEC "verdict_line": GradInversion's gradient
    matching alone is held to DLG's line)."""
    settings = extra.get("settings") if isinstance(extra.get("settings"), dict) else {}
    spec = attack_specs().get(attack_family)
    if spec is None or not spec.verdict_line or not settings:
        return attack_family
    # spec.module names a file of gradleak's own attack package (specs.attack_specs), never a name
    # read from a run's input; the attack that recorded these settings has already imported it
    return importlib.import_module(spec.module).verdict_line(settings) or attack_family


def verdict(attack_family: str, extra: dict[str, Any], floor: NoiseFloor | None = None) -> Convergence:
    """The verdict on an attack's own evidence (its Reconstruction.extra), against the noise
    floor of the update's defenses (``floor``, defenses.floor.noise_floor; None: undefended)."""
    attack_family = line_family(attack_family, extra)
    conv = _verdict(attack_family, extra, converged_below(attack_family, floor))
    if floor is None or floor.empty:
        return conv
    reason = conv.reason
    if floor.modelled:
        reason += (f"; the defenses {', '.join(floor.modelled)} leave even the true data at {floor.mean:.2e} "
                   f"(+- {floor.tolerance:.2e}), which the threshold includes")
    if floor.unmodelled:
        reason += (f"; the floor does not model {', '.join(floor.unmodelled)} (the true data may score above "
                   "the threshold: a non-converged run under it is inconclusive, not safe)")
    return Convergence(conv.converged, conv.relative_gradient_distance, conv.threshold, conv.plateau,
                       conv.restarts_used, reason, floor.mean, floor.tolerance, tuple(floor.unmodelled))


def _verdict(attack_family: str, extra: dict[str, Any], threshold: float) -> Convergence:
    if extra.get("analytic"):  # read off the update, nothing optimised (text bag of words)
        exact = bool(extra.get("exact"))
        return Convergence(exact, None, threshold, False, 0,
                           "analytic: read off the update exactly" if exact else
                           f"analytic, but the update did not reveal it exactly "
                           f"({extra.get('why_not_exact') or 'noise or pruning'}): inconclusive")
    rel = extra.get("relative_gradient_distance")
    plateau = bool(extra.get("plateau", False))
    restarts = int(extra.get("restarts_used", 0) or 0)
    if rel is None or not isinstance(rel, (int, float)) or not math.isfinite(rel):
        return Convergence(False, None, threshold, plateau, restarts,
                           "the attack recorded no finite gradient distance")
    determined, layers = extra.get("layers_determined"), extra.get("layers")
    if isinstance(determined, int) and isinstance(layers, int) and determined < layers:
        # R-GAP: a layer whose system is rank deficient has many inputs that explain the update
        # equally well; the answer is one of them, not necessarily the client's
        return Convergence(False, float(rel), threshold, plateau, restarts,
                           f"{layers - determined} of {layers} layers are not determined by the update (rank "
                           f"deficient): the answer explains the update (relative distance {rel:.2e}) but is one "
                           "of many that do: inconclusive")
    if rel <= threshold:
        return Convergence(True, float(rel), threshold, plateau, restarts,
                           f"the answer explains the shared update (relative distance {rel:.2e} <= {threshold:g})")
    stop = extra.get("stop_reason")
    why = ("stalled on a plateau" if plateau else f"{stop} without getting close enough" if isinstance(stop, str) and stop
           else "did not get close enough within its budget")
    if extra.get("closed_form"):  # solved, not searched: no budget to run out of
        why = "computed its answer in closed form (no iterations), and the answer does not explain the whole update" + (
            f" ({extra['why_not_exact']})" if isinstance(extra.get("why_not_exact"), str) else "")
    return Convergence(False, float(rel), threshold, plateau, restarts,
                       f"the attack {why}: relative distance {rel:.2e} > {threshold:g}; a low PSNR here is "
                       f"inconclusive, not evidence that the client is safe")


__all__ = ["CONVERGED_BELOW", "Convergence", "converged_below", "line_family", "relative_distance", "verdict"]
