"""The truth-start test: the same attack, started from the client's true batch, on the defended
update. If even that start walks away to an answer that is no leak, the defended objective shows
no recognisable image near the truth, so no optimiser on it rebuilds one (outcome.py,
docs/explanation/defended.md)."""

from __future__ import annotations

from typing import Any

import torch

from ..attacks.reconstruction import Reconstruction
from ..data import Batch
from ..fl import SharedUpdate
from ..models import ModelSpec

#: The truth-start's budget: this share of the attack's own per-start iterations (the same budget:
#: a start that needs more steps than the attack gets says nothing about the attack's answer).
TRUTH_START_SHARE = 1.0
#: Started from the truth as well, whatever attack ran: Inverting Gradients, a prior-regularised
#: objective (cosine distance + TV, pixel box) unlike DLG/iDLG's plain L2 match. Measured: under
#: Gaussian 0.1 iDLG from the true frog (cifar10-samples seed 0) walks away to 6 dB while IG from a
#: random start rebuilds it recognisably (17 dB, coarse SSIM 0.58); under Gaussian 0.01 iDLG from
#: the immunohistochemistry photo walks away to 5.9 dB. One objective's walk-away is no evidence
#: about another's (docs/explanation/defended.md). Run where IG's SPEC lets auto run it (max_side).
PRIOR_ATTACK = "ig"


def truth_start_attacks(name: str, side: int) -> tuple[str, ...]:
    """The attacks the truth-start test starts from the truth: ``name`` (the attack that ran) and
    PRIOR_ATTACK where images of ``side`` pixels fit its SPEC's auto max_side."""
    from ..specs import attack_specs

    prior = attack_specs().get(PRIOR_ATTACK)
    limit = (prior.auto or {}).get("max_side") if prior is not None else None
    fits = prior is not None and (limit is None or side <= int(limit))
    return (name,) if name == PRIOR_ATTACK or not fits else (name, PRIOR_ATTACK)


def truth_start_config(attack: Any, name: str) -> Any | None:
    """The typed config of attack ``name`` as it ran (``attack``: the run's resolved config; auto:
    its member ``name``), with one start (its SPEC's "one_start": every further start, DLG's stall
    restarts, IG's restarts, would begin from the same batch; GradInversion's G seeds stay, they
    are its group consensus) and TRUTH_START_SHARE of its iterations. None for a closed form (it
    has no start) or a member auto did not hold."""
    from ..specs import attack_specs

    spec = attack_specs().get(name)
    if spec is None or not spec.optimisation:
        return None
    members = getattr(attack, "portfolio", None)
    if members is not None:
        attack = next((m for m in members if getattr(m, "attack", None) == name), None)
    if attack is None or getattr(attack, "attack", name) != name:
        return None
    fields = type(attack).model_fields
    change = {k: v for k, v in spec.one_start.items() if k in fields}
    if "iterations" in fields:
        change["iterations"] = max(1, round(TRUTH_START_SHARE * int(attack.iterations)))
    return attack.model_copy(update=change)


def run_truth_start(config: Any, update: SharedUpdate, model: ModelSpec, truth: Batch,
                    device: torch.device) -> Reconstruction:
    """``config`` (truth_start_config) run on ``update`` with every start at ``truth``'s images and
    labels (engine.StartBatch), in memory (no checkpoints, no observer)."""
    from ..engine import Engine, Session, StartBatch

    engine = Engine(device=device, session=Session(every=0), start=StartBatch(truth.images, truth.labels))
    return engine.run(config, update, model)


__all__ = ["PRIOR_ATTACK", "TRUTH_START_SHARE", "run_truth_start", "truth_start_attacks",
           "truth_start_config"]
