"""CompactLBFGS (engine/lbfgs.py) is torch's L-BFGS with the direction in compact form: same
trajectories to rounding, with the history wrapping around, with and without line search, and
its state survives a state_dict round trip (resume)."""

from __future__ import annotations

import copy

import pytest
import torch

from gradleak.engine.lbfgs import CompactLBFGS

N = 30


def _problem(kind: str):  # noqa: ANN202
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(N, N, generator=gen, dtype=torch.float64)
    a = a @ a.T / N + 0.1 * torch.eye(N, dtype=torch.float64)
    b = torch.randn(N, generator=gen, dtype=torch.float64)

    def f(x: torch.Tensor) -> torch.Tensor:
        if kind == "quadratic":
            return 0.5 * x @ a @ x - b @ x
        return ((1 - x[:-1]) ** 2).sum() + 10 * ((x[1:] - x[:-1] ** 2) ** 2).sum()  # Rosenbrock
    return f


def _trajectory(cls, kind: str, line_search: str | None, steps: int = 12, history: int = 4):  # noqa: ANN001, ANN202
    f = _problem(kind)
    x = torch.zeros(N, dtype=torch.float64, requires_grad=True)
    opt = cls([x], lr=0.5 if line_search is None else 1.0, max_iter=7, history_size=history,
              line_search_fn=line_search)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = f(x)
        loss.backward()
        return loss.detach()
    points = []
    for _ in range(steps):
        opt.step(closure)
        points.append(x.detach().clone())
    return torch.stack(points), opt


@pytest.mark.parametrize("kind", ["quadratic", "rosenbrock"])
@pytest.mark.parametrize("line_search", [None, "strong_wolfe"])
def test_same_trajectory_as_torch_lbfgs(kind, line_search):
    ref, ref_opt = _trajectory(torch.optim.LBFGS, kind, line_search)
    ours, opt = _trajectory(CompactLBFGS, kind, line_search)
    assert opt.state[opt._params[0]]["count"] == 4            # the history wrapped around (84 evaluations, 4 kept)
    assert ref_opt.state[ref_opt._params[0]]["func_evals"] == opt.state[opt._params[0]]["func_evals"]
    # Rosenbrock with a line search branches on comparisons, so rounding may grow a little there
    tol = 1e-3 if (kind, line_search) == ("rosenbrock", "strong_wolfe") else 1e-9
    assert float((ref - ours).abs().max()) < tol
    assert float((ref[0] - ours[0]).abs().max()) < 1e-12      # first step: identical to rounding
    assert float(ours[-1].abs().max()) > 0.1                   # it moved (the comparison is not of two zeros)


def test_state_dict_round_trip_continues_identically():
    f = _problem("rosenbrock")

    def make(x: torch.Tensor) -> CompactLBFGS:
        return CompactLBFGS([x], lr=0.5, max_iter=5, history_size=3)

    def closure_for(x: torch.Tensor, opt: CompactLBFGS):  # noqa: ANN202
        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = f(x)
            loss.backward()
            return loss.detach()
        return closure

    x = torch.zeros(N, dtype=torch.float64, requires_grad=True)
    opt = make(x)
    for _ in range(4):
        opt.step(closure_for(x, opt))
    saved_x, saved = x.detach().clone(), copy.deepcopy(opt.state_dict())  # the loop's snapshots clone too
    for _ in range(4):
        opt.step(closure_for(x, opt))
    y = saved_x.clone().requires_grad_(True)
    opt2 = make(y)
    opt2.load_state_dict(saved)
    for _ in range(4):
        opt2.step(closure_for(y, opt2))
    assert torch.equal(x.detach(), y.detach())

