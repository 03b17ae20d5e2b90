"""Run one attack of the peer framework *breaching* on a case prepared by ``benchmarks/run.py``.

This script runs in breaching's OWN virtual environment (``benchmarks/.venv-breaching``), never
in gradleak's: it imports breaching, torch, numpy and the standard library only.

    benchmarks/.venv-breaching/bin/python benchmarks/breaching_driver.py CASE_DIR

CASE_DIR holds what run.py wrote (the same data gradleak attacks):

* ``case.json``  the case: model, attack preset, iterations, batch, normalisation, threads, seed;
* ``case.npz``   ``images`` [K, 3, H, W] float32 pixels in [0, 1] (the real foolbox CIFAR-10
  photos gradleak drew), ``labels`` [K], the global model's parameters ``param_000...`` in
  ``model.parameters()`` order, and gradleak's shared gradient ``grad_000...`` (only to check
  that breaching's simulated client shares the very same gradient).

How breaching is fed (no dataset, no download): breaching's ``UserSingleStep`` is built with no
dataloader and ``compute_local_updates(payload, custom_data={"inputs", "labels"})`` is called
with the normalised photos, which its docstring allows ("custom data can be directly inserted
here"). The model is breaching's own ``lenet_zhu`` / CIFAR ``resnet18`` (or, for the
GradInversion case, gradleak's small ConvNet defined below, since breaching ships no model of that
shape), with the global weights copied in by position. The attack config is breaching's own
hydra preset (``deepleakage``, ``invertinggradients``, ``seethroughgradients``) with only
``optim.max_iterations`` and the case's threat model (no labels given, BN mode) overridden.

Instrumentation (no change to breaching's code): the attacker's ``_init_optimizer`` is wrapped
so that the scheduler it returns is a proxy whose ``step()`` (called once per iteration, right
after ``optimizer.step``) snapshots the current candidate every ``log_every`` iterations. The
snapshot's own cost is timed and subtracted from every timestamp, exactly as run.py does for
gradleak. PSNR is NOT computed here: run.py scores every snapshot and the final answer with
gradleak's metric code, identically for both tools.

Writes into CASE_DIR/breaching/: ``result.json`` (timings, trajectory iterations/times, checks),
``snapshots.npy`` [S, K, 3, H, W] and ``final.npy`` [K, 3, H, W] (pixels in [0, 1]),
``final_labels.npy``.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import socket
import sys
import time
from pathlib import Path

import numpy as np
import torch


def forbid_network() -> None:
    """Make any network access fail loudly: the benchmark must not download anything (datasets,
    LPIPS/torchvision weights, hub models)."""

    def refuse(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("breaching_driver: network access attempted; the benchmark must run offline")

    socket.socket.connect = refuse  # type: ignore[method-assign]
    socket.create_connection = refuse  # type: ignore[assignment]


class GradleakConvNet(torch.nn.Module):
    """gradleak's ``convnet`` (src/gradleak/models/small.py, width w), layer for layer:
    conv(w)-BN-ReLU, conv(2w)-BN-ReLU, maxpool, conv(4w)-BN-ReLU, maxpool, conv(4w)-BN-ReLU,
    adaptive avg-pool 4x4, linear. breaching has no model of this shape, so it is given here;
    run.py checks that the shared gradients of both tools agree, which proves the match."""

    def __init__(self, num_classes: int = 10, channels: int = 3, width: int = 32):
        super().__init__()
        w = width

        def block(cin: int, cout: int) -> list[torch.nn.Module]:
            return [torch.nn.Conv2d(cin, cout, 3, padding=1, bias=False), torch.nn.BatchNorm2d(cout), torch.nn.ReLU()]

        self.features = torch.nn.Sequential(*block(channels, w), *block(w, 2 * w), torch.nn.MaxPool2d(2),
                                            *block(2 * w, 4 * w), torch.nn.MaxPool2d(2), *block(4 * w, 4 * w),
                                            torch.nn.AdaptiveAvgPool2d(4))
        self.fc = torch.nn.Linear(4 * w * 16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).flatten(1))


def build_model(spec: dict, cfg_data):  # noqa: ANN001, ANN201
    """breaching's model for the case, plus its (TorchScript'ed) cross-entropy, as
    breaching.cases.construct_model returns them."""
    from breaching.cases.models import construct_model
    from breaching.cases.models.model_preparation import VisionContainer

    if spec["breaching_model"] == "gradleak-convnet":
        model = VisionContainer(GradleakConvNet(num_classes=spec["num_classes"], width=spec.get("width") or 32))
        model.name = "gradleak-convnet"
        loss_fn = torch.jit.script(torch.nn.CrossEntropyLoss())
        return model, loss_fn
    return construct_model(spec["breaching_model"], cfg_data, pretrained=False)


def load_weights(model: torch.nn.Module, npz) -> None:  # noqa: ANN001
    """Copy the global weights in by position; every shape must match."""
    params = list(model.parameters())
    names = sorted(k for k in npz.files if k.startswith("param_"))
    if len(names) != len(params):
        raise SystemExit(f"weights: case has {len(names)} parameter tensors, breaching's model {len(params)}")
    with torch.no_grad():
        for p, key in zip(params, names):
            w = torch.from_numpy(npz[key])
            if tuple(w.shape) != tuple(p.shape):
                raise SystemExit(f"weights: {key} has shape {tuple(w.shape)}, breaching's parameter {tuple(p.shape)}")
            p.copy_(w)


class Recorder:
    """Timestamps and image snapshots of the running attack. ``elapsed()`` is seconds since
    ``t0`` with the recorder's own time taken out."""

    def __init__(self, dm: torch.Tensor, ds: torch.Tensor, log_every: int, total: int):
        self.dm, self.ds = dm, ds
        self.log_every, self.total = log_every, total
        self.t0 = time.perf_counter()
        self.overhead = 0.0
        self.loop_start: float | None = None
        self.iterations = 0
        self.points: list[tuple[int, float]] = []      # (iteration, elapsed seconds)
        self.snapshots: list[np.ndarray] = []
        self.optimizers: list[torch.optim.Optimizer] = []

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0 - self.overhead

    def step(self, candidate: torch.Tensor) -> None:
        """Called after every optimizer step (via the scheduler proxy)."""
        self.iterations += 1
        it = self.iterations
        if it % self.log_every and it != self.total:
            return
        start = time.perf_counter()
        t = start - self.t0 - self.overhead
        with torch.no_grad():
            # breaching projects onto the pixel box after this point when boxed; clamping to
            # [0, 1] in pixel space is that projection, and the scorer clamps anyway.
            pixels = (candidate.detach().float() * self.ds + self.dm).clamp(0, 1).cpu().numpy().copy()
        self.points.append((it, t))
        self.snapshots.append(pixels)
        self.overhead += time.perf_counter() - start


class ObservedScheduler:
    """Proxy of breaching's LR scheduler: ``step()`` steps the real one, then lets the recorder
    look at the candidate. Everything else is forwarded."""

    def __init__(self, scheduler, candidate: torch.Tensor, recorder: Recorder):  # noqa: ANN001
        self._scheduler, self._candidate, self._recorder = scheduler, candidate, recorder

    def step(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        out = self._scheduler.step(*args, **kwargs)
        self._recorder.step(self._candidate)
        return out

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._scheduler, name)


def lbfgs_evaluations(optimizers: list[torch.optim.Optimizer]) -> int | None:
    """Objective evaluations done by L-BFGS optimizers (torch keeps the count in its state)."""
    total, seen = 0, False
    for opt in optimizers:
        if isinstance(opt, torch.optim.LBFGS):
            seen = True
            state = opt.state[opt._params[0]]  # noqa: SLF001 - torch's own bookkeeping
            total += int(state.get("func_evals", 0))
    return total if seen else None


def main() -> None:
    case_dir = Path(sys.argv[1])
    spec = json.loads((case_dir / "case.json").read_text())
    npz = np.load(case_dir / "case.npz")
    out = case_dir / "breaching"
    out.mkdir(parents=True, exist_ok=True)

    forbid_network()
    torch.set_num_threads(int(spec["threads"]))
    torch.manual_seed(int(spec["seed"]))
    logging.basicConfig(level=logging.WARNING)

    import breaching
    from breaching.cases.servers import HonestServer
    from breaching.cases.users import UserSingleStep

    setup = dict(device=torch.device("cpu"), dtype=torch.float)
    k = int(spec["batch_size"])
    # Case config: breaching's own "1_single_image_small" (CIFAR-10 shape), with the threat model
    # of the benchmark: no labels shared, the client trains in train mode (BN batch statistics,
    # as gradleak's FedSGD client), and its BN buffers shared only where the attack uses them.
    cfg_case = breaching.get_case_config("1_single_image_small", overrides=[
        f"user.num_data_points={k}",
        "user.provide_labels=False",
        f"user.provide_buffers={bool(spec['provide_buffers'])}",
        "server.provide_public_buffers=False",
        "server.pretrained=False",
        f"data.mean={list(spec['mean'])}",
        f"data.std={list(spec['std'])}",
        f"data.classes={int(spec['num_classes'])}",
    ])
    # iterations null: breaching's own preset length (its whole default run, benchmarks/whole_runs.py)
    own_length = spec["iterations"] is None
    cfg_attack = breaching.get_attack_config(spec["breaching_attack"], overrides=[
        *([] if own_length else [f"optim.max_iterations={int(spec['iterations'])}"]),
        *spec.get("breaching_overrides", []),
    ])

    model, loss_fn = build_model(spec, cfg_case.data)
    load_weights(model, npz)
    server = HonestServer(model, loss_fn, cfg_case, setup, external_dataloader=None)
    model = server.vet_model(model)
    user = UserSingleStep(model, loss_fn, None, setup, idx=0, cfg_user=cfg_case.user)
    user.data_key = "inputs"  # set by its _load_data, which custom data bypasses

    dm = torch.as_tensor(spec["mean"], dtype=torch.float)[None, :, None, None]
    ds = torch.as_tensor(spec["std"], dtype=torch.float)[None, :, None, None]
    images = torch.from_numpy(npz["images"]).float()
    labels = torch.from_numpy(npz["labels"]).long()
    payload = server.distribute_payload()
    shared, _true = user.compute_local_updates(payload, custom_data={"inputs": (images - dm) / ds, "labels": labels})

    # Same client gradient as gradleak's? (same weights, photos, normalisation and BN mode)
    ref = [torch.from_numpy(npz[n]) for n in sorted(f for f in npz.files if f.startswith("grad_"))]
    num = sum(float((a.double() - b.double()).pow(2).sum()) for a, b in zip(shared["gradients"], ref))
    den = sum(float(b.double().pow(2).sum()) for b in ref)
    gradient_rel_diff = (num / max(den, 1e-300)) ** 0.5 if len(ref) == len(shared["gradients"]) else None

    attacker = breaching.attacks.prepare_attack(server.model, server.loss, cfg_attack, setup)
    rec = Recorder(dm, ds, int(spec["log_every"]), int(cfg_attack.optim.max_iterations))
    original_init = attacker._init_optimizer  # noqa: SLF001

    def init_optimizer(candidates):  # noqa: ANN001, ANN202
        optimizer, scheduler = original_init(candidates)
        rec.optimizers.append(optimizer)
        rec.loop_start = rec.elapsed()
        return optimizer, ObservedScheduler(scheduler, candidates[0], rec)

    attacker._init_optimizer = init_optimizer  # noqa: SLF001

    rec.t0, rec.overhead = time.perf_counter(), 0.0
    reconstructed, stats = attacker.reconstruct([payload], [shared], {}, dryrun=False)
    total_seconds = rec.elapsed()
    last_step = rec.points[-1][1] if rec.points else total_seconds
    loop_seconds = last_step - (rec.loop_start or 0.0)

    final = (reconstructed["data"].detach().float() * ds + dm).clamp(0, 1)
    final_labels = reconstructed["labels"].detach()
    if final_labels.ndim > 1:  # joint optimisation returns label logits
        final_labels = final_labels.argmax(dim=-1)
    np.save(out / "final.npy", final.numpy())
    np.save(out / "final_labels.npy", final_labels.long().numpy())
    np.save(out / "snapshots.npy", np.stack(rec.snapshots) if rec.snapshots else np.zeros((0, *final.shape), "float32"))
    result = {
        "tool": "breaching",
        "version": importlib.metadata.version("breaching"),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "iterations": rec.iterations,
        "loop_seconds": loop_seconds,
        "total_seconds": total_seconds,
        "observer_seconds": rec.overhead,
        "lbfgs_evaluations": lbfgs_evaluations(rec.optimizers),
        "trajectory": [{"iteration": it, "seconds": t} for it, t in rec.points],
        "gradient_rel_diff_vs_gradleak": gradient_rel_diff,
        "labels_restored": final_labels.long().tolist(),
        "attack_config": {"type": cfg_attack.type, "optim": dict(cfg_attack.optim),
                          "objective": dict(cfg_attack.objective),
                          "regularization": {k2: dict(v) for k2, v in (cfg_attack.regularization or {}).items()},
                          "label_strategy": cfg_attack.label_strategy, "dtype": cfg_attack.impl.dtype},
        "opt_value": stats.get("opt_value") if isinstance(stats, dict) else None,
    }
    (out / "result.json").write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
