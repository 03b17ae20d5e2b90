"""What a dashboard holds and how it judges it: a folder (a sweep, an experiment, a Flower audit,
a folder of runs) as a :class:`Source` of judged :class:`Item` s, one per attacked update (a cell,
or a client's update in one round), each with its verdict (:func:`gradleak.report.risk.judge`);
folders.py reads the files."""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gradleak.paths import one_line
from gradleak.report.figures import MAX_PLOTTED
from gradleak.report.risk import Verdict, converged_of, finite, judge, psnr_of
from gradleak.specs import attacker_fields

# audit.csv, a Flower audit's index, is read whole (one row per audited update, ~150 bytes each).
# Its "run" column names each attacked update's run folder, whose metrics.json holds the details;
# audits written before run folders carried them in audit.csv's own columns (read as they are).
MAX_AUDIT_BYTES = 32 * 1024 * 1024
AUDIT_REQUIRED = ("round", "client")
AUDIT_NUMERIC = ("num_examples", "psnr_mean", "ssim_mean", "mse_mean", "label_accuracy", "gradient_distance",
                 "iterations", "attack_seconds", "update_norm", "local_steps", "local_batch_size", "local_lr",
                 "relative_gradient_distance", "noise_floor")
# An audit's run folder as its index names it: runs/NAME in the audit's folder (gradleak.audit.auditor).
AUDIT_RUN = re.compile(r"runs/[A-Za-z0-9_][A-Za-z0-9_.-]*")
# An experiment's folder keeps its cells in this sweep folder (experiments/cells.py CELLS).
EXPERIMENT_CELLS = "cells"
# Where a sweep cell's run folder keeps its picture (gradleak sweep --save-runs; an experiment's
# run_folders): originals above the paired reconstructions, with PSNR and labels.
RUN_IMAGE = "reconstruction.png"

# An error as a page shows it: one line of at most this many characters (a store keeps a cell's
# error whole, up to store.MAX_COLUMN_CHARS; shown whole, a few such rows made pages of 50 MB).
ERROR_CHARS = 300

# Config fields that say how a cell ran, not what it attacked: never an axis, ignored when two
# runs are matched.
RUN_ONLY_FIELDS = frozenset({"out", "progress", "threads", "log_every", "checkpoint_every", "paper_metrics", "device",
                             "nproc", "divergence_retries"})
# Fields that configure the attacker, not the client: settings that differ only in these are the
# same client attacked several ways (judged by the worst case over the attacks). They are derived
# from the attacks' SPECs (specs.attacker_fields: the attack and every constant an attack declares)
# plus the fields that say how a cell ran; the model, the modality, the data, the defenses and the
# threat are the client's.
ATTACK_SIDE = frozenset({*attacker_fields(), *RUN_ONLY_FIELDS})
# Fields whose values are repetitions of one setting (another batch drawn, another start): cells
# that differ only there form one setting, and no chart is drawn along them.
REPLICATE_FIELDS = ("seed", "indices")


class Cell(Protocol):
    """One finished cell as a dashboard reads it: a sweep store's row
    (gradleak.sweep.store.CellRecord) or a run folder (:class:`RunCell`)."""

    cell_id: str
    status: str                   # "ok" | "failed"
    grid: dict[str, Any]
    config: dict[str, Any]
    metrics: dict[str, Any] | None
    error: str | None
    wall_seconds: float | None
    worker: str | None
    finished_at: str


@dataclass
class RunCell:
    """A run folder (gradleak attack's --out) as a :class:`Cell`."""

    cell_id: str
    status: str
    grid: dict[str, Any]
    config: dict[str, Any]
    metrics: dict[str, Any] | None
    error: str | None
    wall_seconds: float | None
    worker: str | None
    finished_at: str


@dataclass(frozen=True)
class StoreAccess:
    """How a dashboard finds and reads a sweep's results store. The sweeps write the stores and sit
    above the report, so they hand this in (gradleak.sweep.dashboard_cli.sweep_stores).

    name:   the store's file in a sweep folder (results.sqlite).
    files:  the files of a sweep folder a page never replaces (the store, SQLite's side files,
            results.csv, the sweep's lock).
    read:   the store's folder -> (every cell, checked whole; how many sweep runs wrote it; the
            experiment whose cells these are, or None); one DataError naming the store and row
            when it is damaged.
    """

    name: str
    files: tuple[str, ...]
    read: Callable[[Path], tuple[Sequence[Cell], int, str | None]]


@dataclass
class Item:
    """One attacked update as the page shows it."""

    key: Any                      # cell_id, or (round, client)
    verdict: Verdict
    psnr: float | None            # judged PSNR (None without ground truth)
    rel: float | None             # relative gradient distance (the attack's own fit)
    status: str
    fields: dict[str, Any]        # what was attacked: the cell's config, or the audit row (with its run's details)
    metrics: dict[str, Any]       # what was measured: the cell's metrics, or as fields
    image: str | None = None      # the picture's path relative to the source's image root
    error: str | None = None
    run: str | None = None        # an audited update's run folder, relative to the audit's folder

    @property
    def label(self) -> str:
        return self.verdict.label


@dataclass
class Source:
    """A folder the dashboard reads: kind "sweep", "experiment", "audit" or "runs"."""

    kind: str
    folder: Path                  # the folder given on the command line
    data: Path                    # the sweep folder (results.sqlite) or the audit folder
    items: list[Item] = field(default_factory=list)
    records: list[Cell] = field(default_factory=list)
    sweeps: int = 0
    experiment: str | None = None
    audit_columns: list[str] = field(default_factory=list)
    page_dir: Path | None = None  # where the page is written (links to the cells' report.html are relative to it)
    links_skipped: list[str] = field(default_factory=list)   # symbolic links not followed (relative to folder)

    @property
    def runs_dir(self) -> Path:
        """Where the cells' run folders are (a folder of runs: the folder itself)."""
        return self.data if self.kind == "runs" else self.data / "runs"

    @property
    def image_root(self) -> Path:
        return self.data

    @property
    def noun(self) -> str:
        return "updates" if self.kind == "audit" else "cells"


# ------------------------------------------------------------------ values
def num(v: Any) -> float | None:
    """A plottable number: finite, not a bool, at most MAX_PLOTTED in magnitude; else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:  # an int beyond float range
        return None
    return f if math.isfinite(f) and abs(f) <= MAX_PLOTTED else None


def field_text(name: str, value: Any, limit: int = 80) -> str:
    """A config value as one short line of text (escaped later): a defense list as its specs
    joined by ";" ("none" when empty), None as "default"."""
    if name == "defense":
        if isinstance(value, list):
            text = ";".join(str(x) for x in value) if value else "none"
        elif value in (None, ""):
            text = "none"
        else:
            text = str(value)
    elif value is None:
        text = "default"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, (str, int, float)):
        text = str(value)
    else:
        text = json.dumps(value, default=str, ensure_ascii=False, sort_keys=True)
    return one_line(text, limit)


def separated_text(metrics: Mapping[str, Any]) -> str | None:
    """How many inputs a closed-form attack read off the update (its ``separated``: analytic,
    imprint, trap), as "S of K" with K the images the update holds (``batch_size``: every
    client's in an aggregate); None for an attack that records no such count (the optimisation
    attacks rebuild every slot) or a value that is not one."""
    s = metrics.get("separated")
    if isinstance(s, bool) or not isinstance(s, int) or s < 0:
        return None
    k = metrics.get("batch_size")
    if isinstance(k, int) and not isinstance(k, bool) and k >= s:
        return f"{s} of {k}"
    return str(s)


def server_text(metrics: Mapping[str, Any]) -> str | None:
    """What the server sent, as a run's metrics record it (the update's model kwargs: a
    malicious server's canonical --server text; "honest" for a model without one); None when
    the metrics hold no update record (runs of older versions)."""
    update = metrics.get("update")
    if not isinstance(update, Mapping):
        return None
    kwargs = update.get("model_kwargs")
    server = kwargs.get("server") if isinstance(kwargs, Mapping) else None
    return one_line(server, 120) if isinstance(server, str) and server else "honest"


def attacked_fields(metrics: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """What a run attacked, from its own record (metrics.json: the update's model, modality,
    defenses, threat and classes, and the data it was scored on), in config.json's field names.
    config.json keeps the defaults of the fields a run did not use (a text run's
    data=cifar10-samples, an update file's defense=none): these replace them. Empty for a run of
    an older version, which holds no update record."""
    update = metrics.get("update")
    if not isinstance(update, Mapping):
        return {}
    kwargs = update.get("model_kwargs") if isinstance(update.get("model_kwargs"), Mapping) else {}
    threat = update.get("threat") if isinstance(update.get("threat"), Mapping) else {}
    modality = metrics.get("modality") or kwargs.get("modality") or "image"
    out: dict[str, Any] = {"modality": modality, "server": server_text(metrics)}
    for name, value in (("model", update.get("model")), ("data", metrics.get("data")), ("threat", threat.get("name"))):
        if isinstance(value, str):
            out[name] = value
    if isinstance(update.get("defenses"), list):
        out["defense"] = [str(d) for d in update["defenses"]]
    # the file decides the classes and the model's width; its batch too when the run read one
    wanted = [("num_classes", update), ("width", kwargs), *((("batch_size", update),) if config.get("update") else ())]
    for name, where in wanted:
        if isinstance(where.get(name), int) and not isinstance(where.get(name), bool):
            out[name] = where[name]
    for name in ("local_steps", "local_batch_size", "local_lr", "clients", "inner"):
        if name in threat:
            out[name] = threat[name]
    shape = update.get("input_shape")
    if modality != "image":
        out["image_size"] = None  # config.json's image default: a text run has no image
    elif isinstance(shape, list) and len(shape) == 3 and isinstance(shape[-1], int):
        out["image_size"] = shape[-1]
    return out


def is_numeric(values: Iterable[Any]) -> bool:
    vals = list(values)
    return bool(vals) and all(num(v) is not None for v in vals)


def varying_fields(records: Sequence[Cell], *, replicates: bool = False) -> list[str]:
    """The config fields whose value differs between cells (grid fields first, in the grid's
    order), leaving out how a cell ran (RUN_ONLY_FIELDS) and, unless ``replicates``, the
    repetitions (REPLICATE_FIELDS)."""
    order: list[str] = []
    for r in records:
        for k in list(r.grid) + list(r.config):
            if isinstance(k, str) and k not in order:
                order.append(k)
    out = []
    for k in order:
        if k in RUN_ONLY_FIELDS or (k in REPLICATE_FIELDS) != replicates:
            continue
        if len({field_text(k, r.config.get(k)) for r in records}) > 1:
            out.append(k)
    return out


def derived_fields(records: Sequence[Cell], fields: Sequence[str]) -> dict[str, str]:
    """The fields of ``fields`` that follow another one (each of its values comes with one value
    of the field ``f`` follows): ``{field: the field it follows}``. An experiment's cells give each
    attack its own constants (dtype, init, iterations, ...): those vary with the attack and are
    not axes of their own. A field follows another that has more values, or as many and comes
    first; a full grid has no such field. Only the attacker's fields (ATTACK_SIDE) follow one
    another: a client's field (the model, the modality, the defenses) is always shown, and a text
    TAG run and an image R-GAP run are two clients, not one client attacked two ways."""
    texts = {f: [field_text(f, r.config.get(f)) for r in records] for f in fields}
    distinct = {f: len(set(v)) for f, v in texts.items()}
    out: dict[str, str] = {}
    for i, f in enumerate(fields):
        for j, g in enumerate(fields):
            if g == f or g in out or not (distinct[g] > distinct[f] or (distinct[g] == distinct[f] and j < i)):
                continue
            if f not in ATTACK_SIDE or g not in ATTACK_SIDE:
                continue
            seen: dict[str, str] = {}
            if all(seen.setdefault(b, a) == a for a, b in zip(texts[f], texts[g], strict=True)):
                out[f] = g
                break
    return out


def setting_label(values: Mapping[str, Any], fields: Sequence[str]) -> str:
    return ", ".join(f"{f}={field_text(f, values.get(f), 40)}" for f in fields)


# ------------------------------------------------------------------ sweeps and experiments
def _unmodelled(conv: Mapping[str, Any]) -> list[str]:
    u = conv.get("unmodelled_defenses")
    return [str(x) for x in u] if isinstance(u, list) else ([u] if isinstance(u, str) and u else [])


def cell_verdict(r: Cell) -> Verdict:
    """The verdict of one stored cell (gradleak.report.risk.judge on its metrics)."""
    m = r.metrics if isinstance(r.metrics, dict) else {}
    conv = m.get("convergence") if isinstance(m.get("convergence"), dict) else {}
    defense = r.config.get("defense")
    floor = conv["noise_floor"] if "noise_floor" in conv else (0.0 if not defense else None)
    attack = m.get("attack") if isinstance(m.get("attack"), str) else r.config.get("attack")
    if r.status == "ok" and m:   # the whole evidence the run recorded (outcome.evidence_from_metrics)
        return judge(r.status, m.get("psnr_mean"), converged_of(m), metrics={**m, "attack": attack})
    return judge(r.status, m.get("psnr_mean"), converged_of(m), attack=attack, noise_floor=floor,
                 unmodelled=_unmodelled(conv),
                 defenses=[d for d in defense if isinstance(d, str)] if isinstance(defense, list) else ())


def shown_error(error: str | None) -> str | None:
    """An error as a page shows it: one line (control characters escaped) of at most
    :data:`ERROR_CHARS` characters; None for none."""
    return one_line(error, ERROR_CHARS) if error else None


def cell_item(r: Cell, root: Path, runs: str = "runs") -> Item:
    """``runs``: the run folders' folder below ``root`` ("" when ``root`` is a folder of runs)."""
    m = r.metrics if isinstance(r.metrics, dict) else {}
    conv = m.get("convergence") if isinstance(m.get("convergence"), dict) else {}
    rel = conv.get("relative_gradient_distance", m.get("relative_gradient_distance"))
    v = cell_verdict(r)
    rel_image = f"{runs}/{r.cell_id}/{RUN_IMAGE}" if runs else f"{r.cell_id}/{RUN_IMAGE}"
    image = rel_image if r.status == "ok" and plain_file(root, rel_image) else None
    return Item(key=r.cell_id, verdict=v, psnr=psnr_of(m.get("psnr_mean")) if v.truth else None, rel=finite(rel),
                status=r.status, fields=r.config, metrics=m, image=image,
                error=shown_error(r.error))


def store_folder(folder: Path, stores: StoreAccess) -> tuple[str, Path] | None:
    """("sweep", DIR) when DIR holds results.sqlite, ("experiment", DIR/cells) when DIR is an
    experiment's folder, else None."""
    if os.path.lexists(folder / stores.name):
        return "sweep", folder
    cells = folder / EXPERIMENT_CELLS
    if cells.is_dir() and not cells.is_symlink() and os.path.lexists(cells / stores.name):
        return "experiment", cells
    return None


def load_store(kind: str, folder: Path, data: Path, stores: StoreAccess) -> Source:
    cells, sweeps, experiment = stores.read(data)
    records = list(cells)
    src = Source(kind=kind, folder=folder, data=data, records=records, sweeps=sweeps,
                 experiment=one_line(experiment, 80) if experiment else None)
    src.items = [cell_item(r, data) for r in records]
    return src


def plain_file(root: Path, rel: str) -> bool:
    """Whether ``root/rel`` is a regular file reached through no symbolic link below ``root``
    (each folder on the way a real folder): what a page may show or link to."""
    path = root
    parts = Path(rel).parts
    for i, part in enumerate(parts):
        if part in ("", ".", "..") or "\x00" in part:
            return False
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except (OSError, ValueError):
            return False
        if not (stat.S_ISREG(mode) if i == len(parts) - 1 else stat.S_ISDIR(mode)):
            return False
    return bool(parts)


def client_order(clients: Iterable[str]) -> list[str]:
    """Clients in natural order: numbers by value, then names."""
    def key(c: str) -> tuple[int, float, str]:
        try:
            return (0, float(c), c) if math.isfinite(float(c)) else (1, 0.0, c)
        except ValueError:
            return (1, 0.0, c)
    return sorted(set(clients), key=key)
