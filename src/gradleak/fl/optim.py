"""The FedAvg client's local optimizer, written out as torch.optim documents it, as pure tensor
functions: the client runs it, and the attacker differentiates through it (fl.unroll)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ConfigError

OPTIMIZERS = ("sgd", "adam", "adamw")
State = dict[str, dict[str, torch.Tensor]]


def _sqrt(v: torch.Tensor) -> torch.Tensor:
    """sqrt(v) for v >= 0 whose derivative at v = 0 is 0, not inf * 0 = NaN (a parameter whose
    gradient is exactly 0 in some step, e.g. behind a dead ReLU); the values are torch's sqrt."""
    positive = v > 0
    return torch.where(positive, torch.where(positive, v, torch.ones_like(v)).sqrt(), torch.zeros_like(v))


@dataclass(frozen=True)
class LocalOptimizer:
    """One of torch.optim's SGD, Adam, AdamW with the constants a server announces.

    sgd:   torch.optim.SGD(lr, momentum, dampening=0, weight_decay, nesterov)
    adam:  torch.optim.Adam(lr, betas, eps, weight_decay)  (L2 added to the gradient)
    adamw: torch.optim.AdamW(lr, betas, eps, weight_decay) (decoupled weight decay)
    amsgrad, maximize, and SGD's dampening are torch's defaults (off, 0)."""

    name: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ConfigError(f"local optimizer {self.name!r}; known: {', '.join(OPTIMIZERS)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError("local_lr must be a positive number")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"local_momentum {self.momentum} is not in [0, 1)")
        if self.nesterov and self.momentum == 0:  # torch.optim.SGD refuses it too
            raise ConfigError("local_nesterov needs a local_momentum above 0")
        if not 0 <= self.weight_decay <= 1:
            raise ConfigError(f"local_weight_decay {self.weight_decay} is not in [0, 1]")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"local_betas {tuple(self.betas)} are not two numbers in [0, 1)")
        if not 0 < self.eps <= 1:
            raise ConfigError(f"local_eps {self.eps} is not in (0, 1]")
        if self.name != "sgd" and (self.momentum or self.nesterov):
            raise ConfigError(f"local_momentum and local_nesterov apply to --local-optimizer sgd, not {self.name}")

    @property
    def is_plain_sgd(self) -> bool:
        """W <- W - lr * g: what gradleak's FedAvg client was before optimizers were modelled."""
        return self.name == "sgd" and self.momentum == 0 and self.weight_decay == 0

    def init(self, params: dict[str, torch.Tensor]) -> State:
        """The optimizer state before the first step (empty: created at step 1, as torch does)."""
        return {n: {} for n in params}

    def step(self, params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], state: State,
             t: int) -> tuple[dict[str, torch.Tensor], State]:
        """Step t (1-based) of the documented algorithm; returns (new params, new state). No
        in-place operation, so the caller may differentiate through it (or vmap it)."""
        new_p, new_s = {}, {}
        for n, w in params.items():
            new_p[n], new_s[n] = (self._sgd if self.name == "sgd" else self._adam)(w, grads[n], state[n], t)
        return new_p, new_s

    def _sgd(self, w: torch.Tensor, g: torch.Tensor, s: dict[str, torch.Tensor],
             t: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        # torch.optim.SGD documentation, "Algorithm" (dampening tau = 0):
        #   g_t <- g_t + lambda * theta_{t-1}                 if lambda != 0
        #   b_t <- g_t (t = 1), mu * b_{t-1} + (1 - tau) g_t  if mu != 0
        #   g_t <- g_t + mu * b_t (nesterov) else b_t
        #   theta_t <- theta_{t-1} - gamma * g_t
        if self.weight_decay:
            g = g + self.weight_decay * w
        if self.momentum:
            b = g if t == 1 else self.momentum * s["momentum_buffer"] + g
            s = {"momentum_buffer": b}
            g = g + self.momentum * b if self.nesterov else b
        return w - self.lr * g, s

    def _adam(self, w: torch.Tensor, g: torch.Tensor, s: dict[str, torch.Tensor],
              t: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        # torch.optim.Adam / AdamW documentation, "Algorithm" (amsgrad off):
        #   AdamW: theta_t <- theta_{t-1} - gamma * lambda * theta_{t-1}
        #   Adam:  g_t <- g_t + lambda * theta_{t-1}          if lambda != 0
        #   m_t <- beta1 m_{t-1} + (1 - beta1) g_t;  v_t <- beta2 v_{t-1} + (1 - beta2) g_t^2  (m_0 = v_0 = 0)
        #   theta_t <- theta_{t-1} - gamma * m_t / (1 - beta1^t) / (sqrt(v_t / (1 - beta2^t)) + eps)
        # written as torch's implementation evaluates it (sqrt(v_t) / sqrt(1 - beta2^t) + eps).
        b1, b2 = self.betas
        if self.name == "adamw":
            w = w * (1 - self.lr * self.weight_decay)
        elif self.weight_decay:
            g = g + self.weight_decay * w
        m = (1 - b1) * g if t == 1 else b1 * s["exp_avg"] + (1 - b1) * g
        v = (1 - b2) * g * g if t == 1 else b2 * s["exp_avg_sq"] + (1 - b2) * g * g
        denom = _sqrt(v) / math.sqrt(1 - b2 ** t) + self.eps
        return w - (self.lr / (1 - b1 ** t)) * (m / denom), {"exp_avg": m, "exp_avg_sq": v}

    def state_tensors(self) -> int:
        """Tensors of state per parameter (memory estimates): momentum 1, Adam 2, plain SGD 0."""
        return 2 if self.name != "sgd" else 1 if self.momentum else 0

    def record(self) -> dict[str, Any]:
        """The announced constants of this optimizer (UpdateMeta.threat keys)."""
        rec: dict[str, Any] = {"local_optimizer": self.name, "local_weight_decay": self.weight_decay}
        if self.name == "sgd":
            rec.update(local_momentum=self.momentum, local_nesterov=self.nesterov)
        else:
            rec.update(local_betas=list(self.betas), local_eps=self.eps)
        return rec


def sgd(lr: float) -> LocalOptimizer:
    """Plain SGD, W <- W - lr * g (McMahan et al. 2017, Algorithm 1's ClientUpdate)."""
    return LocalOptimizer("sgd", lr=lr)


__all__ = ["LocalOptimizer", "OPTIMIZERS", "sgd"]
