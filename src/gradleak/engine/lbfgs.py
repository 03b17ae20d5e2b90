"""L-BFGS with the compact inverse-Hessian representation (Byrd, Nocedal & Schnabel 1994): torch's
L-BFGS, step for step, in a handful of vector operations per evaluation instead of ~4 x history_size."""

from __future__ import annotations

import torch
from torch.optim.lbfgs import _strong_wolfe

from ..optim import EagerOptimizer

CURVATURE_MIN = 1e-10  # torch's threshold on y^T s for keeping a pair


class CompactLBFGS(EagerOptimizer, torch.optim.LBFGS):
    """Drop-in replacement for ``torch.optim.LBFGS`` (same arguments, same algorithm). Its
    bookkeeping methods are torch's without the torch._dynamo import (gradleak.optim)."""

    # ------------------------------------------------------------------ history
    @staticmethod
    def _rows(state: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(S rows, Y rows, order): the buffer rows in use (physical order, no copy) and, for
        each stored pair oldest first, its row in them."""
        m, count, start = state["S"].shape[0], state["count"], state["start"]
        if count < m:  # not wrapped yet: physical order is chronological (start is 0)
            return state["S"][:count], state["Y"][:count], torch.arange(count, device=state["S"].device)
        return state["S"], state["Y"], (torch.arange(m, device=state["S"].device) + start) % m

    def _push(self, state: dict, s: torch.Tensor, y: torch.Tensor) -> None:
        m, count = state["S"].shape[0], state["count"]
        if count == m:  # drop the oldest pair: its slot takes the new one
            slot = state["start"]
            state["start"] = (slot + 1) % m
            count -= 1
            sy, yy = state["SY"][1:, 1:], state["YY"][1:, 1:]
        else:
            slot = count
            sy, yy = state["SY"], state["YY"]
        state["S"][slot].copy_(s)
        state["Y"][slot].copy_(y)
        state["count"] = count + 1
        S, Y, order = self._rows(state)
        # S^T Y and Y^T Y grow by one row and column (the new pair is last in chronological order)
        s_y_col = (S @ y)[order]          # s_i^T y, the new pair's s^T y last
        s_y_row = (Y @ s)[order]          # s^T y_j
        y_y = (Y @ y)[order]
        k = count + 1
        new_sy = sy.new_empty((k, k))
        new_sy[:count, :count] = sy
        new_sy[:, count] = s_y_col
        new_sy[count, :] = s_y_row
        new_yy = yy.new_empty((k, k))
        new_yy[:count, :count] = yy
        new_yy[:, count] = y_y
        new_yy[count, :] = y_y
        state["SY"], state["YY"] = new_sy, new_yy

    def _direction(self, state: dict, g: torch.Tensor, gamma: torch.Tensor | float) -> torch.Tensor:
        """d = -H_k g (Byrd, Nocedal & Schnabel 1994, Theorem 2.2)."""
        if state["count"] == 0:
            return g.neg().mul_(gamma)
        S, Y, order = self._rows(state)
        a, b = (S @ g)[order], (Y @ g)[order]
        sy = state["SY"]
        R = torch.triu(sy)
        u = torch.linalg.solve_triangular(R, a.unsqueeze(1), upper=True).squeeze(1)
        rhs = torch.diagonal(sy) * u + gamma * (state["YY"] @ u) - gamma * b
        p = torch.linalg.solve_triangular(R.T, rhs.unsqueeze(1), upper=False).squeeze(1)
        # back to buffer rows: H_k g = gamma g + S^T p - gamma Y^T u
        p_rows, u_rows = torch.empty_like(p), torch.empty_like(u)
        p_rows[order], u_rows[order] = p, u
        return (g * gamma).add_(p_rows @ S).sub_((u_rows @ Y) * gamma).neg_()

    @staticmethod
    def _allocate_history(state: dict, flat_grad: torch.Tensor, history_size: int) -> None:
        """The empty ring buffers [m, n] of the pairs and the empty S^T Y, Y^T Y."""
        n = flat_grad.numel()
        state["S"] = flat_grad.new_zeros((history_size, n))
        state["Y"] = flat_grad.new_zeros((history_size, n))
        state["SY"] = flat_grad.new_zeros((0, 0))
        state["YY"] = flat_grad.new_zeros((0, 0))
        state["count"], state["start"] = 0, 0

    def _next_direction(self, state: dict, flat_grad: torch.Tensor, prev_flat_grad: torch.Tensor | None,
                        d: torch.Tensor | None, t: float | None,
                        gamma: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor | float]:
        """(d, gamma) of this iteration: steepest descent on the first (history cleared), else
        the last step's pair (s = t d, y = change of the gradient) joins the history when it
        passes the curvature test, and d = -H_k g."""
        if state["n_iter"] == 1:
            state["count"], state["start"] = 0, 0
            return flat_grad.neg(), 1.0
        y = flat_grad.sub(prev_flat_grad)
        s = d.mul(t)
        ys = y.dot(s)
        if ys > CURVATURE_MIN:
            self._push(state, s, y)
            gamma = ys / y.dot(y)
        return self._direction(state, flat_grad, gamma), gamma

    def _move(self, closure, group: dict, loss: float, flat_grad: torch.Tensor, t: float,  # noqa: ANN001
              d: torch.Tensor, gtd: torch.Tensor, max_ls: int, last: bool) -> tuple:
        """x += t d: with torch's strong Wolfe line search (at most ``max_ls`` evaluations), or the
        fixed step t, then the objective again unless this is the ``last`` iteration. Returns
        (loss, flat_grad, t, evaluations, opt_cond) after the move."""
        tolerance_grad, line_search_fn = group["tolerance_grad"], group["line_search_fn"]
        if line_search_fn is not None:
            if line_search_fn != "strong_wolfe":
                raise RuntimeError("only 'strong_wolfe' is supported")
            x_init = self._clone_param()

            def obj_func(x, t, d):  # noqa: ANN001, ANN202
                return self._directional_evaluate(closure, x, t, d)

            loss, flat_grad, t, ls_func_evals = _strong_wolfe(obj_func, x_init, t, d, loss, flat_grad, gtd,
                                                              max_ls=max_ls)
            self._add_grad(t, d)
            return loss, flat_grad, t, ls_func_evals, flat_grad.abs().max() <= tolerance_grad
        self._add_grad(t, d)
        if last:
            return loss, flat_grad, t, 0, False
        with torch.enable_grad():
            loss = float(closure())
        flat_grad = self._gather_flat_grad()
        return loss, flat_grad, t, 1, flat_grad.abs().max() <= tolerance_grad

    # ------------------------------------------------------------------ step
    @torch.no_grad()
    def step(self, closure):  # type: ignore[override]  # noqa: ANN001, ANN201
        group = self.param_groups[0]
        lr = float(group["lr"])
        max_iter, max_eval = group["max_iter"], group["max_eval"]
        tolerance_grad, tolerance_change = group["tolerance_grad"], group["tolerance_change"]
        history_size = group["history_size"]
        if group.get("maximize", False):
            raise ValueError("CompactLBFGS minimises; maximize=True is not supported")
        closure = torch.enable_grad()(closure)

        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)

        orig_loss = closure()
        loss = float(orig_loss)
        current_evals = 1
        state["func_evals"] += 1
        flat_grad = self._gather_flat_grad()
        if flat_grad.abs().max() <= tolerance_grad:
            return orig_loss

        d, t = state.get("d"), state.get("t")
        gamma = state.get("H_diag", 1.0)
        prev_flat_grad, prev_loss = state.get("prev_flat_grad"), state.get("prev_loss")
        if "S" not in state:
            self._allocate_history(state, flat_grad, history_size)

        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1
            d, gamma = self._next_direction(state, flat_grad, prev_flat_grad, d, t, gamma)

            if prev_flat_grad is None:
                prev_flat_grad = flat_grad.clone(memory_format=torch.contiguous_format)
            else:
                prev_flat_grad.copy_(flat_grad)
            prev_loss = loss

            t = min(1.0, 1.0 / float(flat_grad.abs().sum())) * lr if state["n_iter"] == 1 else lr
            gtd = flat_grad.dot(d)
            if gtd > -tolerance_change:
                break

            loss, flat_grad, t, ls_func_evals, opt_cond = self._move(closure, group, loss, flat_grad, t, d, gtd,
                                                                     max_eval - current_evals, n_iter == max_iter)
            current_evals += ls_func_evals
            state["func_evals"] += ls_func_evals

            if n_iter == max_iter or current_evals >= max_eval or opt_cond:
                break
            if d.mul(t).abs().max() <= tolerance_change:
                break
            if abs(loss - prev_loss) < tolerance_change:
                break

        state.update(d=d, t=t, H_diag=gamma, prev_flat_grad=prev_flat_grad, prev_loss=prev_loss)
        return orig_loss


__all__ = ["CompactLBFGS"]
