"""`gradleak dashboard DIR`: one self-contained HTML page from a sweep's results store.

Sections: a summary; leakage (PSNR, label accuracy) vs batch size per attack; the IIP curve
(identifiability vs batch size, when the cells computed the paper metrics); the defense
trade-off (leakage per defense setting, and model accuracy vs leakage when the cells carry an
accuracy); marginal means per grid field; every cell; failed cells with their errors. A folder
holding a Flower audit (audit.csv) gets leakage per round and client instead.

Like the run report (gradleak.report.html) the page embeds its figures as data: URIs, loads
nothing, forbids loading anything with a Content-Security-Policy, and escapes every string read
from the store (configs hold user-chosen names: data folders, model callables, defense specs).
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DataError
from ..report.figures import MAX_PLOTTED, _png_bytes
from ..report.html import _CSS, _fmt, check_folder, display_name
from ..report.page import figure, html_page, value_cell, write_page
from .store import CSV_NAME, LOCK_NAME, STORE_NAME, STORE_SIDE_FILES, CellRecord, ResultStore, one_line

MAX_TABLE_ROWS = 1000
# audit.csv is read whole (one row per audited update, ~200 bytes each).
MAX_AUDIT_BYTES = 32 * 1024 * 1024
AUDIT_REQUIRED = ("round", "client")
AUDIT_NUMERIC = ("num_examples", "psnr_mean", "ssim_mean", "mse_mean", "label_accuracy", "gradient_distance",
                 "iterations", "attack_seconds", "update_norm", "local_steps", "local_batch_size", "local_lr")
# Written on every dashboard page, early: an existing --out file is replaced only if it holds it.
GENERATOR = "gradleak dashboard"
# Keys that may hold the accuracy of the attacked model (for the defense trade-off).
ACCURACY_KEYS = ("model_accuracy", "test_accuracy", "accuracy")


# ------------------------------------------------------------------ data
def _num(v: Any) -> float | None:
    """A plottable number: finite, not a bool, at most MAX_PLOTTED in magnitude; else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:  # an int beyond float range
        return None
    return f if math.isfinite(f) and abs(f) <= MAX_PLOTTED else None


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample std; values near the float limit give inf/nan, never OverflowError
    (``x ** 2`` raises where ``x * x`` overflows to inf)."""
    m = sum(values) / len(values)        # not math.fsum: it raises on intermediate overflow
    var = sum((v - m) * (v - m) for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return m, math.sqrt(var) if var == var and var >= 0 else float("nan")


def _batch(cfg: Mapping[str, Any]) -> int | None:
    """The batch size of a cell (x of the leakage curves), None when the stored value is not a
    positive integer."""
    k = cfg.get("batch_size", 1)
    return k if isinstance(k, int) and not isinstance(k, bool) and 0 < k < 2**31 else None


def _defense_name(cfg: Mapping[str, Any]) -> str:
    d = cfg.get("defense") or []
    if isinstance(d, list):
        return ";".join(str(x) for x in d) if d else "none"
    return str(d)


def _series_key(cfg: Mapping[str, Any], vary: Sequence[str]) -> str:
    """attack, plus whichever of model / threat / defense vary across the cells."""
    parts = [str(cfg.get("attack"))]
    for key in vary:
        parts.append(_defense_name(cfg) if key == "defense" else f"{key}={cfg.get(key)}")
    return ", ".join(parts)


def _varying(records: Sequence[CellRecord], keys: Iterable[str]) -> list[str]:
    out = []
    for key in keys:
        seen = {_defense_name(r.config) if key == "defense" else repr(r.config.get(key)) for r in records}
        if len(seen) > 1:
            out.append(key)
    return out


def _grouped(records: Sequence[CellRecord], metric: str, series_of: Any, x_of: Any) -> dict[str, dict[Any, list[float]]]:
    groups: dict[str, dict[Any, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        v = _num((r.metrics or {}).get(metric))
        x = x_of(r)
        if v is not None and x is not None:
            groups[series_of(r)][x].append(v)
    return groups


# ------------------------------------------------------------------ figures
def _line_png(groups: Mapping[str, Mapping[Any, list[float]]], xlabel: str, ylabel: str, title: str,
              logx: bool = False) -> bytes:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.8), dpi=100, facecolor="white", layout="constrained")
    ax = fig.add_subplot()
    for name, points in sorted(groups.items()):
        xs = sorted(points)
        stats = [_mean_std(points[x]) for x in xs]
        ax.errorbar(xs, [m for m, _ in stats], yerr=[s for _, s in stats], marker="o", ms=4, lw=1.4, capsize=3,
                    label=str(name))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if logx:
        ax.set_xscale("log", base=2)
    ticks = sorted({x for points in groups.values() for x in points})
    if ticks and len(ticks) <= 16 and all(isinstance(x, int) for x in ticks):
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(x) for x in ticks])
        ax.minorticks_off()
    ax.grid(True, alpha=0.3)
    if groups:
        ax.legend(loc="best", fontsize=8)
    return _png_bytes(fig)


def _bar_png(groups: Mapping[str, Mapping[str, list[float]]], ylabel: str, title: str) -> bytes:
    from matplotlib.figure import Figure

    cats = sorted({c for points in groups.values() for c in points}, key=lambda c: (c != "none", c))
    names = sorted(groups)
    fig = Figure(figsize=(6.4, 3.8), dpi=100, facecolor="white", layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        xs, ys, es = [], [], []
        for j, c in enumerate(cats):
            if c in groups[name]:
                m, s = _mean_std(groups[name][c])
                xs.append(j + (i - (len(names) - 1) / 2) * width)
                ys.append(m)
                es.append(s)
        ax.bar(xs, ys, width=width, yerr=es, capsize=3, label=str(name))
    ax.set_xticks(range(len(cats)))
    ax.set_xticklabels([c if len(c) <= 18 else c[:17] + "…" for c in cats], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    if names and ax.get_legend_handles_labels()[0]:  # no legend when every bar was left out
        ax.legend(loc="best", fontsize=8)
    return _png_bytes(fig)


def _scatter_png(points: Mapping[str, list[tuple[float, float]]], xlabel: str, ylabel: str, title: str) -> bytes:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.8), dpi=100, facecolor="white", layout="constrained")
    ax = fig.add_subplot()
    for name, xy in sorted(points.items()):
        ax.scatter([x for x, _ in xy], [y for _, y in xy], s=18, label=str(name))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    if points:
        ax.legend(loc="best", fontsize=8)
    return _png_bytes(fig)


# ------------------------------------------------------------------ html pieces
def _table(columns: Sequence[str], rows: Iterable[Sequence[Any]], keys: Sequence[str] | None = None) -> str:
    keys = keys or columns
    head = "".join(f"<th>{escape(str(c))}</th>" for c in columns)
    body = []
    for row in rows:
        cells = "".join(value_cell(v, _fmt(str(k), v)) for k, v in zip(keys, row))
        body.append(f"<tr>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _stats_table(groups: Mapping[str, Mapping[Any, list[float]]], xname: str, metric: str) -> str:
    rows = []
    for name in sorted(groups):
        for x in sorted(groups[name], key=lambda v: (str(type(v)), v)):
            m, s = _mean_std(groups[name][x])
            rows.append([name, x, m, s, len(groups[name][x])])
    return _table(["series", xname, f"{metric} mean", "std", "cells"], rows,
                  ["series", xname, metric, metric, "cells"])


def _notice(text: str) -> str:
    return f'<p class="notice">{escape(text)}</p>'


# ------------------------------------------------------------------ sections
def _summary(records: Sequence[CellRecord], sweeps: int, folder: Path) -> str:
    ok = [r for r in records if r.status == "ok"]
    def distinct(key: str) -> str:
        vals = sorted({str(r.config.get(key)) for r in records})
        return ", ".join(vals[:12]) + (f" (+{len(vals) - 12})" if len(vals) > 12 else "")
    items = {"cells finished": len(records), "ok": len(ok), "failed": len(records) - len(ok),
             "attack converged": sum(1 for r in ok if _verdict(r) == "converged"),
             "inconclusive (attack did not converge)": sum(1 for r in ok if _verdict(r) == "inconclusive"),
             "attacks": distinct("attack"), "models": distinct("model"), "data": distinct("data"),
             "threat models": distinct("threat"), "defenses": ", ".join(sorted({_defense_name(r.config) for r in records})),
             "sweep runs": sweeps}
    if records:
        items["first finished"] = min(r.finished_at for r in records)
        items["last finished"] = max(r.finished_at for r in records)
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{_fmt(k, v)}</td></tr>" for k, v in items.items())
    return f"<h2>Summary</h2><table>{rows}</table>"


def _vs_batch(records: Sequence[CellRecord], vary: Sequence[str]) -> str:
    out = ["<h2>Leakage vs batch size</h2>"]
    series = (lambda r: _series_key(r.config, vary))  # noqa: E731
    x_of = (lambda r: _batch(r.config))  # noqa: E731
    any_plot = False
    for metric, label in (("psnr_mean", "PSNR (dB, mean over the batch)"), ("label_accuracy", "label accuracy"),
                          ("ssim_mean", "SSIM (mean)")):
        groups = _grouped(records, metric, series, x_of)
        if not groups:
            continue
        any_plot = True
        logx = len({x for g in groups.values() for x in g}) > 2
        png = _line_png(groups, "batch size K", label, f"{metric} vs batch size (mean ± std over cells)", logx=logx)
        out.append(f'<div class="flex"><div>{figure(png, f"{metric} vs batch size", f"{metric} per attack")}</div>'
                   f"<aside>{_stats_table(groups, 'batch_size', metric)}</aside></div>")
    if not any_plot:
        out.append(_notice("No cell has ground-truth scores (psnr_mean): nothing to plot."))
    return "".join(out)


def _iip(records: Sequence[CellRecord], vary: Sequence[str]) -> str:
    groups = _grouped(records, "iip", lambda r: _series_key(r.config, vary), lambda r: _batch(r.config))
    head = "<h2>IIP curve (image identifiability precision vs batch size)</h2>"
    if not groups:
        return head + _notice("No cell computed IIP: set paper_metrics: true in the spec (the default) to get it.")
    png = _line_png(groups, "batch size K", "IIP (fraction of images identified)", "IIP vs batch size",
                    logx=len({x for g in groups.values() for x in g}) > 2)
    return head + f'<div class="flex"><div>{figure(png, "IIP vs batch size", "IIP per attack")}</div>' \
                  f"<aside>{_stats_table(groups, 'batch_size', 'iip')}</aside></div>"


def _defenses(records: Sequence[CellRecord]) -> str:
    head = "<h2>Defense trade-off</h2>"
    if len({_defense_name(r.config) for r in records}) < 2:
        return head + _notice("All cells use the same defense setting; add a defense: [...] grid entry to compare.")
    out = [head]
    series = (lambda r: str(r.config.get("attack")))  # noqa: E731
    for metric, label in (("psnr_mean", "PSNR (dB)"), ("label_accuracy", "label accuracy")):
        groups = _grouped(records, metric, series, lambda r: _defense_name(r.config))
        if groups:
            png = _bar_png(groups, label, f"{metric} per defense setting (lower = more private)")
            out.append(f'<div class="flex"><div>{figure(png, f"{metric} per defense", f"{metric} per defense")}</div>'
                       f"<aside>{_stats_table(groups, 'defense', metric)}</aside></div>")
    acc_key = next((k for k in ACCURACY_KEYS if any(_num((r.metrics or {}).get(k)) is not None for r in records)), None)
    if acc_key is None:
        out.append(_notice("The cells carry no model accuracy, so only the leakage side of the trade-off is shown; "
                           "the accuracy a defense costs comes from training under it (gradleak train --defense)."))
    else:
        points: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for r in records:
            a, p = _num((r.metrics or {}).get(acc_key)), _num((r.metrics or {}).get("psnr_mean"))
            if a is not None and p is not None:
                points[_defense_name(r.config)].append((p, a))
        if points:
            png = _scatter_png(points, "leakage: PSNR (dB)", f"model {acc_key}", "accuracy vs leakage per defense")
            out.append(figure(png, "accuracy vs leakage", "each point is one cell; up and left is better"))
    return "".join(out)


def _marginals(records: Sequence[CellRecord], grid_fields: Sequence[str]) -> str:
    if not grid_fields:
        return ""
    parts = ["<h2>Mean leakage per grid value</h2>"]
    for f in grid_fields:
        groups: dict[str, list[float]] = defaultdict(list)
        for r in records:
            v = _num((r.metrics or {}).get("psnr_mean"))
            if v is not None:
                key = _defense_name(r.config) if f == "defense" else str(r.config.get(f, r.grid.get(f)))
                groups[key].append(v)
        if groups:
            rows = [[k, *_mean_std(v), len(v)] for k, v in sorted(groups.items())]
            parts.append(f"<h3>{escape(f)}</h3>" + _table([f, "psnr_mean", "std", "cells"], rows,
                                                          [f, "psnr_mean", "psnr_mean", "cells"]))
    return "".join(parts)


# A cell rebuilt the data when its mean PSNR reaches this (the experiments' success threshold,
# experiments/common.py THRESHOLD_DB: MSE 0.01 on [0, 1] pixels).
LEAKED_DB = 20.0


def _rebuilt(r: CellRecord) -> bool:
    p = (r.metrics or {}).get("psnr_mean") if r.status == "ok" else None
    return isinstance(p, (int, float)) and p >= LEAKED_DB


def _verdict(r: CellRecord) -> str:
    """"converged", "inconclusive" (the attack did not converge), or "" (failed cell / no verdict)."""
    c = (r.metrics or {}).get("converged") if r.status == "ok" else None
    return "" if not isinstance(c, bool) else ("converged" if c else "inconclusive")


def _cells(records: Sequence[CellRecord], grid_fields: Sequence[str]) -> str:
    metrics = ["psnr_mean", "ssim_mean", "label_accuracy", "iip", "gradient_distance", "wall_seconds"]
    cols = ["cell_id", "status", "verdict", *grid_fields, *metrics]
    rows = []
    for r in records[:MAX_TABLE_ROWS]:
        m = r.metrics or {}
        rows.append([r.cell_id, r.status, _verdict(r), *[_defense_name(r.config) if f == "defense" else r.config.get(f)
                                                         for f in grid_fields], *[m.get(k) for k in metrics]])
    more = (f"<p class=\"muted\">{len(records) - MAX_TABLE_ROWS} more cells in results.csv</p>"
            if len(records) > MAX_TABLE_ROWS else "")
    failed = [r for r in records if r.status != "ok"]
    fail_html = ""
    if failed:
        fail_html = "<h2>Failed cells</h2>" + _table(["cell_id", *grid_fields, "error"],
                                                      [[r.cell_id, *[r.grid.get(f) for f in grid_fields], r.error]
                                                       for r in failed[:MAX_TABLE_ROWS]])
    return "<h2>All cells</h2>" + _table(cols, rows) + more + fail_html


def _page(title: str, subtitle: str, body: str) -> str:
    """The page: ``title`` and ``subtitle`` as text (escaped here), ``body`` HTML."""
    return html_page(escape(title), escape(subtitle), body, css=_CSS, generator=GENERATOR)


# ------------------------------------------------------------------ audit.csv (Flower audit)
def _read_audit(path: Path) -> list[dict[str, str]]:
    """Rows of a Flower audit's audit.csv. Every row must have as many fields as the header,
    the header must name round and client, round must be an integer and the numeric columns
    numbers (or empty); otherwise one DataError naming the file and line."""
    from ..paths import read_text_file

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
            row = dict(zip(header, fields))
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
            rows.append(row)
    except csv.Error as exc:
        raise DataError(f"audit file {path} is not a readable CSV file: {one_line(str(exc))}") from None
    return rows


def _audit_page(folder: Path) -> str:
    rows = _read_audit(folder / "audit.csv")
    groups: dict[str, dict[Any, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        v = _num(float(r["psnr_mean"])) if r.get("psnr_mean") else None
        if v is not None:
            groups[f"client {r.get('client')}"][int(r["round"])].append(v)
    groups = {k: {x: vs for x, vs in g.items() if vs} for k, g in groups.items() if any(g.values())}
    body = [f"<h2>Summary</h2><p>{len(rows)} audited updates, "
            f"{len({r.get('client') for r in rows})} clients, {len({r.get('round') for r in rows})} rounds.</p>"]
    if groups:
        png = _line_png(groups, "round", "PSNR (dB)", "leakage per client and round")
        body.append(figure(png, "PSNR per round and client", "reconstruction PSNR of each client's update"))
    else:
        body.append(_notice("No ground truth in this audit (a real federation): see gradient_distance below."))
    cols = ["round", "client", "attack", "status", "num_examples", "psnr_mean", "ssim_mean", "label_accuracy",
            "gradient_distance", "converged", "error"]

    def conv(c: str, v: str) -> Any:
        if c in ("psnr_mean", "ssim_mean", "label_accuracy", "gradient_distance") and v:
            return float(v)
        return v
    body.append("<h2>All audited updates</h2>" + _table(cols, [[conv(c, r.get(c, "")) for c in cols]
                                                                for r in rows[:MAX_TABLE_ROWS]]))
    return _page(f"Flower audit: {display_name(folder)}", "gradleak dashboard · per-client leakage", "".join(body))


# ------------------------------------------------------------------ entry point
def _is_dashboard(path: Path) -> bool:
    """Whether ``path`` holds a page this command wrote (the generator mark near the top)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(16384)
    except OSError:
        return False
    return head.lstrip().startswith(b"<!DOCTYPE html>") and GENERATOR.encode() in head


def check_dashboard_target(folder: Path, out: str | os.PathLike[str] | None) -> Path:
    """Where the page goes, checked before anything is read: a file path (not a folder, link or
    device, in a folder that can be written, a UTF-8 name), never one of the sweep's or audit's
    own files, and if it exists, a page an earlier dashboard wrote (nothing else is replaced)."""
    from ..paths import check_distinct, check_output_file

    what = "--out" if out is not None else "dashboard page"
    target = check_output_file(out if out is not None else folder / "dashboard.html", what)
    own = [(name, folder / name) for name in (STORE_NAME, *STORE_SIDE_FILES, CSV_NAME, LOCK_NAME, "audit.csv",
                                               "audit.json")]
    for name, path in own:
        check_distinct((what, target), (f"the folder's {name}", path))
    if target.exists() and not _is_dashboard(target):
        raise ConfigError(f"{what} {target} exists and is not a page gradleak dashboard wrote; "
                          "choose a new file name (nothing else is replaced)")
    return target


def render_dashboard(folder: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> Path:
    """Write DIR/dashboard.html (or ``out``) from DIR/results.sqlite (or DIR/audit.csv).

    Checks first, before reading anything: DIR is a folder; ``out`` is a file path that is not
    one of DIR's data files and, if it exists, an earlier dashboard page. Then the store is
    validated whole (every row), so a damaged store is one DataError naming it and row, and the
    page is written atomically: a failure leaves the previous page (or nothing) in place.
    """
    folder = Path(folder)
    check_folder(folder, "sweep folder", "give the --out folder of a sweep or a Flower audit")
    target = check_dashboard_target(folder, out)
    store_path = folder / STORE_NAME
    if os.path.lexists(store_path):
        with ResultStore(folder, create=False) as store:
            store.quick_check()
            records = list(store.records())
            sweeps = store.sweep_count()
        page = _sweep_page(folder, records, sweeps)
    elif os.path.lexists(folder / "audit.csv"):
        page = _audit_page(folder)
    else:
        raise DataError(f"{folder} holds no sweep results ({STORE_NAME}) and no audit.csv")
    return write_page(target, page)


def _sweep_page(folder: Path, records: list[CellRecord], sweeps: int) -> str:
    grid_fields: list[str] = []
    for r in records:
        for k in r.grid:
            if k not in grid_fields:
                grid_fields.append(k)
    vary = _varying(records, ("model", "threat", "data", "defense"))
    body = [_summary(records, sweeps, folder)]
    if records:
        # Leakage plots and means use the cells whose attack converged (or that predate the
        # verdict) and the cells that rebuilt the data anyway (PSNR >= LEAKED_DB: a leak, whatever
        # the attacker's own verdict): a low PSNR from an attack that failed is inconclusive, never
        # "defended", and a leak is never hidden.
        judged = [r for r in records if _verdict(r) != "inconclusive" or _rebuilt(r)]
        left_out = sum(1 for r in records if r.status == "ok") - sum(1 for r in judged if r.status == "ok")
        if left_out:
            body.append(_notice(f"{left_out} cell(s) are inconclusive (the attack did not converge and stayed below "
                                f"{LEAKED_DB:g} dB): they are left out of the leakage plots and means below, and "
                                "listed as such in the cell table."))
        body += [_vs_batch(judged, vary), _iip(judged, vary), _defenses(judged), _marginals(judged, grid_fields),
                 _cells(records, grid_fields)]
    else:
        body.append(_notice("No cell has finished yet."))
    return _page(f"Sweep: {display_name(folder)}", "gradleak dashboard · from results.sqlite", "".join(body))


def add_dashboard_parser(sub: Any) -> None:
    d = sub.add_parser("dashboard", help="one self-contained HTML page from a sweep folder (or a Flower audit)")
    d.add_argument("dir", help="sweep --out folder (results.sqlite) or audit-flower --out folder (audit.csv)")
    d.add_argument("--out", default=None, help="page to write (default DIR/dashboard.html); an existing file "
                                               "is replaced only if it is an earlier dashboard page")
    d.set_defaults(func=cmd_dashboard)


def cmd_dashboard(args: Any) -> int:
    path = render_dashboard(args.dir, args.out)
    print(f"wrote {display_name(path, full=True)}")
    return 0
