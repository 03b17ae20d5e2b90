"""Speed-ups issue 6 asks to try, measured on this machine, and why they are not used.

Five measurements, each against gradleak's own step in the same process (interleaved rounds,
median), with the numerical difference to the kept path:

* ``compile``: DLG's evaluation (LeNet, batch 1, float64: dummy gradient, squared distance,
  derivative w.r.t. image and soft label) written with torch.func and compiled with
  ``torch.compile(fullgraph=True)`` (inductor, C++ on CPU) vs the eager step the attack uses;
  the first call's compile time is recorded too (cold: a fresh inductor cache folder).
* ``channels_last``: the Inverting Gradients step (ResNet-18 CIFAR stem, batch 1, float32) with
  the attacker's model and parameters in channels_last memory format vs contiguous.
* ``bfloat16``: the same IG step under CPU autocast (bfloat16) vs float32, and the relative error
  of the image gradient it produces.
* ``unfold``: DLG's evaluation (LeNet, float64, batch 1 and 4) with the attacker's convolutions
  written as unfold + matmul (the same function; its double backward is then matmuls and
  fold/unfold) vs torch's convolution (float64 on CPU takes the slow_conv2d path, no oneDNN).
* ``threads``: DLG's evaluation (LeNet, float64) with 1 vs 2 torch threads, batch 1 to 16:
  whether a default of one thread for small problems would pay.

    .venv/bin/python benchmarks/tried.py [--threads 1] [--only unfold,threads] [--out benchmarks/tried.json]

``--only`` re-measures the named entries and keeps the others from the existing output file.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

# A cold compile: inductor's on-disk cache would otherwise hide the compile time of a first run.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="gradleak-inductor-"))
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad

from gradleak.attacks.objectives import squared_l2
from gradleak.attacks.priors import tv_l1_mean
from gradleak.attacks.simulate import UpdateSimulator
from gradleak.config import make_config
from gradleak.runner import prepare


def _median_ms(fns: dict[str, Callable[[], Any]], rounds: int, reps: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t = time.perf_counter()
            for _ in range(reps):
                f()
            times[k].append((time.perf_counter() - t) / reps * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def measure_compile() -> dict[str, Any]:
    case = prepare(make_config(progress=False))  # the default job: DLG, lenet-dlg, batch 1
    dt = torch.float64
    sim = UpdateSimulator(case.model, case.update, dtype=dt)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(1, *case.model.input_shape, dtype=dt, generator=gen).requires_grad_(True)
    y = torch.randn(1, case.model.num_classes, dtype=dt, generator=gen).requires_grad_(True)

    def eager() -> tuple[torch.Tensor, ...]:  # what DLG's closure does
        return torch.autograd.grad(squared_l2(sim(x, y), sim.target), [x, y])

    module = sim.gradient.module
    params = {n: p.detach() for n, p in sim.gradient.params.items()}
    target = dict(zip(sim.names, sim.target))

    def loss(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(module, p, (xi,))
        return torch.mean(torch.sum(-F.softmax(yi, -1) * F.log_softmax(out, -1), -1))

    def objective(xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        g = grad(loss)(params, xi, yi)
        return sum(((g[n] - target[n]) ** 2).sum() for n in g)

    functional = grad(objective, argnums=(0, 1))
    compiled = torch.compile(functional, fullgraph=True)
    xd, yd = x.detach(), y.detach()
    t = time.perf_counter()
    first = compiled(xd, yd)
    compile_s = time.perf_counter() - t
    ref = eager()
    ms = _median_ms({"eager": eager, "compiled": lambda: compiled(xd, yd)}, rounds=5, reps=100)
    return {"what": "DLG evaluation, lenet-dlg batch 1 float64", "eager_ms": ms["eager"],
            "compiled_ms": ms["compiled"], "compile_s": compile_s, "speedup": ms["eager"] / ms["compiled"],
            "relative_difference": max(_rel(a, b) for a, b in zip(first, ref))}


def _ig_case() -> tuple[UpdateSimulator, torch.Tensor, torch.Tensor]:
    case = prepare(make_config(attack="ig", model="resnet18-cifar", batch_size=1, progress=False))
    sim = UpdateSimulator(case.model, case.update)
    labels = torch.tensor(case.truth.labels.tolist()) if case.truth is not None else torch.tensor([0])
    x = torch.randn(1, 1, *case.model.input_shape, generator=torch.Generator().manual_seed(0))
    return sim, x, labels


def _ig_step(sim: UpdateSimulator, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    xx = x.detach().requires_grad_(True)
    grads, _ = sim.batched(xx, labels)
    objective = sim.gradient.cosine(grads) + 0.1 * tv_l1_mean(xx)    # IG Eq. 4
    return torch.autograd.grad(objective.sum(), [xx])[0]


def measure_channels_last() -> dict[str, Any]:
    plain, x, labels = _ig_case()
    cl, _, _ = _ig_case()
    cl.gradient.module.to(memory_format=torch.channels_last)
    for n, p in list(cl.gradient.params.items()):
        if p.ndim == 4:
            cl.gradient.params[n] = p.detach().contiguous(memory_format=torch.channels_last).requires_grad_(True)
    ref, got = _ig_step(plain, x, labels), _ig_step(cl, x, labels)
    ms = _median_ms({"contiguous": lambda: _ig_step(plain, x, labels),
                     "channels_last": lambda: _ig_step(cl, x, labels)}, rounds=5, reps=2)
    return {"what": "IG step, resnet18-cifar batch 1 float32", "contiguous_ms": ms["contiguous"],
            "channels_last_ms": ms["channels_last"], "speedup": ms["contiguous"] / ms["channels_last"],
            "relative_difference": _rel(got, ref)}


def measure_bfloat16() -> dict[str, Any]:
    sim, x, labels = _ig_case()

    def amp() -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return _ig_step(sim, x, labels)
    ref, got = _ig_step(sim, x, labels), amp()
    ms = _median_ms({"float32": lambda: _ig_step(sim, x, labels), "bfloat16": amp}, rounds=5, reps=2)
    return {"what": "IG step, resnet18-cifar batch 1, CPU autocast bfloat16 vs float32",
            "float32_ms": ms["float32"], "bfloat16_ms": ms["bfloat16"], "speedup": ms["float32"] / ms["bfloat16"],
            "relative_difference": _rel(got, ref)}


class UnfoldConv2d(torch.nn.Module):
    """A Conv2d (groups 1, zero padding) as unfold + matmul, with the original's parameters."""

    def __init__(self, conv: torch.nn.Conv2d):
        super().__init__()
        if conv.groups != 1 or conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            raise ValueError("only groups=1, numeric zero padding")
        self.weight, self.bias = conv.weight, conv.bias
        self.k, self.s, self.p, self.d = conv.kernel_size, conv.stride, conv.padding, conv.dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        out = self.weight.flatten(1) @ F.unfold(x, self.k, dilation=self.d, padding=self.p, stride=self.s)
        if self.bias is not None:
            out = out + self.bias.unsqueeze(-1)
        ho = (h + 2 * self.p[0] - self.d[0] * (self.k[0] - 1) - 1) // self.s[0] + 1
        wo = (w + 2 * self.p[1] - self.d[1] * (self.k[1] - 1) - 1) // self.s[1] + 1
        return out.view(n, -1, ho, wo)


def _dlg_evaluation(batch: int, *, unfold: bool = False) -> Callable[[], tuple[torch.Tensor, ...]]:
    """DLG's evaluation as the attack's closure computes it (float64, soft label), batch ``batch``."""
    case = prepare(make_config(progress=False, batch_size=batch, allow_repeats=True))
    sim = UpdateSimulator(case.model, case.update, dtype=torch.float64)
    if unfold:
        module = sim.gradient.module
        for name, m in list(module.named_modules()):
            if isinstance(m, torch.nn.Conv2d):
                parent, _, leaf = name.rpartition(".")
                setattr(module.get_submodule(parent) if parent else module, leaf, UnfoldConv2d(m))
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(batch, *case.model.input_shape, dtype=torch.float64, generator=gen).requires_grad_(True)
    y = torch.randn(batch, case.model.num_classes, dtype=torch.float64, generator=gen).requires_grad_(True)
    return lambda: torch.autograd.grad(squared_l2(sim(x, y), sim.target), [x, y])


def measure_unfold() -> dict[str, Any]:
    out: dict[str, Any] = {"what": "DLG evaluation, lenet-dlg float64: convolutions as unfold + matmul vs torch's"}
    for batch, reps in ((1, 100), (4, 40)):
        conv, unf = _dlg_evaluation(batch), _dlg_evaluation(batch, unfold=True)
        rel = max(_rel(a, b) for a, b in zip(unf(), conv()))
        ms = _median_ms({"conv": conv, "unfold": unf}, rounds=5, reps=reps)
        out[f"batch_{batch}"] = {"conv_ms": ms["conv"], "unfold_ms": ms["unfold"],
                                 "speedup": ms["conv"] / ms["unfold"], "relative_difference": rel}
    return out


def measure_threads() -> dict[str, Any]:
    """Interleaved: each round times 1 thread then 2 threads (alternating order) on the same closure."""
    out: dict[str, Any] = {"what": "DLG evaluation, lenet-dlg float64: 1 vs 2 torch threads"}
    before = torch.get_num_threads()
    try:
        for batch, reps in ((1, 100), (2, 60), (4, 40), (8, 20), (16, 10)):
            f = _dlg_evaluation(batch)
            times: dict[int, list[float]] = {1: [], 2: []}
            for r in range(5):
                for n in ((1, 2) if r % 2 == 0 else (2, 1)):
                    torch.set_num_threads(n)
                    f()
                    t = time.perf_counter()
                    for _ in range(reps):
                        f()
                    times[n].append((time.perf_counter() - t) / reps * 1e3)
            one, two = statistics.median(times[1]), statistics.median(times[2])
            out[f"batch_{batch}"] = {"one_thread_ms": one, "two_threads_ms": two, "two_threads_speedup": one / two}
    finally:
        torch.set_num_threads(before)
    return out


MEASUREMENTS: dict[str, Callable[[], dict[str, Any]]] = {
    "compile": measure_compile, "channels_last": measure_channels_last, "bfloat16": measure_bfloat16,
    "unfold": measure_unfold, "threads": measure_threads,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("tried.json"))
    p.add_argument("--only", default=None, help=f"comma-separated subset of: {','.join(MEASUREMENTS)}")
    args = p.parse_args()
    names = list(MEASUREMENTS) if args.only is None else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in MEASUREMENTS]
    if unknown:
        p.error(f"unknown measurement(s) {', '.join(unknown)}; known: {', '.join(MEASUREMENTS)}")
    torch.set_num_threads(args.threads)
    res: dict[str, Any] = {}
    if args.only is not None and args.out.exists():
        res = json.loads(args.out.read_text())  # keep the entries not re-measured (each has its own date)
    now = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "torch": torch.__version__,
           "threads": args.threads, "cpus": os.cpu_count(), "python": platform.python_version(),
           "load_at_start": list(os.getloadavg())}
    if args.only is None:
        res.update(now)
    for name in names:
        fn = MEASUREMENTS[name]
        try:
            res[name] = fn()
        except Exception as exc:  # a path that does not run here is a result too
            res[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        if args.only is not None:
            res[name]["measured"] = {**now, "load_at_end": list(os.getloadavg())}
        print(name, json.dumps(res[name]), flush=True)
    if args.only is None:
        res["load_at_end"] = list(os.getloadavg())
    args.out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
