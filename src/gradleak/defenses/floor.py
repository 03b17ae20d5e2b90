"""The noise floor of a defended update: how far the client's own data stays from what it shared.

A defense that adds noise (or rounds) moves the shared update u away from the update u(x) that
the client's data x produce: even the truth scores ||u(x) - u||^2 = ||e||^2 > 0. An attack cannot
be asked to explain the update better than the truth does, so the convergence verdict
(attacks/verdict.py) measures it against this floor. The floor is the attacker's: built from
the defenses recorded in the update's metadata (public protocol parameters: sigma, b, the DP-SGD
clip and noise multiplier, the quantisation grid read off the shared values) and the shared
tensors, never from the data.

Aggregates: each client is defended before the mean of N clients, so the error is a mean of N
independent ones: E||e||^2 / N, and (Gaussian by the central limit) Var ||e||^2 = 2 (E||e||^2 / N)^2
/ entries. Quantisation grids cannot be read off a mean, so quantised aggregates are not modelled.
DP-SGD's clipping is not modelled (the per-sample norms are private): listed as unmodelled.
Pruning is not modelled: the attacker cannot bound from below what the zeroed entries held, and a
zero floor errs on "inconclusive", never on "defended".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


from ..fl.update import SharedUpdate
from ..specs import declarations
from .base import Residual
from .spec import parse_defense

# how many standard deviations of the truth's own residual the floor's tolerance allows: the truth
# passes with probability ~0.9987 (its squared noise norm is near Gaussian over many entries)
FLOOR_SIGMAS = 3.0


@dataclass(frozen=True)
class NoiseFloor:
    """The floor relative to the shared update's squared norm ||u||^2 (the verdict's units):
    ``mean`` = E||e||^2 / ||u||^2, ``tolerance`` = FLOOR_SIGMAS std(||e||^2) / ||u||^2."""

    mean: float = 0.0
    tolerance: float = 0.0
    modelled: list[str] = field(default_factory=list)
    unmodelled: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.modelled and not self.unmodelled


def noise_floor(update: SharedUpdate, matched: Mapping[str, Sequence[int] | None] | None = None) -> NoiseFloor:
    """The floor of ``update`` from its recorded defenses (empty when it records none).

    ``matched``: the shared tensors an attack's relative distance is measured on, when not all of
    them (name -> None: the whole tensor, or the row indices it matches; the text attacks leave the
    word-embedding matrix out, or match only the leaked words' rows): the floor is then theirs, in
    the same units as the answer's distance. int8's grid is read off the rows given (at most as
    coarse as the client's: a lower floor, which errs on "inconclusive")."""
    specs = list(update.meta.defenses or [])
    if not specs:
        return NoiseFloor()
    if matched is None:
        shared = [t.detach() for t in update.gradients.values()]
    else:
        shared = [(g if rows is None else g[list(rows)]).detach()
                  for name, rows in matched.items() if (g := update.gradients.get(name)) is not None]
    norm2 = sum(float(t.double().pow(2).sum()) for t in shared)
    entries = sum(t.numel() for t in shared)
    threat = update.meta.threat if isinstance(update.meta.threat, dict) else {}
    clients = int(threat.get("clients", 1) or 1) if threat.get("name") == "aggregate" else 1
    client_batch = max(int(update.meta.batch_size) // clients, 1)
    mean = var = 0.0
    modelled, unmodelled = [], []
    for spec in specs:
        defense = parse_defense(spec)
        res: Residual | None = defense.residual(shared, client_batch)
        if res is not None and clients > 1:
            if not declarations("defense")[defense.name].get("averages", True):
                res = None
            else:
                per_client = res.mean / clients
                res = Residual(per_client, 2 * per_client ** 2 / max(entries, 1))
        if res is None:
            unmodelled.append(spec)
            continue
        modelled.append(spec)
        part = declarations("defense")[defense.name].get("unmodelled")
        if part:  # DP-SGD: its noise is modelled, its per-sample clipping is not
            unmodelled.append(f"{spec} ({part})")
        mean, var = mean + res.mean, var + res.var
    if norm2 <= 0:
        return NoiseFloor(0.0, 0.0, modelled, unmodelled)
    return NoiseFloor(mean / norm2, FLOOR_SIGMAS * var ** 0.5 / norm2, modelled, unmodelled)


__all__ = ["FLOOR_SIGMAS", "NoiseFloor", "noise_floor"]
