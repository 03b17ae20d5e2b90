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
* ``conv_split``: torch's double backward of a convolution (``_convolution_double_backward``)
  computes the weight term gW = conv(ggI, gO) whenever the gradient w.r.t. the layer's input
  gradient is defined, even when nothing asks for the weight's gradient (an attack differentiates
  w.r.t. the images only): one wasted weight-gradient convolution per layer but the first. The
  attacker's convolutions are replaced by ones whose first-order backward is two separate
  once-differentiable Functions (input gradient, weight gradient), so the second-order pass computes
  only what the images need; the same numbers. Measured on the three benchmark steps.

One measurement is of something kept:

* ``allocator``: gradleak.runtime.tune_allocator (glibc's mmap/trim thresholds, set by the first
  attack) vs glibc's defaults (GRADLEAK_ALLOCATOR=system): the same attacks in fresh processes,
  alternating, loop time and minor page faults.

    .venv/bin/python benchmarks/tried.py [--threads 1] [--only unfold,threads,conv_split,allocator] [--out benchmarks/tried.json]

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
from gradleak.attacks.labels import restore_labels
from gradleak.attacks.simulate import UpdateSimulator
from gradleak.config import make_config
from gradleak.pipeline import build_case


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
    case = build_case(make_config(attack="dlg", progress=False))  # the DLG job: lenet-dlg, batch 1
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
    case = build_case(make_config(attack="ig", model="resnet18-cifar", batch_size=1, progress=False))
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


def _dlg_evaluation(batch: int, *, unfold: bool = False, split: bool = False) -> Callable[[], tuple[torch.Tensor, ...]]:
    """DLG's evaluation as the attack's closure computes it (float64, soft label), batch ``batch``;
    ``unfold`` / ``split``: with the attacker's convolutions replaced (UnfoldConv2d / SplitConv2d)."""
    case = build_case(make_config(progress=False, batch_size=batch, allow_repeats=True))
    sim = UpdateSimulator(case.model, case.update, dtype=torch.float64)
    if split:
        _swap_convs(sim.gradient.module)
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


_conv_backward = torch.ops.aten.convolution_backward


class _ConvInputGrad(torch.autograd.Function):
    """dL/dx of a convolution from its output gradient gO (torch's kernel); backward: gO only."""

    @staticmethod
    def forward(ctx, go, x, w, conf):  # noqa: ANN001, ANN205
        stride, padding, dilation, groups = conf
        ctx.save_for_backward(go, w)
        ctx.conf = conf
        return _conv_backward(go, x, w, None, stride, padding, dilation, False, [0, 0], groups, [True, False, False])[0]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, ggi):  # noqa: ANN001, ANN205
        go, w = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conf
        d_go = F.conv2d(ggi, w, None, stride, padding, dilation, groups) if ctx.needs_input_grad[0] else None
        d_w = _conv_backward(go, ggi, w, None, stride, padding, dilation, False, [0, 0], groups,
                             [False, True, False])[1] if ctx.needs_input_grad[2] else None
        return d_go, None, d_w, None


class _ConvWeightGrad(torch.autograd.Function):
    """dL/dW of a convolution from gO and the input x; backward: gO and x."""

    @staticmethod
    def forward(ctx, go, x, w, conf):  # noqa: ANN001, ANN205
        stride, padding, dilation, groups = conf
        ctx.save_for_backward(go, x, w)
        ctx.conf = conf
        return _conv_backward(go, x, w, None, stride, padding, dilation, False, [0, 0], groups, [False, True, False])[1]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, ggw):  # noqa: ANN001, ANN205
        go, x, w = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conf
        d_go = F.conv2d(x, ggw, None, stride, padding, dilation, groups) if ctx.needs_input_grad[0] else None
        d_x = _conv_backward(go, x, ggw, None, stride, padding, dilation, False, [0, 0], groups,
                             [True, False, False])[0] if ctx.needs_input_grad[1] else None
        return d_go, d_x, None, None


class _SplitConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, conf):  # noqa: ANN001, ANN205
        stride, padding, dilation, groups = conf
        ctx.save_for_backward(x, w)
        ctx.conf, ctx.has_bias = conf, b is not None
        return F.conv2d(x, w, b, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, go):  # noqa: ANN001, ANN205
        x, w = ctx.saved_tensors
        gx = _ConvInputGrad.apply(go, x, w, ctx.conf) if ctx.needs_input_grad[0] else None
        gw = _ConvWeightGrad.apply(go, x, w, ctx.conf) if ctx.needs_input_grad[1] else None
        gb = go.sum((0, 2, 3)) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb, None


class SplitConv2d(torch.nn.Module):
    """A Conv2d whose double backward skips torch's unneeded weight term (same parameters)."""

    def __init__(self, conv: torch.nn.Conv2d):
        super().__init__()
        self.weight, self.bias = conv.weight, conv.bias
        self.conf = (list(conv.stride), list(conv.padding), list(conv.dilation), conv.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SplitConv.apply(x, self.weight, self.bias, self.conf)


def _swap_convs(module: torch.nn.Module) -> None:
    for name, m in list(module.named_modules()):
        if type(m) is torch.nn.Conv2d:
            parent, _, leaf = name.rpartition(".")
            setattr(module.get_submodule(parent) if parent else module, leaf, SplitConv2d(m))


def _image_step(model: str, batch: int, split: bool) -> Callable[[], torch.Tensor]:
    """The IG step (cosine + TV) on ``model``, one candidate, as the attack computes it."""
    case = build_case(make_config(attack="ig", model=model, batch_size=batch, progress=False))
    sim = UpdateSimulator(case.model, case.update)
    if split:
        _swap_convs(sim.gradient.module)
    labels = restore_labels(case.update, case.model, batch, "gradinversion")
    x = torch.randn(1, batch, *case.model.input_shape, generator=torch.Generator().manual_seed(0))
    return lambda: _ig_step(sim, x, labels)


def measure_conv_split() -> dict[str, Any]:
    out: dict[str, Any] = {"what": "attack step with the conv double backward split (no unneeded weight term) vs torch's"}
    cases: dict[str, tuple[Callable[[], Any], Callable[[], Any], int]] = {
        "lenet-dlg DLG float64 batch 1": (_dlg_evaluation(1), _dlg_evaluation(1, split=True), 100)}
    for model, batch, reps in (("convnet", 4, 5), ("resnet18-cifar", 1, 2)):
        cases[f"{model} IG step batch {batch}"] = (_image_step(model, batch, False), _image_step(model, batch, True), reps)
    for label, (plain, split, reps) in cases.items():
        a, b = split(), plain()
        a, b = (a,) if isinstance(a, torch.Tensor) else a, (b,) if isinstance(b, torch.Tensor) else b
        rel = max(_rel(u, v) for u, v in zip(a, b))
        ms = _median_ms({"torch": plain, "split": split}, rounds=5, reps=reps)
        out[label] = {"torch_ms": ms["torch"], "split_ms": ms["split"], "speedup": ms["torch"] / ms["split"],
                      "relative_difference": rel}
    return out


_ALLOCATOR_RUN = """
import json, resource, sys, torch
torch.set_num_threads(int(sys.argv[2]))
from gradleak.attacks import Engine
from gradleak.config import make_config
from gradleak.pipeline import build_case
from gradleak.runtime import allocator
cfg = make_config(progress=False, **json.loads(sys.argv[1]))
case = build_case(cfg)
typed = case.attack_config(cfg)
engine = Engine(device=torch.device("cpu"), log_every=cfg.log_every, progress=False)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rec = engine.run(typed, case.update, case.model)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
# peak resident memory of this process (VmHWM; ru_maxrss would include the parent's, inherited at fork)
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"loop_s": rec.wall_seconds, "faults": faults, "max_rss_mb": hwm / 1024, "allocator": allocator()}))
"""


def measure_allocator(rounds: int = 3) -> dict[str, Any]:
    """Each attack in fresh processes, glibc's defaults vs tuned, order alternating per round."""
    import subprocess
    import sys

    cases = {
        "IG resnet18-cifar batch 1, 20 it.": dict(attack="ig", model="resnet18-cifar", batch_size=1, iterations=20),
        # the cpu preset's BN prior "exact" needs the client's BN statistics in the update
        "GradInversion convnet batch 4, 4 seeds, 30 it.": dict(attack="gradinversion", model="convnet", batch_size=4,
                                                              iterations=30, preset="cpu", share_bn_statistics=True),
        "DLG lenet-dlg batch 1, 60 it.": dict(attack="dlg", iterations=60),
    }
    out: dict[str, Any] = {"what": "attack loop time, glibc's allocator defaults (GRADLEAK_ALLOCATOR=system) vs "
                                   "gradleak.runtime.tune_allocator, fresh processes"}
    for label, kw in cases.items():
        runs: dict[str, list[dict[str, Any]]] = {"system": [], "tuned": []}
        for r in range(rounds):
            for mode in (("system", "tuned") if r % 2 == 0 else ("tuned", "system")):
                env = {**os.environ, "GRADLEAK_ALLOCATOR": "system" if mode == "system" else ""}
                proc = subprocess.run([sys.executable, "-c", _ALLOCATOR_RUN, json.dumps(kw), str(torch.get_num_threads())],
                                      capture_output=True, text=True, env=env, check=True)
                runs[mode].append(json.loads(proc.stdout.strip().splitlines()[-1]))
        med = {m: {k: statistics.median(x[k] for x in v) for k in ("loop_s", "faults", "max_rss_mb")}
               for m, v in runs.items()}
        out[label] = {"system": med["system"], "tuned": med["tuned"],
                      "speedup": med["system"]["loop_s"] / med["tuned"]["loop_s"],
                      "loop_s_rounds": {m: [round(x["loop_s"], 3) for x in v] for m, v in runs.items()},
                      "allocator_states": sorted({x["allocator"] for v in runs.values() for x in v})}
    return out


MEASUREMENTS: dict[str, Callable[[], dict[str, Any]]] = {
    "compile": measure_compile, "channels_last": measure_channels_last, "bfloat16": measure_bfloat16,
    "unfold": measure_unfold, "threads": measure_threads, "conv_split": measure_conv_split,
    "allocator": measure_allocator,
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
