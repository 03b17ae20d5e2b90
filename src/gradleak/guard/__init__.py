"""The guard inside the client: the worst-case attacks on the client's own update, with its own
data as truth, before the update leaves; a policy says what is sent (report, withhold, noise).
A plain torch API (:func:`guard_update`) and a Flower client mod (gradleak.guard.flower)."""

from .check import (DECISIONS, PASSED, REFUSED, REMEDIED, WITHHELD, Check, GuardBudgetSpent, GuardRecord,
                    GuardResult, fedavg_update, guard_update, noised, screen_model)
from .policy import ACTIONS, NOISE, REPORT, WITHHOLD, GuardPolicy

__all__ = ["ACTIONS", "Check", "DECISIONS", "GuardBudgetSpent", "GuardPolicy", "GuardRecord", "GuardResult", "NOISE",
           "PASSED", "REFUSED", "REMEDIED", "REPORT", "WITHHELD", "WITHHOLD", "fedavg_update", "guard_update",
           "noised", "screen_model"]
