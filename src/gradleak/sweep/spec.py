"""Sweep specifications: a base config plus a grid of field values, expanded into cells."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..config import AttackConfig
from ..errors import ConfigError
from ..paths import check_tree, one_line
from ..specs import attack_specs, attacks_run, hashed_flags, portfolio_candidates

SPEC_KEYS = ("base", "grid", "description")
# Fields that never change a cell's result; they are left out of its identity.
IDENTITY_EXCLUDED = frozenset({"out", "progress"})
# The AttackConfig fields every cell identity has hashed since cell stores took their present form:
# these run fields and the attack constants each attack's SPEC lists as its "hashed_flags"
# (specs.hashed_flags). A field added since (a new attack's flag, --box, GradInversion's --distance)
# is left out of the identity while it holds its AttackConfig default, the value every earlier cell
# ran with: stores of before keep their cells, and an attack's new flag needs no entry anywhere.
# Never add to this set or to a SPEC's hashed_flags.
HASHED_RUN_FIELDS = frozenset({"allow_repeats", "attack", "batch_size", "checkpoint", "checkpoint_every", "clients",
    "data", "data_root", "defense", "device", "divergence_retries", "image_size", "indices", "inner",
    "local_batch_size", "local_lr", "local_steps", "log_every", "modality", "model", "model_seed", "nproc",
    "num_classes", "paper_metrics", "seed", "server", "share_bn_statistics", "split", "text", "threads", "threat",
    "truth", "update", "width"})
HASHED_FIELDS = HASHED_RUN_FIELDS | hashed_flags()
# Attack defaults that changed after cell stores were written: (attack, field) -> the default now.
# A cell that leaves such a field unset (None: the attack's default) carries it in its identity, so
# a store of before, whose cell ran under the old default, does not hand that cell to a run under
# the new one (without this, reproduction/batch-size reused its Inverting Gradients cells of 4800
# iterations as if they were the 1000 of the new default). Fields whose default never changed stay
# out, so stores keep those cells. tests/sweep/test_sweep.py pins every attack's resolved defaults and
# fails, naming this table, when one changes: add the field here with its new default.
# Each attack declares its own in its SPEC ("changed_defaults", gradleak/specs.py). Each tag is
# hashed into the identity of the cells it applies to: an existing tag stays word for word (the
# dates in the first four included), or stores would recompute cells that did not change.
CHANGED_DEFAULTS: dict[tuple[str, str], str] = {(name, flag): tag for name, spec in attack_specs().items()
                                                for flag, tag in spec.changed_defaults.items()}
# The optimisation attacks "auto" may run when its fallback is not given (each declares it in its
# SPEC; attacks.auto.auto_portfolio chooses among them by the case).
AUTO_PORTFOLIO = tuple(sorted(portfolio_candidates()))
# Fields a spec may not set: the sweep decides them.
FORBIDDEN = {"out": "a sweep writes its results to --out DIR (use --save-runs for run folders)",
             "progress": "the sweep shows one progress bar for all cells"}
# A cell costs ~0.3 ms and ~2 KB to expand and validate: 100 000 cells is ~30 s and ~200 MB before
# any runs. A larger grid is refused before any value is validated.
MAX_CELLS = 100_000
# The spec file is read whole; a spec is a few lines (1 MiB holds a grid of 100 000 values).
MAX_SPEC_BYTES = 1024 * 1024
# Nesting and size (YAML aliases expanded) of the parsed spec: a real one is 3-4 levels deep.
MAX_SPEC_DEPTH = 32
MAX_SPEC_ITEMS = 1_000_000


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
    listed: bool = False       # made by cells_spec from a list of configs, not from a grid

    def to_dict(self) -> dict[str, Any]:
        if self.listed:  # the configs themselves are in the store's cells table
            return {"description": self.description, "cells": [c.cell_id for c in self.cells]}
        return {"base": self.base, "grid": self.grid, "description": self.description}


def _later_at_default(name: str, value: Any) -> bool:
    """Whether ``name`` is an AttackConfig field added since HASHED_FIELDS, at its default."""
    info = AttackConfig.model_fields.get(name)
    return name not in HASHED_FIELDS and info is not None and value == info.get_default(call_default_factory=True)


def cell_identity(config: dict[str, Any], exclude: frozenset[str] | set[str] = frozenset()) -> str:
    """16 hex digits of the SHA-256 of the canonical JSON of ``config`` (minus IDENTITY_EXCLUDED,
    ``exclude`` and the fields added since HASHED_FIELDS at their default; plus the changed defaults
    it leaves unset, changed_defaults)."""
    ident = {k: v for k, v in config.items() if k not in IDENTITY_EXCLUDED and k not in exclude
             and not _later_at_default(k, v)}
    defaults = changed_defaults(config)
    if defaults:
        ident["defaults"] = defaults
    text = json.dumps(ident, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def changed_defaults(config: dict[str, Any]) -> dict[str, str]:
    """The CHANGED_DEFAULTS this config runs under: the fields it leaves unset whose default changed,
    as ``attack.field`` -> the default now (for "auto" without a fallback, its own and those of
    every attack its portfolio may run)."""
    attacks = attacks_run(config)
    return {f"{a}.{f}": tag for (a, f), tag in CHANGED_DEFAULTS.items() if a in attacks and config.get(f) is None}


def _is_list_field(name: str) -> bool:
    return typing.get_origin(AttackConfig.model_fields[name].annotation) is list


def _shown_name(name: Any) -> str:
    """A key as it goes into a one-line message: itself when short and printable, else its repr."""
    if isinstance(name, str) and name.isprintable() and len(name) <= 60:
        return name
    return one_line(repr(name), 60)


def _check_field(where: str, name: Any) -> str:
    if not isinstance(name, str) or name not in AttackConfig.model_fields:
        import difflib

        close = difflib.get_close_matches(str(name)[:100], list(AttackConfig.model_fields), n=1)
        hint = f"did you mean {close[0]!r}?" if close else "known: " + ", ".join(AttackConfig.model_fields)
        raise ConfigError(f"sweep spec {where}.{_shown_name(name)}: unknown field; {hint}")
    if name in FORBIDDEN:
        raise ConfigError(f"sweep spec {where}.{name}: not allowed in a sweep; {FORBIDDEN[name]}")
    return name


def _non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return any(_non_finite(v) for v in value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    return False


def _validated(where: str, values: dict[str, Any], field_name: str | None = None) -> AttackConfig:
    try:
        cfg = AttackConfig(**values, progress=False)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        if loc == field_name:  # where already names it: grid.batch_size[1]
            loc = ""
        got = err.get("input")
        shown = "" if isinstance(got, dict) else f" (got {one_line(repr(got), 100)})"
        message = one_line(f"sweep spec {where}{'.' + loc if loc else ''}: {err['msg']}", 400)
        raise ConfigError(message + shown) from None
    # A cell's identity is the JSON of its config: inf/nan (which the config may accept) have none.
    for key, value in cfg.model_dump(mode="json").items():
        if _non_finite(value):
            loc = "" if key == field_name else f".{key}"
            raise ConfigError(f"sweep spec {where}{loc}: must be a finite number (got {value!r})")
    return cfg


def parse_spec(raw: Any) -> SweepSpec:
    """Validate a spec (already parsed from YAML/JSON) and expand it into cells.

    Raises ConfigError naming the offending key: unknown fields, an empty or non-list grid
    entry, a value of the wrong type, a field set in both base and grid, duplicates.
    """
    base, grid, description = _spec_parts(raw)
    for name in base:
        _check_field("base", name)
    _validated("base", base)
    _check_grid_size(base, grid)
    norm_grid = _normalised_grid(base, grid)
    return SweepSpec(base=dict(base), grid=norm_grid, description=description, cells=_expand(base, norm_grid))


def _spec_parts(raw: Any) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(base, grid, description) of a spec of known keys, each of its type."""
    check_tree(raw, "sweep spec", max_depth=MAX_SPEC_DEPTH, max_items=MAX_SPEC_ITEMS, error=ConfigError)
    if not isinstance(raw, dict):
        raise ConfigError("sweep spec: must be a mapping with keys base: and grid:")
    for key in raw:
        if key not in SPEC_KEYS:
            raise ConfigError(f"sweep spec: unknown key {_shown_name(key)!r} (known: {', '.join(SPEC_KEYS)})")
    base = raw.get("base") or {}
    if not isinstance(base, dict):
        raise ConfigError("sweep spec base: must be a mapping of config fields")
    grid = raw.get("grid")
    if not isinstance(grid, dict) or not grid:
        raise ConfigError("sweep spec grid: must be a non-empty mapping of field: [values]")
    description = raw.get("description") or ""
    if not isinstance(description, str):
        raise ConfigError("sweep spec description: must be a string")
    return base, grid, description


def _check_grid_size(base: dict[str, Any], grid: dict[str, Any]) -> None:
    """Each grid field a known field not in base with a non-empty list of values, and at most
    MAX_CELLS cells, refused before a single value is validated."""
    total = 1
    for name, values in grid.items():
        _check_field("grid", name)
        if name in base:
            raise ConfigError(f"sweep spec grid.{name}: also set in base; set it in one place")
        if not isinstance(values, list):
            raise ConfigError(f"sweep spec grid.{name}: must be a list of values (got {one_line(repr(values), 100)})")
        if not values:
            raise ConfigError(f"sweep spec grid.{name}: empty list (a grid field needs at least one value)")
        total *= len(values)
    if total > MAX_CELLS:
        raise ConfigError(f"sweep spec grid: {total} cells is more than {MAX_CELLS}; split the sweep")


def _normalised_grid(base: dict[str, Any], grid: dict[str, Any]) -> dict[str, list[Any]]:
    """The grid with list fields' single strings as one-item lists; each value valid on base, none twice."""
    norm_grid: dict[str, list[Any]] = {}
    for name, values in grid.items():
        if _is_list_field(name):  # defense: ["a", ["b", "c"], []] -> [["a"], ["b", "c"], []]
            values = [[v] if isinstance(v, str) else v for v in values]
        seen: set[str] = set()
        for i, v in enumerate(values):
            cfg = _validated(f"grid.{name}[{i}]", {**base, name: v}, name)
            key = json.dumps(cfg.model_dump(mode="json")[name], sort_keys=True)
            if key in seen:
                raise ConfigError(f"sweep spec grid.{name}[{i}]: duplicate value {one_line(repr(v), 100)}")
            seen.add(key)
        norm_grid[name] = values
    return norm_grid


def _expand(base: dict[str, Any], norm_grid: dict[str, list[Any]]) -> list[Cell]:
    """One cell per combination of the grid's values, in product order; combinations whose
    configs are the same cell (the same identity) once."""
    names = list(norm_grid)
    cells: list[Cell] = []
    ids: set[str] = set()
    for combo in itertools.product(*(norm_grid[n] for n in names)):
        values = dict(zip(names, combo, strict=True))
        where = "grid(" + ", ".join(f"{k}={one_line(repr(v), 60)}" for k, v in values.items()) + ")"
        config = _validated(where, {**base, **values}).model_dump(mode="json")
        cid = cell_identity(config)
        if cid in ids:
            continue
        ids.add(cid)
        shown = {n: config[n] for n in names}
        cells.append(Cell(cell_id=cid, grid=shown, config=config))
    return cells


def cells_spec(configs: list[dict[str, Any]], *, description: str = "",
               exclude: frozenset[str] | set[str] = frozenset()) -> tuple[SweepSpec, list[str]]:
    """A spec made of explicitly listed cells (an experiment's attacks) instead of a grid.

    Each config is a dict of AttackConfig fields (``out`` and ``progress`` are refused, as in a
    spec), validated and resolved like a grid cell; its identity leaves out ``exclude`` too
    (fields that say how a cell runs, not what it computes, e.g. ``threads``). Configs with the
    same identity are one cell. A cell's ``grid`` holds the fields whose values differ between
    the configs (the sweep's results.csv shows them). Returns the spec and the cell id of each
    config, in order. Raises ConfigError naming the config (``cells[i]``) and the field."""
    if not isinstance(configs, list):
        raise ConfigError("sweep cells: must be a list of configs")
    if len(configs) > MAX_CELLS:
        raise ConfigError(f"sweep cells: {len(configs)} cells is more than {MAX_CELLS}; split the sweep")
    resolved: list[dict[str, Any]] = []
    for i, values in enumerate(configs):
        if not isinstance(values, dict):
            raise ConfigError(f"sweep cells[{i}]: must be a mapping of config fields")
        for name in values:
            _check_field(f"cells[{i}]", name)
        resolved.append(_validated(f"cells[{i}]", values).model_dump(mode="json"))
    first = resolved[0] if resolved else {}
    varying = [k for k in first if k not in IDENTITY_EXCLUDED and k not in exclude
               and any(json.dumps(r[k], sort_keys=True) != json.dumps(first[k], sort_keys=True) for r in resolved)]
    ids: list[str] = []
    cells: dict[str, Cell] = {}
    for config in resolved:
        cid = cell_identity(config, exclude)
        ids.append(cid)
        if cid not in cells:
            cells[cid] = Cell(cell_id=cid, grid={k: config[k] for k in varying}, config=config)
    spec = SweepSpec(base={}, grid={}, description=description, cells=list(cells.values()), listed=True)
    return spec, ids


class _SpecSyntax(Exception):
    """A spec the loader refuses (duplicate key, merge key, too deep); load_spec adds the path."""


def _spec_loader() -> type:
    """A SafeLoader (libyaml's when present) that refuses what yaml.safe_load silently accepts:
    a key given twice in one mapping (safe_load keeps the last value) and merge keys (``<<``,
    whose expansion copies entries and can grow exponentially)."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class SpecLoader(base):  # type: ignore[misc,valid-type]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                seen: set[Any] = set()
                for key_node, _ in node.value:
                    line = key_node.start_mark.line + 1
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        raise _SpecSyntax(f"merge key '<<' at line {line} is not supported; write the fields out")
                    key = self.construct_object(key_node, deep=True)
                    try:
                        dup = key in seen
                    except TypeError:  # unhashable: SafeConstructor says so below
                        continue
                    if dup:
                        raise _SpecSyntax(f"duplicate key {_shown_name(key)!r} at line {line}; "
                                          "a key may appear once in a mapping")
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return SpecLoader


def _yaml_problem(exc: Exception) -> str:
    import yaml

    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return one_line(f"{exc.problem}{where}", 200)
    text = str(exc).strip()
    return one_line(text.splitlines()[0] if text else type(exc).__name__, 200)


def _check_nesting(text: str) -> None:
    """Walk the YAML events (libyaml's parser is iterative) and refuse a document nested deeper
    than MAX_SPEC_DEPTH before anything builds it: building is recursive."""
    import yaml

    depth = 0
    for event in yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_SPEC_DEPTH:
                raise _SpecSyntax(f"nested more than {MAX_SPEC_DEPTH} levels deep "
                                  f"(at line {event.start_mark.line + 1})")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _SpecSyntax(f"duplicate key {_shown_name(key)!r}; a key may appear once in an object")
        out[key] = value
    return out


def loads_spec_text(text: str, what: str = "sweep spec", *, json_format: bool = False) -> Any:
    """Parse spec text into plain values: YAML (JSON is its subset), or with ``json_format`` JSON
    itself (for .json files: YAML refuses some valid JSON, e.g. escaped astral characters).
    Refuses duplicate keys, merge keys, nesting deeper than MAX_SPEC_DEPTH and alias
    expansions of more than MAX_SPEC_ITEMS values. Raises ConfigError naming ``what``."""
    import json as _json

    import yaml

    try:
        if json_format:
            raw = _json.loads(text, object_pairs_hook=_json_pairs)
        else:
            _check_nesting(text)
            raw = yaml.load(text, Loader=_spec_loader())  # noqa: S506 - a SafeLoader subclass
    except _SpecSyntax as exc:
        raise ConfigError(f"{what}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{what}: nested more than {MAX_SPEC_DEPTH} levels deep") from None
    except _json.JSONDecodeError as exc:
        raise ConfigError(f"{what} is not valid JSON: {one_line(exc.msg)} at line {exc.lineno}, "
                          f"column {exc.colno}") from None
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
        # ValueError: an integer of more digits than Python converts, a date that does not exist
        kind = "JSON" if json_format else "YAML"
        raise ConfigError(f"{what} is not valid {kind}: {_yaml_problem(exc)}") from None
    check_tree(raw, what, max_depth=MAX_SPEC_DEPTH, max_items=MAX_SPEC_ITEMS, error=ConfigError)
    return raw


def load_spec(path: str | Path) -> SweepSpec:
    """Read a YAML (or JSON: a file named *.json) spec file and expand it.

    The file must be a regular file of at most MAX_SPEC_BYTES (a folder, FIFO or device is
    refused before it is opened: InputFileError); the text is parsed by :func:`loads_spec_text`.
    """
    from ..paths import read_text_file

    text = read_text_file(path, "sweep spec", max_bytes=MAX_SPEC_BYTES)
    spec = parse_spec(loads_spec_text(text, f"sweep spec {Path(path)}",
                                      json_format=Path(path).suffix.lower() == ".json"))
    # A file never makes gradleak import code: no module:callable model from a spec file (the
    # API's parse_spec, called by the user's own code, may name one).
    for cell in spec.cells:
        model = cell.config.get("model")
        if isinstance(model, str) and ":" in model:
            raise ConfigError(f"sweep spec {Path(path)} names the user model {one_line(model)!r}; gradleak never "
                              "imports code a file names (sweep your own model from Python with parse_spec)")
    return spec
