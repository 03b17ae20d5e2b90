"""Yardsticks for an answer's gradient distance that do not depend on one optimiser's reach.

A relative gradient distance means little on its own: under heavy noise every batch scores near
1, and a prior-regularised attack's random start can score under its own convergence line. So
the verdict (outcome.py) compares distances with those of batches nobody optimised, computed
exactly as the attacks compute their answers' (attacks/simulate.py, float64, the same threat
model, so DP-SGD's clipping mismatch affects every batch alike):

* decoy batches: public photos no client owns (metrics/recognisable.public_decoys), drawn by a
  fixed seed, carrying the truth's labels (with truth: can the defended update tell the true
  batch from them?) or the restored labels (without truth: does the answer fit the update far
  better than a public batch would?);
* starts: the batches the attacks start from (``randn`` in the model's input space, the zero
  image, ``rand`` pixels), with the restored labels.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import GradleakError
from ..fl import SharedUpdate
from ..models import ModelSpec

#: Decoy batches drawn per test, and the seed that draws them (fixed: the same decoys every run).
DECOY_BATCHES = 16
DECOY_SEED = 20_240_601
#: Random starts (``randn`` and ``rand``) scored besides the zero image.
START_DRAWS = 2


def batch_distances(model: ModelSpec, update: SharedUpdate, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                    device: torch.device, *, pixels: bool = True, scaled: bool = False) -> list[float] | None:
    """Each batch's relative gradient distance to the shared update, as the attacks measure their
    answers' (attacks/verdict.py). batches: (images [K, C, H, W], labels [K]); images in [0, 1]
    pixels (``pixels``) or already in the model's input space. ``scaled``: the distance after the
    best scale of the simulated update (1 - cos^2), which a norm change (DP-SGD's clipping) does
    not move. None when the update cannot be simulated from them (e.g. a model without double)."""
    from ..attacks.simulate import UpdateSimulator
    from ..attacks.verdict import relative_distance

    try:
        victim = copy.deepcopy(model)
        sim = UpdateSimulator(victim, update, dtype=torch.float64, device=device)
        where = sim.target[0].device
        out = []
        with torch.enable_grad():
            for images, labels in batches:
                x = images.double().to(where)
                x = victim.normalize(x) if pixels else x
                simulated = sim(x, labels.to(where), create_graph=False)
                out.append(scaled_distance(simulated, sim.target) if scaled else
                           relative_distance(simulated, sim.target))
        return out
    except (GradleakError, RuntimeError, ValueError):
        return None


def scaled_distance(simulated: Sequence[torch.Tensor], target: Sequence[torch.Tensor]) -> float:
    """min over a of ||a s - t||^2 / ||t||^2 = 1 - cos^2(s, t) over all tensors, in float64."""
    with torch.no_grad():
        dot = sum(float((s.detach().double() * t.detach().double()).sum()) for s, t in zip(simulated, target, strict=True))
        ss = sum(float(s.detach().double().pow(2).sum()) for s in simulated)
        tt = sum(float(t.detach().double().pow(2).sum()) for t in target)
    return 1.0 - dot * dot / (ss * tt) if ss > 0 and tt > 0 else 1.0


def decoy_images(shape: torch.Size, originals: torch.Tensor | None, count: int = DECOY_BATCHES) -> list[torch.Tensor]:
    """``count`` batches of public photos [K, C, H, W] in [0, 1] (``shape`` is the batch's), drawn
    by DECOY_SEED without repeats within a batch where the pool allows; copies of an original are
    left out. Empty for non-square images (the public photos are square crops)."""
    from ..metrics.recognisable import apart_from, public_decoys

    k, c, h, w = (int(s) for s in shape)
    if h != w:
        return []
    pool = public_decoys(h, c)
    if originals is not None:
        pool = apart_from(pool, originals.detach().cpu().float())
    if pool.shape[0] == 0:
        return []
    gen = torch.Generator().manual_seed(DECOY_SEED)
    batches = []
    for _ in range(count):
        idx = torch.randperm(pool.shape[0], generator=gen)[:k] if pool.shape[0] >= k else \
            torch.randint(pool.shape[0], (k,), generator=gen)
        batches.append(pool[idx])
    return batches


def decoy_test(model: ModelSpec, update: SharedUpdate, truth: Any, spread: float, device: torch.device, *,
               scaled: bool = False) -> dict[str, Any] | None:
    """With the truth, on a defended update: the truth's distance against DECOY_BATCHES decoy
    batches carrying the truth's labels, and the outcome's test (outcome.decoy_separated: is the
    truth below the best decoy by more than ``spread``, the noise's draw-to-draw spread of the
    truth's own distance?). ``scaled``: both measured after the best scale (under clipping the
    attacker's simulation does not reproduce: a decoy of smaller gradient norm must not pass for
    the truth's match). None when it cannot be measured."""
    from ..outcome import DECOY_TEST, decoy_separated

    images = decoy_images(truth.images.shape, truth.images)
    batches = [(truth.images, truth.labels), *((d, truth.labels) for d in images)]
    distances = batch_distances(model, update, batches, device, scaled=scaled) if images else None
    if not distances:
        return None
    own, decoys = distances[0], distances[1:]
    return {"test": DECOY_TEST, "measure": "1 - cos^2 (after the best scale)" if scaled else "relative distance",
            "truth": own, "decoys": decoys, "best_decoy": min(decoys), "spread": spread,
            "threshold": min(decoys) - spread, "separated": decoy_separated(own, decoys, spread), "seed": DECOY_SEED}


def reference_distances(model: ModelSpec, update: SharedUpdate, shape: torch.Size, labels: torch.Tensor,
                        device: torch.device) -> dict[str, list[float]] | None:
    """Without truth: the distances of batches nobody optimised, with the restored ``labels``
    [K]: the attacks' starts (``randn`` in input space and ``rand`` pixels, START_DRAWS each, and
    the zero image) and DECOY_BATCHES decoy batches. None when they cannot be measured."""
    k, c, h, w = (int(s) for s in shape)
    labels = labels.detach().cpu().long().reshape(-1)
    if labels.numel() != k:
        return None
    gen = torch.Generator().manual_seed(DECOY_SEED + 1)
    randn = [torch.randn((k, c, h, w), generator=gen, dtype=torch.float64) for _ in range(START_DRAWS)]
    rand = [model.normalize(torch.rand((k, c, h, w), generator=gen, dtype=torch.float64)) for _ in range(START_DRAWS)]
    starts = batch_distances(model, update, [(x, labels) for x in [*randn, torch.zeros(k, c, h, w), *rand]], device,
                             pixels=False)
    images = decoy_images(torch.Size((k, c, h, w)), None)
    decoys = batch_distances(model, update, [(d, labels) for d in images], device) if images else []
    if starts is None or decoys is None:
        return None
    return {"starts": starts, "decoys": decoys}


__all__ = ["DECOY_BATCHES", "DECOY_SEED", "START_DRAWS", "batch_distances", "decoy_images", "decoy_test",
           "reference_distances"]
