"""The loop's part of every snapshot: taking it, checking a saved one against this run, putting
it back, saving it when a signal arrives, and resuming a pending one."""

from __future__ import annotations

import time
import typing
from typing import Any

import torch

from .session import Interrupted, Session
from .settings import LoopResult, LoopSettings
from .state import Snapshot, StateFileError, StateHooks, pack, unpack


class LoopState:
    """The loop's own state (what a snapshot's "loop" section holds), its snapshot and restore,
    the checks a saved one must pass, and what happens on SIGINT/SIGTERM and on resume."""

    def __init__(self, variables: list[torch.Tensor], opt: torch.optim.Optimizer, settings: LoopSettings,
                 generator: torch.Generator | None, hooks: StateHooks | None, session: Session, phase: str):
        self.variables, self.opt, self.settings, self.generator = variables, opt, settings, generator
        self.hooks, self.session, self.phase = hooks, session, phase
        self.result = LoopResult()
        self.lr_scale = 1.0
        self.retries_used = 0

    def snapshot(self) -> Snapshot:
        tensors: dict[str, torch.Tensor] = {}
        r = self.result
        with torch.no_grad():
            loop = {
                "variables": list(self.variables),
                "optimizer": self.opt.state_dict()["state"],
                "generator": self.generator.get_state() if self.generator is not None else None,
                "rng": torch.get_rng_state(),
                "history_loss": torch.tensor([h["loss"] for h in r.history], dtype=torch.float64),
                "iterations": r.iterations, "final_loss": r.final_loss, "wall_seconds": r.wall_seconds,
                "lr_scale": self.lr_scale, "retries_used": self.retries_used,
                "recoveries": [dict(e) for e in r.recoveries],
                "optimizer_name": self.settings.optimizer, "total": self.settings.iterations,
            }
            tree = {"loop": pack(loop, tensors, "loop"),
                    "attack": pack(self.hooks.get_state(), tensors, "attack") if self.hooks is not None else None,
                    "providers": {name: pack(h.get_state(), tensors, f"providers/{name}")
                                  for name, h in self.session.providers.items()},
                    "session": pack(self.session.record(), tensors, "session")}
        return Snapshot(phase=self.phase, step=r.iterations, tree=tree, tensors=tensors)

    def restore(self, snap: Snapshot, *, from_disk: bool) -> None:
        """Put ``snap`` back. From disk every part is checked against this run first and any
        mismatch is a StateFileError; in memory (divergence) the session record is kept."""
        tree = snap.tree
        if not isinstance(tree, dict) or not isinstance(tree.get("loop"), dict):
            raise StateFileError("the saved state has no loop section")
        loop = unpack(tree["loop"], snap.tensors, clone=True)
        if from_disk:
            self._check(loop)
        with torch.no_grad():
            for v, saved in zip(self.variables, loop["variables"], strict=True):
                v.copy_(saved.to(v.device))
            state = {int(k): v for k, v in loop["optimizer"].items()}
            self.opt.load_state_dict({"state": state, "param_groups": self.opt.state_dict()["param_groups"]})
            if self.generator is not None:
                self.generator.set_state(loop["generator"])
            torch.set_rng_state(loop["rng"])
        r = self.result
        losses = loop["history_loss"].tolist()
        r.history = [{"iteration": i + 1, "loss": float(v)} for i, v in enumerate(losses)]
        r.iterations, r.final_loss = int(loop["iterations"]), float(loop["final_loss"])
        r.wall_seconds = float(loop["wall_seconds"])
        r.recoveries = list(loop["recoveries"])
        self.lr_scale, self.retries_used = float(loop["lr_scale"]), int(loop["retries_used"])
        attack = unpack(tree.get("attack"), snap.tensors, clone=True)
        if self.hooks is not None:
            if not isinstance(attack, dict):
                raise StateFileError("the saved state lacks the attack's own state")
            with torch.no_grad():
                self.hooks.set_state(attack)
        providers = tree.get("providers") or {}
        if not isinstance(providers, dict):
            raise StateFileError("the saved state's providers section is malformed")
        for name, h in self.session.providers.items():
            if name in providers:
                h.set_state(unpack(providers[name], snap.tensors, clone=True))
        if from_disk:
            self.session.restore_record(unpack(tree.get("session"), snap.tensors, clone=True))

    def _check(self, loop: dict[str, Any]) -> None:
        """Everything a saved loop section must satisfy before any of it is used (the first
        misfit is reported)."""
        need = ("variables", "optimizer", "generator", "rng", "history_loss", "iterations", "final_loss",
                "wall_seconds", "lr_scale", "retries_used", "recoveries", "optimizer_name", "total")
        missing = [k for k in need if k not in loop]
        if missing:
            _unfit(f"missing {', '.join(missing)}")
        if loop["optimizer_name"] != self.settings.optimizer or loop["total"] != self.settings.iterations:
            _unfit(f"saved for {loop['optimizer_name']!r} x {loop['total']} steps, this run is "
                   f"{self.settings.optimizer!r} x {self.settings.iterations}")
        self._check_variables(loop["variables"])
        self._check_optimizer(loop["optimizer"])
        self._check_generators(loop["generator"], loop["rng"])
        self._check_progress(loop)

    def _check_variables(self, saved: Any) -> None:
        if not isinstance(saved, list) or len(saved) != len(self.variables):
            _unfit("wrong number of optimised variables")
        for i, (v, s) in enumerate(zip(self.variables, saved, strict=True)):
            if not isinstance(s, torch.Tensor) or s.shape != v.shape or s.dtype != v.dtype:
                got = f"{list(s.shape)} {s.dtype}" if isinstance(s, torch.Tensor) else type(s).__name__
                _unfit(f"variable {i} is {got}, expected {list(v.shape)} {v.dtype}")

    def _check_optimizer(self, opt_state: Any) -> None:
        """The optimizer's per-parameter state: known parameters, tensors of the shapes its
        algorithm keeps, plain numbers otherwise."""
        numel = sum(v.numel() for v in self.variables)
        if not isinstance(opt_state, dict):
            _unfit("optimizer state is not a mapping")
        for k, st in opt_state.items():
            if not (isinstance(k, (int, str)) and str(k).isdigit() and int(k) < len(self.variables)) \
                    or not isinstance(st, dict):
                _unfit(f"optimizer state for an unknown parameter {k!r}")
            shape = self.variables[int(k)].shape
            for name, value in st.items():
                self._check_optimizer_value(value, f"{k}.{name}", shape, numel)

    def _check_optimizer_value(self, value: Any, where: str, shape: torch.Size, numel: int) -> None:
        if isinstance(value, torch.Tensor):
            m = self.settings.lbfgs_history
            ok = value.ndim == 0 or value.shape == shape or (value.ndim == 1 and value.numel() == numel) \
                or value.shape == (m, numel) \
                or (value.ndim == 2 and value.shape[0] == value.shape[1] <= m)  # L-BFGS history (lbfgs.py)
            if not ok or not (value.is_floating_point() or value.dtype in (torch.int64, torch.int32)):
                _unfit(f"optimizer tensor {where} has shape {list(value.shape)} {value.dtype}")
        elif isinstance(value, (list, tuple)):
            for j, item in enumerate(value):
                self._check_optimizer_value(item, f"{where}[{j}]", shape, numel)
        elif not (value is None or isinstance(value, (int, float))):
            _unfit(f"optimizer value {where} is a {type(value).__name__}")

    def _check_generators(self, generator: Any, rng: Any) -> None:
        gen_size = torch.Generator().get_state().numel()
        for name, g in (("generator", generator), ("rng", rng)):
            if name == "generator" and (g is None) != (self.generator is None):
                _unfit("generator present in one of state and run only")
            if g is not None and (not isinstance(g, torch.Tensor) or g.dtype != torch.uint8 or g.shape != (gen_size,)):
                _unfit(f"{name} state is not a CPU generator state")

    def _check_progress(self, loop: dict[str, Any]) -> None:
        """The steps taken, their losses, and the divergence record."""
        hist = loop["history_loss"]
        if not isinstance(hist, torch.Tensor) or hist.dtype != torch.float64 or hist.ndim != 1:
            _unfit("history is not a float64 vector")
        it = loop["iterations"]
        if not (isinstance(it, int) and 0 <= it <= self.settings.iterations and hist.numel() == it):
            _unfit(f"step {it!r} does not fit {self.settings.iterations} iterations and {hist.numel()} history entries")
        for key in ("final_loss", "wall_seconds", "lr_scale"):
            if not isinstance(loop[key], (int, float)) or isinstance(loop[key], bool):
                _unfit(f"{key} is not a number")
        if not (0 < loop["lr_scale"] <= 1) or not isinstance(loop["retries_used"], int) \
                or not isinstance(loop["recoveries"], list):
            _unfit("divergence record is malformed")

    def interrupt(self, t: int, start: float) -> typing.NoReturn:
        """SIGINT/SIGTERM arrived: save the state after the last finished step (step ``t``) and stop."""
        session = self.session
        self.result.wall_seconds = time.perf_counter() - start
        if session.directory is not None:
            session.save(self.snapshot())
        raise Interrupted(session.interrupted, session.scope + self.phase, t, session.directory, session.resume_hint)

    def resume_pending(self) -> None:
        """Restore the session's pending state of this phase, if any (a StateFileError when it
        does not fit this run)."""
        session = self.session
        pending = session.take_pending(self.phase)
        if pending is None:
            return
        where = f"saved state {session.directory}: " if session.directory is not None else ""
        try:
            self.restore(pending, from_disk=True)
        except StateFileError as exc:
            raise StateFileError(f"{where}{exc}") from None
        except (RuntimeError, ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as exc:
            raise StateFileError(f"{where}it does not fit this run: {exc}") from None
        session.resumed_at.append({"phase": self.phase, "iteration": self.result.iterations})


def _unfit(what: str) -> typing.NoReturn:
    raise StateFileError(f"the saved state does not fit this run: {what}")


__all__ = ["LoopState"]
