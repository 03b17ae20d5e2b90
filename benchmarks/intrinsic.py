"""Intrinsic cost of gradleak's attack step: its time divided by a plain training step
(forward + backward, parameter gradients) of the same model, batch and precision, measured in
the same process, interleaved round by round so that load from other work hits both alike.

Also measured, as a reference: a "naive" gradient-matching step written in the most direct way
(forward, ``torch.autograd.grad(create_graph=True)``, squared distance to a target gradient,
backward to the input), the floor a double-backward attack cannot go much below.

Attack steps, each the real gradleak attack loop run for a few iterations via ``gradleak.pipeline.attack_update``:

* ``lenet-dlg`` batch 1: DLG. One iteration is an L-BFGS step of up to 20 objective
  evaluations, so the step time is the loop time divided by the evaluations L-BFGS reports
  (one evaluation = one forward + double backward, what a training step is compared to).
  Precision: DLG's default float64 (training step in float64 too), and float32.
* ``resnet18-cifar`` batch 1: Inverting Gradients (one Adam step = one evaluation), float32.
* ``convnet`` batch 4: GradInversion with one seed (G = 1, group term off since it needs G > 1;
  TV, L2 and BN priors and Langevin noise on), float32.
"""

from __future__ import annotations

import copy
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from gradleak.config import make_config
from gradleak.pipeline import attack_update, build_case


@contextmanager
def lbfgs_instances() -> Iterator[list[torch.optim.LBFGS]]:
    """Collect every torch.optim.LBFGS created inside the block (to read its evaluation count)."""
    made: list[torch.optim.LBFGS] = []
    original = torch.optim.LBFGS.__init__

    def init(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made.append(self)

    torch.optim.LBFGS.__init__ = init  # type: ignore[method-assign]
    try:
        yield made
    finally:
        torch.optim.LBFGS.__init__ = original  # type: ignore[method-assign]


def lbfgs_evaluations(optimizers: list[torch.optim.LBFGS]) -> int:
    return sum(int(opt.state[opt._params[0]].get("func_evals", 0)) for opt in optimizers)  # noqa: SLF001


@dataclass(frozen=True)
class Target:
    key: str
    label: str
    attack: str
    model: str
    batch_size: int
    dtype: str
    fields: dict[str, Any]


TARGETS = (
    Target("lenet-dlg-f64", "lenet-dlg, batch 1, DLG step (float64, DLG default)", "dlg", "lenet-dlg", 1, "float64", {}),
    Target("lenet-dlg-f32", "lenet-dlg, batch 1, DLG step (float32)", "dlg", "lenet-dlg", 1, "float32", {}),
    Target("resnet18-cifar", "resnet18-cifar, batch 1, IG step (float32)", "ig", "resnet18-cifar", 1, "float32", {}),
    Target("convnet", "convnet, batch 4, GradInversion step, G=1 (float32)", "gradinversion", "convnet", 4, "float32",
           {"preset": "cpu", "seeds": 1, "group": "none", "share_bn_statistics": True}),
)


def _median_time(fn, reps: int) -> float:  # noqa: ANN001
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(target: Target, *, rounds: int, train_reps: int, attack_iterations: int, threads: int) -> dict[str, Any]:
    """Median over ``rounds`` of (attack step / training step) and (naive step / training step)."""
    cfg = make_config(attack=target.attack, model=target.model, batch_size=target.batch_size, seed=0,
                      dtype=target.dtype, threads=threads, progress=False, **target.fields)
    case = build_case(cfg)
    dtype = getattr(torch, target.dtype)
    assert case.truth is not None
    module = copy.deepcopy(case.model.module).to(dtype).train()
    x = case.model.normalize(case.truth.images.to(dtype))
    y = case.truth.labels
    params = [p for p in module.parameters() if p.requires_grad]
    target_grads = [g.to(dtype) for g in case.update.gradients.values()]

    def train_step() -> None:
        loss = F.cross_entropy(module(x), y)
        loss.backward()
        module.zero_grad(set_to_none=True)

    dummy = torch.randn_like(x).requires_grad_(True)

    def naive_step() -> None:
        loss = F.cross_entropy(module(dummy), y)
        grads = torch.autograd.grad(loss, params, create_graph=True)
        dist = sum(((g - t) ** 2).sum() for g, t in zip(grads, target_grads))
        (gx,) = torch.autograd.grad(dist, dummy)
        del gx

    flags = {k: target.fields[k] for k in ("preset", "seeds", "group") if k in target.fields}

    def attack_step() -> float:
        with lbfgs_instances() as made:
            rec = attack_update(case.update, case.model, target.attack, iterations=attack_iterations,
                                dtype=target.dtype, seed=0, log_every=10**9, **flags)
        evaluations = lbfgs_evaluations(made) if made else rec.iterations
        return rec.wall_seconds / max(1, evaluations)

    # warm-up (allocator, thread pool, first-call overheads)
    for _ in range(3):
        train_step()
        naive_step()
    attack_step()
    rows = []
    for _ in range(rounds):
        t_train = _median_time(train_step, train_reps)
        t_naive = _median_time(naive_step, max(3, train_reps // 2))
        t_attack = attack_step()
        rows.append((t_train, t_naive, t_attack))
    t_train = statistics.median(r[0] for r in rows)
    t_naive = statistics.median(r[1] for r in rows)
    t_attack = statistics.median(r[2] for r in rows)
    return {
        "key": target.key, "label": target.label, "attack": target.attack, "model": target.model,
        "batch_size": target.batch_size, "dtype": target.dtype,
        "train_step_ms": 1000 * t_train, "naive_step_ms": 1000 * t_naive, "attack_step_ms": 1000 * t_attack,
        "attack_ratio": statistics.median(r[2] / r[0] for r in rows),
        "naive_ratio": statistics.median(r[1] / r[0] for r in rows),
        "attack_ratio_rounds": [r[2] / r[0] for r in rows],
        "rounds": rounds,
    }


def measure_all(*, quick: bool, threads: int) -> list[dict[str, Any]]:
    rounds, train_reps, iters = (2, 10, 5) if quick else (3, 20, 10)
    return [measure(t, rounds=rounds, train_reps=train_reps, attack_iterations=iters, threads=threads)
            for t in TARGETS]
