"""gradleak.optim: torch's Adam / SGD / Optimizer methods without the torch._dynamo import.

The same steps as torch's classes (bit for bit), state_dict round trips, and in a fresh process
DLG, Inverting Gradients and GradInversion with one seed, and the RPSNR registration, never
import torch._dynamo (2-3.5 s on this CPU). With G > 1 candidates torch.func.grad (under vmap)
imports it itself, which gradleak cannot avoid."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from gradleak.optim import SGD, Adam


def _trajectory(make, steps: int = 25):  # noqa: ANN001, ANN202
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(12, generator=gen, dtype=torch.float64).requires_grad_(True)
    target = torch.randn(12, generator=gen, dtype=torch.float64)
    opt = make([x])
    out = []
    for i in range(steps):
        opt.param_groups[0]["lr"] = 0.05 * (1 - 0.5 * i / steps)  # a changing lr, as the attacks use
        opt.zero_grad(set_to_none=True)
        ((x - target) ** 4).sum().backward()
        opt.step()
        out.append(x.detach().clone())
    return torch.stack(out), opt


@pytest.mark.parametrize("ours, theirs", [
    (lambda p: Adam(p, lr=0.05), lambda p: torch.optim.Adam(p, lr=0.05)),
    (lambda p: SGD(p, lr=0.05, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
], ids=["adam", "sgd"])
def test_same_steps_as_torch(ours, theirs) -> None:  # noqa: ANN001
    a, opt_a = _trajectory(ours)
    b, opt_b = _trajectory(theirs)
    assert torch.equal(a, b)
    assert (a[-1] - a[0]).abs().max() > 0.1  # it moved
    sa, sb = opt_a.state_dict(), opt_b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for k in sb["state"][0]:
        assert torch.equal(torch.as_tensor(sa["state"][0][k]), torch.as_tensor(sb["state"][0][k]))


def test_state_dict_round_trip_continues_identically() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, generator=gen).requires_grad_(True)

    def step(opt) -> None:  # noqa: ANN001
        opt.zero_grad()
        (x ** 2).sum().backward()
        opt.step()

    opt = Adam([x], lr=0.1)
    for _ in range(3):
        step(opt)
    saved, x_saved = copy.deepcopy(opt.state_dict()), x.detach().clone()  # state_dict shares the live tensors
    for _ in range(3):
        step(opt)
    after = x.detach().clone()
    with torch.no_grad():
        x.copy_(x_saved)
    fresh = Adam([x], lr=0.1)
    fresh.load_state_dict(saved)
    for _ in range(3):
        step(fresh)
    assert torch.equal(x.detach(), after)


def test_differentiable_is_refused() -> None:
    x = torch.zeros(2, requires_grad=True)
    opt = Adam([x], lr=0.1, differentiable=True)
    with pytest.raises(ValueError, match="differentiable"):
        opt.step()


def test_one_candidate_attacks_and_registration_do_not_import_torch_dynamo() -> None:
    code = (
        "import sys, torch\n"
        "from gradleak.config import make_config\n"
        "from gradleak.pipeline import build_case as prepare\n"
        "from gradleak.attacks import Engine\n"
        "from gradleak.pipeline import attack_update\n"
        "from gradleak.metrics.paper import registered_psnr\n"
        "def run(**kw):\n"
        "    cfg = make_config(progress=False, **kw)\n"
        "    case = prepare(cfg)\n"
        "    return Engine().run(case.attack_config(cfg), case.update, case.model)\n"
        "assert run(attack='dlg', iterations=2).iterations == 2\n"
        "assert run(attack='gradinversion', model='convnet', width=4, batch_size=2, seeds=1, preset='cpu',\n"
        "           group='none', iterations=2).iterations == 2\n"
        "assert run(attack='ig', model='convnet', width=4, iterations=2).iterations == 2\n"
        "x = torch.rand(2, 3, 32, 32)\n"
        "registered_psnr(x.roll(1, -1), x, iterations=3)\n"
        "print('dynamo' if 'torch._dynamo' in sys.modules else 'clean')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "clean"
