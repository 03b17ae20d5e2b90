"""Sweep specifications: a base config plus a grid of field values, expanded into cells.

A spec file (YAML or JSON)::

    base:                 # any fields of the `gradleak attack` config (AttackConfig)
      attack: dlg
      model: lenet-dlg
      iterations: 50
    grid:                 # field: list of values; every combination is one cell
      batch_size: [1, 2, 4]
      seed: [0, 1, 2]
      defense: [[], ["gaussian:1e-3"]]   # list fields take lists (a string means a one-item list)

Every cell is the base with one combination of grid values, validated as an AttackConfig. Its
identity is a hash of the full resolved config (all fields, defaults filled in, except the ones
that cannot change a result: ``out`` and ``progress``), so the same cell has the same id in any
sweep, whatever the spec's spelling, order of keys or which fields are in base vs grid.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..config import AttackConfig
from ..errors import ConfigError

SPEC_KEYS = ("base", "grid", "description")
# Fields that never change a cell's result; they are left out of its identity.
IDENTITY_EXCLUDED = frozenset({"out", "progress"})
# Fields a spec may not set: the sweep decides them.
FORBIDDEN = {"out": "a sweep writes its results to --out DIR (use --save-runs for run folders)",
             "progress": "the sweep shows one progress bar for all cells"}
MAX_CELLS = 1_000_000


@dataclass(frozen=True)
class Cell:
    """One run of the sweep: its id, the grid values that define it and its full config."""

    cell_id: str
    grid: dict[str, Any]
    config: dict[str, Any]     # AttackConfig.model_dump(mode="json"), progress off

    def attack_config(self) -> AttackConfig:
        return AttackConfig(**self.config)


@dataclass
class SweepSpec:
    base: dict[str, Any]
    grid: dict[str, list[Any]]
    description: str = ""
    cells: list[Cell] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"base": self.base, "grid": self.grid, "description": self.description}


def cell_identity(config: dict[str, Any]) -> str:
    """16 hex digits of the SHA-256 of the canonical JSON of ``config`` (minus IDENTITY_EXCLUDED)."""
    ident = {k: v for k, v in config.items() if k not in IDENTITY_EXCLUDED}
    text = json.dumps(ident, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _is_list_field(name: str) -> bool:
    return typing.get_origin(AttackConfig.model_fields[name].annotation) is list


def _check_field(where: str, name: Any) -> str:
    if not isinstance(name, str) or name not in AttackConfig.model_fields:
        import difflib

        close = difflib.get_close_matches(str(name), list(AttackConfig.model_fields), n=1)
        hint = f"did you mean {close[0]!r}?" if close else "known: " + ", ".join(AttackConfig.model_fields)
        raise ConfigError(f"sweep spec {where}.{name}: unknown field; {hint}")
    if name in FORBIDDEN:
        raise ConfigError(f"sweep spec {where}.{name}: not allowed in a sweep; {FORBIDDEN[name]}")
    return name


def _validated(where: str, values: dict[str, Any], field_name: str | None = None) -> AttackConfig:
    try:
        return AttackConfig(**values, progress=False)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        if loc == field_name:  # where already names it: grid.batch_size[1]
            loc = ""
        got = err.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        raise ConfigError(f"sweep spec {where}{'.' + loc if loc else ''}: {err['msg']}{shown}") from None


def parse_spec(raw: Any) -> SweepSpec:
    """Validate a spec (already parsed from YAML/JSON) and expand it into cells.

    Raises ConfigError naming the offending key: unknown fields, an empty or non-list grid
    entry, a value of the wrong type, a field set in both base and grid, duplicates.
    """
    if not isinstance(raw, dict):
        raise ConfigError("sweep spec: must be a mapping with keys base: and grid:")
    for key in raw:
        if key not in SPEC_KEYS:
            raise ConfigError(f"sweep spec: unknown key {key!r} (known: {', '.join(SPEC_KEYS)})")
    base = raw.get("base") or {}
    if not isinstance(base, dict):
        raise ConfigError("sweep spec base: must be a mapping of config fields")
    grid = raw.get("grid")
    if not isinstance(grid, dict) or not grid:
        raise ConfigError("sweep spec grid: must be a non-empty mapping of field: [values]")
    description = raw.get("description") or ""
    if not isinstance(description, str):
        raise ConfigError("sweep spec description: must be a string")
    for name in base:
        _check_field("base", name)
    _validated("base", base)
    norm_grid: dict[str, list[Any]] = {}
    for name, values in grid.items():
        _check_field("grid", name)
        if name in base:
            raise ConfigError(f"sweep spec grid.{name}: also set in base; set it in one place")
        if not isinstance(values, list):
            raise ConfigError(f"sweep spec grid.{name}: must be a list of values (got {values!r})")
        if not values:
            raise ConfigError(f"sweep spec grid.{name}: empty list (a grid field needs at least one value)")
        if _is_list_field(name):  # defense: ["a", ["b", "c"], []] -> [["a"], ["b", "c"], []]
            values = [[v] if isinstance(v, str) else v for v in values]
        seen: set[str] = set()
        for i, v in enumerate(values):
            cfg = _validated(f"grid.{name}[{i}]", {**base, name: v}, name)
            key = json.dumps(cfg.model_dump(mode="json")[name], sort_keys=True)
            if key in seen:
                raise ConfigError(f"sweep spec grid.{name}[{i}]: duplicate value {v!r}")
            seen.add(key)
        norm_grid[name] = values
    total = 1
    for values in norm_grid.values():
        total *= len(values)
    if total > MAX_CELLS:
        raise ConfigError(f"sweep spec grid: {total} cells is more than {MAX_CELLS}")
    names = list(norm_grid)
    cells: list[Cell] = []
    ids: set[str] = set()
    for combo in itertools.product(*(norm_grid[n] for n in names)):
        values = dict(zip(names, combo))
        where = "grid(" + ", ".join(f"{k}={v!r}" for k, v in values.items()) + ")"
        config = _validated(where, {**base, **values}).model_dump(mode="json")
        cid = cell_identity(config)
        if cid in ids:
            continue
        ids.add(cid)
        shown = {n: config[n] for n in names}
        cells.append(Cell(cell_id=cid, grid=shown, config=config))
    return SweepSpec(base=dict(base), grid=norm_grid, description=description, cells=cells)


def load_spec(path: str | Path) -> SweepSpec:
    """Read a YAML (or JSON, a subset of YAML) spec file and expand it."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"sweep spec {p} does not exist")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"sweep spec {p} is not valid YAML: {detail}") from None
    return parse_spec(raw)
