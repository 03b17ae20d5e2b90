"""What a dashboard reads and how it judges it: a folder (a sweep, an experiment, a Flower audit,
a folder of runs) as a :class:`Source` of judged :class:`Item` s, one per attacked update (a cell,
or a client's update in one round), each with its verdict (:func:`gradleak.report.risk.judge`)."""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gradleak.errors import DataError
from gradleak.paths import one_line
from gradleak.report.figures import MAX_PLOTTED
from gradleak.report.risk import Verdict, converged_of, finite, inside, judge, psnr_of
from gradleak.specs import flat_flags

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
# same client attacked several ways (judged by the worst case over the attacks). Every attack
# constant its SPEC declares (specs.flat_flags) is one; the model, the modality, the data, the
# defenses and the threat are the client's.
ATTACK_SIDE = frozenset({
    "attack", "iterations", "lr", "optimizer", "init", "dtype", "preset", "seeds", "group", "bn", "labels", "restarts",
    "fallback", "stall_restarts", "stop", "alpha_g", "alpha_tv", "alpha_l2", "alpha_bn", "alpha_group", "alpha_n",
    "warmup", "registration_start", "registration_every", "registration_steps", "final", "box", "search_evaluations",
    *RUN_ONLY_FIELDS, *flat_flags()})
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


# ------------------------------------------------------------------ audit.csv (Flower audit)
def read_audit(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows of a Flower audit's audit.csv. Every row must have as many fields as the
    header, the header must name round and client, round must be an integer, the numeric
    columns numbers (or empty) and a run folder runs/NAME (or empty); otherwise one DataError
    naming the file and line."""
    from gradleak.paths import read_text_file

    text = read_text_file(path, "audit file", max_bytes=MAX_AUDIT_BYTES)
    if "\x00" in text:
        raise DataError(f"audit file {path} holds NUL bytes: not a CSV file")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if not header:
            raise DataError(f"audit file {path} is empty: no header line")
        missing = [c for c in AUDIT_REQUIRED if c not in header]
        if missing:
            raise DataError(f"audit file {path} has no column {', '.join(missing)} "
                            f"(header: {one_line(','.join(header), 120)})")
        if len(set(header)) != len(header):
            raise DataError(f"audit file {path}: a column name appears twice in the header")
        rows: list[dict[str, str]] = []
        for fields in reader:
            line = reader.line_num
            if not fields:
                continue
            if len(fields) != len(header):
                raise DataError(f"audit file {path} line {line}: {len(fields)} fields, the header has {len(header)}")
            row = dict(zip(header, fields, strict=True))
            try:
                rnd = int(row["round"])
            except ValueError:
                raise DataError(f"audit file {path} line {line}: round {one_line(repr(row['round']), 40)} "
                                "is not an integer") from None
            if not 0 <= rnd < 2**31:
                raise DataError(f"audit file {path} line {line}: round {rnd} is out of range")
            for c in AUDIT_NUMERIC:
                v = row.get(c, "")
                if v:
                    try:
                        float(v)
                    except ValueError:
                        raise DataError(f"audit file {path} line {line}: {c} {one_line(repr(v), 40)} "
                                        "is not a number") from None
            run = row.get("run", "")
            if run and not AUDIT_RUN.fullmatch(run):
                raise DataError(f"audit file {path} line {line}: run {one_line(repr(run), 80)} is not a run folder "
                                "of the audit (runs/NAME)")
            rows.append(row)
    except csv.Error as exc:
        raise DataError(f"audit file {path} is not a readable CSV file: {one_line(str(exc))}") from None
    return header, rows


def _bool(text: str | None) -> bool | None:
    t = (text or "").strip().lower()
    return True if t in ("true", "1", "yes") else False if t in ("false", "0", "no") else None


def audit_verdict(row: Mapping[str, str]) -> Verdict:
    """The verdict of one row of an audit.csv written before run folders, from its own columns.
    Audits written before audit.csv had ``noise_floor``: an update with no defenses has none; a
    defended one's is unknown."""
    defenses = [d for d in (row.get("defenses") or "").split(";") if d]
    floor: Any = row.get("noise_floor") if "noise_floor" in row else (0.0 if not defenses else None)
    if floor == "":
        floor = 0.0 if not defenses else None
    unmodelled = [d for d in (row.get("unmodelled_defenses") or "").split(";") if d]
    return judge(row.get("status", "ok") or "ok", row.get("psnr_mean") or None, _bool(row.get("converged")),
                 attack=row.get("attack"), noise_floor=floor, unmodelled=unmodelled, defenses=defenses)


def _text(v: Any) -> str:
    """A value as an audit.csv cell holds it (what the rows of audits before run folders held)."""
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ""
    if isinstance(v, list):
        return ";".join(str(x) for x in v)
    return str(v)


def run_details(metrics: Mapping[str, Any]) -> dict[str, str]:
    """What an audited update's run folder says of it beyond the index, in the columns of audits
    before run folders: its batch, FedAvg hyper-parameters, defenses, scores, convergence and time;
    and what the server sent and a closed form's separated inputs ("S of K")."""
    def part(key: str) -> Mapping[str, Any]:
        v = metrics.get(key)
        return v if isinstance(v, Mapping) else {}

    conv, threat, audit = part("convergence"), part("threat"), part("audit")
    values = {"num_examples": metrics.get("batch_size"), "local_steps": threat.get("local_steps"),
              "local_batch_size": threat.get("local_batch_size"), "local_lr": threat.get("local_lr"),
              "defenses": metrics.get("defenses"), "ssim_mean": metrics.get("ssim_mean"),
              "mse_mean": metrics.get("mse_mean"), "label_accuracy": metrics.get("label_accuracy"),
              "gradient_distance": metrics.get("gradient_distance"), "converged": metrics.get("converged"),
              "noise_floor": conv.get("noise_floor"), "unmodelled_defenses": conv.get("unmodelled_defenses"),
              "iterations": metrics.get("iterations"), "attack_seconds": audit.get("attack_seconds"),
              "update_norm": audit.get("update_norm"), "server": server_text(metrics),
              "separated": separated_text(metrics)}
    return {k: _text(v) for k, v in values.items() if v is not None}


def audit_item(row: dict[str, str], root: Path, files: RunFiles | None = None) -> Item:
    """One index row; with a run folder (``run``), judged on its metrics.json as a cell is (read by
    ``files``: bounded, never through a link)."""
    status = row.get("status", "ok") or "ok"
    run = row.get("run") or None
    if run is None:   # not attacked, or an audit before run folders: the row is all there is
        v = audit_verdict(row)
        return Item(key=(int(row["round"]), row["client"]), verdict=v,
                    psnr=psnr_of(row.get("psnr_mean") or None) if v.truth else None,
                    rel=finite(row.get("relative_gradient_distance") or None), status=status,
                    fields=dict(row), metrics=dict(row), image=row.get("reconstruction") or None,
                    error=shown_error(row.get("error")))
    folder = inside(root, run)
    if folder is None or folder.is_symlink() or not folder.is_dir():
        raise DataError(f"{root / 'audit.csv'}: the run folder of round {row['round']}, client "
                        f"{one_line(row['client'], 80)} ({run}) is missing or not a folder of {root}")
    m = (files or RunFiles(root)).read(folder / "metrics.json", required=True)
    if not isinstance(m, dict):
        raise DataError(f"{one_line(str(folder / 'metrics.json'))} must hold a JSON object")
    fields = {**row, **run_details(m)}
    attack = m.get("attack") if isinstance(m.get("attack"), str) else row.get("attack")
    v = judge(status, m.get("psnr_mean"), converged_of(m), metrics={**m, "attack": attack}) if status == "ok" else \
        judge(status, None, None, attack=attack)
    conv = m.get("convergence") if isinstance(m.get("convergence"), dict) else {}
    image = f"{run}/{RUN_IMAGE}" if plain_file(root, f"{run}/{RUN_IMAGE}") else None
    return Item(key=(int(row["round"]), row["client"]), verdict=v, psnr=psnr_of(m.get("psnr_mean")) if v.truth else None,
                rel=finite(conv.get("relative_gradient_distance", m.get("relative_gradient_distance"))),
                status=status, fields=fields, metrics=dict(fields), image=image, error=shown_error(row.get("error")),
                run=run)


def load_audit(folder: Path) -> Source:
    header, rows = read_audit(folder / "audit.csv")
    files = RunFiles(folder)
    return Source(kind="audit", folder=folder, data=folder, items=[audit_item(r, folder, files) for r in rows],
                  audit_columns=header)


# A folder of runs is read within these bounds, declared here and checked before anything is
# parsed: the scan sums the sizes of every run's metrics.json and config.json (each run counted,
# hard links too: the page's work grows with the runs it shows), and each file's text is bounded
# in the values it can hold before it is parsed (JSON of empty objects costs ~25x its size in
# memory). Past a bound the command stops with one line: a risk report that left runs out could
# miss the one that leaked.
MAX_RUN_FOLDERS = 10_000   # run folders a "runs" dashboard reads
MAX_RUNS_BYTES = 64 * 1024 * 1024   # metrics.json + config.json text, all runs together
MAX_RUNS_VALUES = 2_000_000   # JSON values parsed, all distinct files together
RUN_FILES = ("metrics.json", "config.json")
NO_LINKS = "a dashboard shows only what its folder holds and never follows a link"


def json_values_bound(text: str) -> int:
    """At most how many values (object keys aside) JSON ``text`` holds, without parsing it: every
    value is the document, the first in an array or object, or follows a comma."""
    return 1 + text.count(",") + text.count("[") + text.count("{")


class RunFiles:
    """Reads the JSON files of a folder's run folders within the folder's budget
    (:data:`MAX_RUNS_BYTES`, :data:`MAX_RUNS_VALUES`), never through a symbolic link (the page
    shows only what the folder holds), and each file (inode) parsed once: hard links of one
    metrics.json share one parsed value."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.bytes = 0
        self.values = 0
        self._parsed: dict[tuple[int, int], tuple[tuple[int, int], Any]] = {}

    def _over(self, what: str) -> DataError:
        return DataError(f"{one_line(str(self.folder))}: its run folders hold more than {what}, more than a "
                         "dashboard reads; give a folder with fewer runs (e.g. move some into a subfolder)")

    def charge_bytes(self, n: int) -> None:
        self.bytes += n
        if self.bytes > MAX_RUNS_BYTES:
            raise self._over(f"{MAX_RUNS_BYTES // 2**20} MiB of metrics.json and config.json")

    def read(self, path: Path, *, required: bool) -> Any:
        """The parsed JSON at ``path``; None when absent and not required. A link, a file that is
        not a regular one, too large, not UTF-8 or not JSON is one DataError naming it."""
        from gradleak.paths import loads_json
        from gradleak.report.html import MAX_JSON_BYTES

        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        shown = one_line(str(path))
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            if required:
                raise DataError(f"{shown} not found: a run folder needs {path.name} to be shown") from None
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise DataError(f"{shown} is a symbolic link, not a regular file of the folder; {NO_LINKS}") from None
            raise DataError(f"{shown} cannot be read: {exc.strerror or exc}") from None
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise DataError(f"{shown} is not a regular file")
            if st.st_size > MAX_JSON_BYTES:
                raise DataError(f"{shown} is {st.st_size} bytes; at most {MAX_JSON_BYTES} are read")
            self.charge_bytes(st.st_size)
            version = (st.st_size, st.st_mtime_ns)
            cached = self._parsed.get((st.st_dev, st.st_ino))
            if cached is not None and cached[0] == version:
                return cached[1]
            try:
                text = fh.read(MAX_JSON_BYTES + 1).decode("utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{shown} is not UTF-8 text") from None
            except OSError as exc:
                raise DataError(f"{shown} cannot be read: {exc.strerror or exc}") from None
        if len(text) > MAX_JSON_BYTES:
            raise DataError(f"{shown} grew past {MAX_JSON_BYTES} bytes while it was read")
        self.values += json_values_bound(text)
        if self.values > MAX_RUNS_VALUES:
            raise self._over(f"{MAX_RUNS_VALUES:,} JSON values")
        value = loads_json(text, shown)
        self._parsed[(st.st_dev, st.st_ino)] = (version, value)
        return value


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


@dataclass
class RunScan:
    """The run folders of a folder of runs, and the symbolic links the scan did not follow."""

    runs: list[Path]
    links: list[str]   # relative to the folder: links to a run folder, a metrics.json or a config.json
    bytes: int         # metrics.json + config.json, every run counted


def _run_entry(e: os.DirEntry[str], links: list[str]) -> int | None:
    """The size of a run folder's JSON files, or None when ``e`` is not a run folder to read (not a
    folder, no metrics.json, or a link on the way: added to ``links``)."""
    if e.is_symlink():
        links.append(e.name)
        return None
    if not e.is_dir(follow_symlinks=False):
        return None
    size = 0
    for name in RUN_FILES:
        try:
            st = os.lstat(os.path.join(e.path, name))
        except OSError:
            if name == "metrics.json":
                return None
            continue
        if stat.S_ISLNK(st.st_mode):
            links.append(f"{e.name}/{name}")
            return None
        if name == "metrics.json" and not stat.S_ISREG(st.st_mode):
            return None
        size += st.st_size
    return size


def scan_runs(folder: Path) -> RunScan:
    """The run folders in ``folder`` (gradleak attack's --out folders: a metrics.json inside), in
    name order, hidden (staging) folders left out; a run folder that is a link, or whose
    metrics.json or config.json is one, is never followed (counted in ``links``). At most
    :data:`MAX_RUN_FOLDERS` runs and :data:`MAX_RUNS_BYTES` of their JSON, or one DataError before
    anything is parsed."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return RunScan([], [], 0)
    scan = RunScan([], [], 0)
    budget = RunFiles(folder)
    for e in entries:
        if e.name.startswith("."):
            continue
        size = _run_entry(e, scan.links)
        if size is None:
            continue
        scan.runs.append(Path(e.path))
        if len(scan.runs) > MAX_RUN_FOLDERS:
            raise DataError(f"{one_line(str(folder))} holds more than {MAX_RUN_FOLDERS} run folders, more than a "
                            "dashboard reads; give a folder with fewer runs (e.g. move some into a subfolder)")
        budget.charge_bytes(size)
        scan.bytes += size
    return scan


def load_runs(folder: Path, scan: RunScan) -> Source:
    """A folder of single `gradleak attack` runs (runs/ by default) as a dashboard source: each run
    folder is one cell (its config.json the fields, its metrics.json the evidence; verdicts from
    gradleak.outcome as everywhere), read by :class:`RunFiles` (bounded, no link followed)."""
    from datetime import datetime, timezone

    files = RunFiles(folder)
    records: list[Cell] = []
    for run in scan.runs:
        metrics = files.read(run / "metrics.json", required=True)
        config = files.read(run / "config.json", required=False)
        if isinstance(config, dict) and isinstance(config.get("config"), dict):
            config = config["config"]
        if not isinstance(metrics, dict):
            raise DataError(f"{run / 'metrics.json'} does not hold a JSON object")
        config = config if isinstance(config, dict) else {k: metrics.get(k) for k in ("attack", "model", "data")}
        config = {**config, **attacked_fields(metrics, config)}  # what the run attacked, not config's defaults
        finished = datetime.fromtimestamp(os.lstat(run / "metrics.json").st_mtime, timezone.utc)
        records.append(RunCell(cell_id=run.name, status="ok", grid={}, config=config, metrics=metrics, error=None,
                               wall_seconds=finite(metrics.get("wall_seconds")), worker=None,
                               finished_at=finished.strftime("%Y-%m-%dT%H:%M:%SZ")))
    src = Source(kind="runs", folder=folder, data=folder, records=records, sweeps=len(records),
                 links_skipped=list(scan.links))
    src.items = [cell_item(r, folder, runs="") for r in records]
    return src


def load_source(folder: Path, stores: StoreAccess) -> Source:
    """The folder as a dashboard reads it: a sweep (results.sqlite, read by ``stores``), an
    experiment (cells/), a Flower audit (audit.csv), a folder of single attack runs (run folders
    with metrics.json); else one DataError."""
    found = store_folder(folder, stores)
    if found is not None:
        _not_a_link(found[1] / stores.name)
        return load_store(found[0], folder, found[1], stores)
    if os.path.lexists(folder / "audit.csv"):
        _not_a_link(folder / "audit.csv")
        return load_audit(folder)
    scan = scan_runs(folder)
    if scan.runs:
        return load_runs(folder, scan)
    links = f" ({len(scan.links)} symbolic links not followed)" if scan.links else ""
    raise DataError(f"{folder} holds no sweep results ({stores.name}), no experiment ({EXPERIMENT_CELLS}/"
                    f"{stores.name}), no audit.csv and no run folders{links}")


def _not_a_link(path: Path) -> None:
    """A folder's index (its store, audit.csv) is read only from the folder itself, never through a link."""
    if path.is_symlink():
        raise DataError(f"{one_line(str(path))} is a symbolic link, not a regular file of the folder; {NO_LINKS}")


def client_order(clients: Iterable[str]) -> list[str]:
    """Clients in natural order: numbers by value, then names."""
    def key(c: str) -> tuple[int, float, str]:
        try:
            return (0, float(c), c) if math.isfinite(float(c)) else (1, 0.0, c)
        except ValueError:
            return (1, 0.0, c)
    return sorted(set(clients), key=key)
