"""What the guard does with an update that leaks (:class:`GuardPolicy`): typed, validated when
built, importable without torch, so that a bad value is one ConfigError before any work."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigError

REPORT, WITHHOLD, NOISE = "report", "withhold", "noise"
ACTIONS = (REPORT, WITHHOLD, NOISE)
#: What the client does with a received model that ``fl.inspect`` finds suspicious.
REFUSE, TRAIN = "refuse", "train"
ON_SUSPICIOUS = (REFUSE, TRAIN)
#: What the client does when a check fails (an error, the budget spent): send nothing, or send as is.
SEND = "send"
ON_ERROR = (WITHHOLD, SEND)
#: The noise policy's schedule: noise multipliers z, each tried in turn until the noised update is
#: "defended". The Gaussian noise's standard deviation per entry is sigma = z x the clip bound /
#: sqrt(entries) (z x the clipped update's RMS entry when it fills the bound): z = 1 is noise as
#: large, entry by entry, as the update itself.
DEFAULT_SCHEDULE = (0.3, 1.0, 3.0, 10.0)
#: The guard's budget per client-round, in seconds (every check together), and per attack.
DEFAULT_BUDGET_SECONDS = 120.0
DEFAULT_ITERATIONS = 100
MAX_BUDGET_SECONDS = 24 * 3600.0
MAX_ITERATIONS = 100_000
MAX_SCHEDULE = 32


@dataclass(frozen=True)
class GuardPolicy:
    """The guard's policy.

    action:        report (send the update, record the verdict) | withhold (send nothing when it
                   leaks) | noise (clip and add Gaussian noise, each level of ``schedule`` in turn,
                   until the noised update is no leak as the server receives it (the noise
                   not announced) and "defended" with the noise announced; past the last, withhold).
    on_suspicious: refuse (default: do not train on a received model ``fl.inspect`` flags) | train.
    on_error:      withhold (default: a failed check sends nothing) | send (the update as it is).
    budget_seconds: every check of one update together; past it the attack in progress stops
                   (after the step it is in), and a noise level whose check would need more than
                   is left (the longest check so far) is not started: the check counts as failed
                   (``on_error``). The scoring after an attack (decoy and truth-start tests) is
                   not interrupted: a check may end past the budget by that much.
    iterations:    each optimisation attack's steps (auto's portfolio at the guard's budget).
    schedule:      the noise multipliers z (increasing); clip: the L2 bound the update is scaled
                   to at most before the noise (None: the update's own norm, no scaling).
    seed:          the attacks' starts and the noise draws.
    attack:        the attack the guard runs (auto: the closed forms that apply, then the portfolio).
    progress:      one line on stderr per check (what runs, seconds spent of the budget).
    """

    action: str = REPORT
    on_suspicious: str = REFUSE
    on_error: str = WITHHOLD
    budget_seconds: float = DEFAULT_BUDGET_SECONDS
    iterations: int = DEFAULT_ITERATIONS
    schedule: tuple[float, ...] = DEFAULT_SCHEDULE
    clip: float | None = None
    seed: int = 0
    attack: str = "auto"
    progress: bool = True
    device: str = "cpu"
    extra: dict[str, Any] = field(default_factory=dict)   # further attack flags (e.g. {"seeds": 2})

    def __post_init__(self) -> None:
        _choice("action", self.action, ACTIONS)
        _choice("on_suspicious", self.on_suspicious, ON_SUSPICIOUS)
        _choice("on_error", self.on_error, ON_ERROR)
        _number("budget_seconds", self.budget_seconds, 0.0, MAX_BUDGET_SECONDS, low_open=True)
        _integer("iterations", self.iterations, 1, MAX_ITERATIONS)
        _integer("seed", self.seed, 0, 2**32 - 1)
        if isinstance(self.schedule, (str, bytes)) or not hasattr(self.schedule, "__iter__"):
            raise ConfigError(f"guard policy: schedule must be a sequence of numbers (got {self.schedule!r})")
        levels = tuple(self.schedule)
        if not 1 <= len(levels) <= MAX_SCHEDULE:
            raise ConfigError(f"guard policy: schedule must hold 1..{MAX_SCHEDULE} noise multipliers "
                              f"(got {len(levels)})")
        for z in levels:
            _number("schedule", z, 0.0, 1e6, low_open=True)
        if any(b <= a for a, b in zip(levels, levels[1:], strict=False)):
            raise ConfigError(f"guard policy: schedule must increase (got {list(levels)})")
        object.__setattr__(self, "schedule", tuple(float(z) for z in levels))
        if self.clip is not None:
            _number("clip", self.clip, 0.0, 1e12, low_open=True)
        from ..catalog import IMAGE_ATTACKS

        if not isinstance(self.attack, str) or self.attack not in IMAGE_ATTACKS:
            raise ConfigError(f"guard policy: attack must be one of {' | '.join(IMAGE_ATTACKS)} (got {self.attack!r})")
        if not isinstance(self.progress, bool):
            raise ConfigError(f"guard policy: progress must be true or false (got {self.progress!r})")
        if not isinstance(self.extra, dict):
            raise ConfigError(f"guard policy: extra must be a mapping of attack flags (got {self.extra!r})")
        reserved = sorted(set(self.extra) & {"attack", "iterations", "seed", "device", "progress", "defense", "out"})
        if reserved:
            raise ConfigError(f"guard policy: extra may not set {reserved[0]!r} (a field of the policy itself)")

    def attack_flags(self) -> dict[str, Any]:
        """The flat attack config the guard's checks run (validated by gradleak.config.make_config);
        ``iterations`` only for an attack that takes steps (auto, the optimisation attacks)."""
        from ..specs import attack_specs

        steps = self.attack == "auto" or "iterations" in attack_specs()[self.attack].flags
        return {"attack": self.attack, **({"iterations": self.iterations} if steps else {}), "seed": self.seed,
                "device": self.device, **self.extra}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["schedule"] = list(self.schedule)
        return d


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"guard policy: {name} must be one of {' | '.join(allowed)} (got {value!r})")


def _integer(name: str, value: Any, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"guard policy: {name} must be an integer in {lo}..{hi} (got {value!r})")


def _number(name: str, value: Any, lo: float, hi: float, *, low_open: bool = False) -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) \
        and (value > lo if low_open else value >= lo) and value <= hi
    if not ok:
        raise ConfigError(f"guard policy: {name} must be a finite number in {'(' if low_open else '['}{lo:g}, "
                          f"{hi:g}] (got {value!r})")


__all__ = ["ACTIONS", "DEFAULT_BUDGET_SECONDS", "DEFAULT_ITERATIONS", "DEFAULT_SCHEDULE", "GuardPolicy", "NOISE",
           "ON_ERROR", "ON_SUSPICIOUS", "REFUSE", "REPORT", "SEND", "TRAIN", "WITHHOLD"]
