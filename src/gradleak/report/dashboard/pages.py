"""The body of the dashboard page of a sweep or an experiment (cells), and the boxes every page
shares (audit_page.py is the Flower audit's). Each answers, worst first: who leaks, how much, under
which setting. Every string read from the folder is escaped here (or by the table helpers)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from html import escape
from typing import Any

from gradleak.outcome import worst as worst_verdict
from gradleak.report.dashboard.data import (ATTACK_SIDE, RUN_IMAGE, Item, Source, derived_fields, field_text,
                                            is_numeric, num, plain_file, separated_text, setting_label,
                                            varying_fields)
from gradleak.report.figures import bars_png, errorbar_png, mean_std, scatter_png, verdict_bars_png
from gradleak.report.html import format_metric, worst_image
from gradleak.report.run_page import display_name
from gradleak.report.risk import (DEFENDED, FAILED, INCONCLUSIVE, LEAK_THRESHOLD_DB, LEAKED, Html,
                                  ImageBudget, badge, card, chart, count, headline, notice, rules,
                                  setting_verdict, table, worst_first)

MAX_TABLE_ROWS = 1000
MAX_SERIES = 10
MAX_LISTED = 5
# Keys that may hold the accuracy of the attacked model (for the defense trade-off).
ACCURACY_KEYS = ("model_accuracy", "test_accuracy", "accuracy")
# Settings held fixed, listed under "Setup" when they do not vary.
SETUP_FIELDS = ("attack", "model", "width", "data", "threat", "defense", "batch_size", "iterations", "local_steps",
                "clients", "server", "dtype")
THRESHOLD_LINE = (LEAK_THRESHOLD_DB, f"leak threshold {LEAK_THRESHOLD_DB:g} dB")
AXIS_NAMES = {"batch_size": "batch size", "local_steps": "local steps", "iterations": "iterations",
              "width": "model width", "clients": "clients"}


def judged(items: Sequence[Item]) -> list[Item]:
    """What the leakage charts and means use: leaked and defended updates (an inconclusive one
    says nothing about the client; a leak is never hidden)."""
    return [it for it in items if it.label in (LEAKED, DEFENDED)]


def _psnr_text(it: Item) -> str:
    if it.psnr is not None:
        return f"PSNR {it.psnr:.1f} dB"
    if it.rel is not None:
        return f"relative distance {it.rel:.2g}"
    return ""


def worst_box(worst: Item | None, what: str, counts: Mapping[str, int], noun: str) -> str:
    """The box naming the worst ``worst`` of the page's ``counts`` ("" without one)."""
    if worst is None:
        return ""
    if worst.label == LEAKED:
        return (f'<p class="worst"><b>Worst case:</b> {badge(worst.verdict)} {what} &middot; '
                f"<b>{escape(_psnr_text(worst))}</b> &middot; {escape(worst.verdict.reason)}</p>")
    undecided = counts.get(INCONCLUSIVE, 0) + counts.get(FAILED, 0)
    if undecided:
        return notice(f"No {noun[:-1]} leaked, but {undecided} of {sum(counts.values())} {noun} are inconclusive or "
                      "failed: that is not evidence of protection.")
    if counts.get(DEFENDED, 0):
        return (f'<p class="worst calm"><b>No {escape(noun[:-1])} leaked</b>, and every attack converged: '
                f"the defended verdicts are evidence of protection.</p>")
    return ""


def answer_list(lines: Sequence[str]) -> str:
    """The page's answer: its non-empty ``lines`` (HTML) as one list, "" without any."""
    return f'<ul class="answer">{"".join(f"<li>{line}</li>" for line in lines if line)}</ul>' if lines else ""


def listed_names(names: Sequence[str], limit: int = MAX_LISTED) -> str:
    """The first ``limit`` names, escaped, and how many more."""
    shown = ", ".join(escape(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _stats_table(groups: Mapping[str, Mapping[Any, list[float]]], xname: str, metric: str,
                 order: Sequence[Any] | None = None) -> str:
    rows = []
    for name in sorted(groups):
        xs = [x for x in order if x in groups[name]] if order is not None else sorted(groups[name])
        for x in xs:
            m, s = mean_std(groups[name][x])
            rows.append([name, x, m, s, len(groups[name][x])])
    return table(["series", xname, f"{metric} mean", "std", "n"], rows, keys=["series", xname, metric, metric, "n"])


def _section(head: str, charts: Sequence[str], tables: Sequence[tuple[str, str]]) -> str:
    """An axis's charts side by side, then the numbers behind them (collapsed tables)."""
    figs = "".join(f"<div>{c}</div>" for c in charts if c)
    nums = "".join(f"<h4>{escape(t)}</h4>{tb}" for t, tb in tables)
    more = f"<details><summary>The numbers behind the charts</summary>{nums}</details>" if nums else ""
    return f'{head}<div class="charts">{figs}</div>{more}'


# ------------------------------------------------------------------ sweeps and experiments
def _series_fn(items: Sequence[Item], others: Sequence[str]) -> tuple[Callable[[Item], str], str]:
    """Series of a chart along one axis: the other varying fields' values (each setting its own
    line); when that makes more than MAX_SERIES lines, the attack (or one line), pooled."""
    def full(it: Item) -> str:
        return setting_label(it.fields, others) if others else "all cells"
    if len({full(it) for it in items}) <= MAX_SERIES:
        return full, ""
    if "attack" in others:
        return (lambda it: f"attack={field_text('attack', it.fields.get('attack'))}"), \
            f" ({', '.join(o for o in others if o != 'attack')} pooled: too many combinations to draw)"
    return (lambda it: "all cells"), f" ({', '.join(others)} pooled: too many combinations to draw)"


def _values(items: Sequence[Item], metric: str) -> list[float]:
    return [v for v in (num(it.metrics.get(metric)) for it in items) if v is not None]


def _varies(items: Sequence[Item], metric: str) -> bool:
    return len(set(_values(items, metric))) > 1


def _verdict_mix(items: Sequence[Item], axis: str, order: Sequence[str]) -> str:
    """How many cells of each value of ``axis`` got each verdict (every cell, inconclusive included)."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for it in items:
        counts[field_text(axis, it.fields.get(axis))][it.label] += 1
    name = AXIS_NAMES.get(axis, axis)
    png = verdict_bars_png(counts, [c for c in order if c in counts], name, f"verdicts per {name}")
    return chart(png, f"verdicts per {name}", f"verdicts of all cells per {name}", axis=axis, metric="verdicts")


def _leakage_metrics(items: Sequence[Item]) -> list[tuple[str, str]]:
    """PSNR, and label accuracy when it varies (see _constant_accuracy)."""
    metrics = [("psnr_mean", "PSNR (dB, mean over the batch)")]
    return metrics + [("label_accuracy", "label accuracy")] if _varies(items, "label_accuracy") else metrics


def _constant_accuracy(items: Sequence[Item]) -> str:
    """A sentence for a label accuracy that is the same in every charted cell (no chart)."""
    acc = _values(items, "label_accuracy")
    if not acc or _varies(items, "label_accuracy"):
        return ""
    return (f' Label accuracy is {escape(format_metric("label_accuracy", acc[0]))} in every charted cell: it is not '
            "drawn.")


def _numeric_axis(items: Sequence[Item], axis: str, others: Sequence[str], all_items: Sequence[Item]) -> str:
    name = AXIS_NAMES.get(axis, axis)
    series, pooled = _series_fn(items, others)
    xs = sorted({num(it.fields.get(axis)) for it in all_items} - {None})
    logx = len(xs) > 2 and all(x > 0 for x in xs) and xs[-1] / xs[0] >= 8
    order = [field_text(axis, x) for x in sorted({it.fields.get(axis) for it in all_items
                                                   if num(it.fields.get(axis)) is not None}, key=float)]
    metrics = _leakage_metrics(items)
    charts, tables = [_verdict_mix(all_items, axis, order)], []
    for metric, ylabel in metrics:
        groups: dict[str, dict[Any, list[float]]] = defaultdict(lambda: defaultdict(list))
        for it in items:
            v, x = num(it.metrics.get(metric)), it.fields.get(axis)
            if v is not None and num(x) is not None:
                groups[series(it)][x].append(v)
        if groups:
            png = errorbar_png(groups, name, ylabel, f"{metric} vs {name} (mean ± std over cells)", logx=logx,
                               hline=THRESHOLD_LINE if metric == "psnr_mean" else None)
            charts.append(chart(png, f"{metric} vs {name}", f"{metric} vs {name}{pooled}", axis=axis, metric=metric))
            tables.append((f"{metric} vs {name}", _stats_table(groups, axis, metric)))
    out = _section(f"<h3>Leakage vs {escape(name)}</h3>", charts, tables)
    if axis == "batch_size":
        out += _iip(items, series, pooled)
    return out


def _iip(items: Sequence[Item], series: Callable[[Item], str], pooled: str) -> str:
    head = "<h3>IIP curve (image identifiability precision vs batch size)</h3>"
    groups: dict[str, dict[Any, list[float]]] = defaultdict(lambda: defaultdict(list))
    for it in items:
        v, x = num(it.metrics.get("iip")), it.fields.get("batch_size")
        if v is not None and num(x) is not None:
            groups[series(it)][x].append(v)
    if not groups:
        return ""
    png = errorbar_png(groups, "batch size", "IIP (fraction of images identified)", "IIP vs batch size",
                       logx=len({x for g in groups.values() for x in g}) > 2)
    return _section(head, [chart(png, "IIP vs batch size", f"IIP per setting{pooled}", axis="batch_size",
                                 metric="iip")], [("IIP vs batch size", _stats_table(groups, "batch_size", "iip"))])


def _category_order(items: Sequence[Item], axis: str) -> list[str]:
    seen: list[str] = []
    for it in items:
        t = field_text(axis, it.fields.get(axis))
        if t not in seen:
            seen.append(t)
    return sorted(seen, key=lambda c: c != "none") if axis == "defense" else seen


def _categorical_axis(items: Sequence[Item], axis: str, others: Sequence[str], all_items: Sequence[Item]) -> str:
    is_defense = axis == "defense"
    head = "<h3>Defense trade-off</h3>" if is_defense else f"<h3>Leakage per {escape(axis)}</h3>"
    # bars: one per value of the axis; series by attack when it varies, the rest pooled
    series_fields = ["attack"] if "attack" in others else []
    pooled = [o for o in others if o not in series_fields]
    note = f" ({', '.join(pooled)} pooled)" if pooled else ""
    order = _category_order(all_items, axis)
    metrics = _leakage_metrics(items)
    charts, tables = [_verdict_mix(all_items, axis, order)], []
    for metric, ylabel in metrics:
        groups: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for it in items:
            v = num(it.metrics.get(metric))
            if v is not None:
                s = setting_label(it.fields, series_fields) if series_fields else metric
                groups[s][field_text(axis, it.fields.get(axis))].append(v)
        if groups:
            shown = [c for c in order if any(c in g for g in groups.values())]
            missing = [c for c in order if c not in shown]
            png = bars_png(groups, ylabel, f"{metric} per {axis} (mean ± std; lower = more private)", order=shown,
                           hline=THRESHOLD_LINE if metric == "psnr_mean" else None)
            cap = f"{metric} per {axis}{note}" + (f"; no leaked or defended cell at {', '.join(missing)}"
                                                  if missing else "")
            charts.append(chart(png, f"{metric} per {axis}", cap, axis=axis, metric=metric))
            tables.append((f"{metric} per {axis}", _stats_table(groups, axis, metric, order)))
    out = _section(head, charts, tables)
    if is_defense:
        out += _accuracy(items)
    return out


def _accuracy(items: Sequence[Item]) -> str:
    acc_key = next((k for k in ACCURACY_KEYS if any(num(it.metrics.get(k)) is not None for it in items)), None)
    if acc_key is None:
        return ('<p class="muted">The cells carry no model accuracy, so only the leakage side of the trade-off is '
                "shown; the accuracy a defense costs comes from training under it (gradleak train --defense, or "
                "gradleak experiment defenses).</p>")
    points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for it in items:
        a, p = num(it.metrics.get(acc_key)), num(it.metrics.get("psnr_mean"))
        if a is not None and p is not None:
            points[field_text("defense", it.fields.get("defense"))].append((p, a))
    if not points:
        return ""
    png = scatter_png(points, "leakage: PSNR (dB)", f"model {acc_key}", "accuracy vs leakage per defense")
    return chart(png, "accuracy vs leakage", "each point is one cell; up and left is better", axis="defense",
                 metric=acc_key)


def _charts(src: Source, axes: Sequence[str]) -> str:
    ok = [it for it in src.items if it.status == "ok"]
    items = judged(src.items)
    if not axes:
        return "<h2>Charts</h2>" + notice("Every cell attacks the same setting (only seeds or batches differ): "
                                          "there is nothing to chart along; see the verdicts and cells.")
    intro = (f'<h2>Charts</h2><p class="sub">Only along what varies ({escape(", ".join(axes))}): the verdicts of '
             "every cell, and the leakage of the leaked and defended cells (mean ± std per setting; inconclusive "
             f"ones left out); the dashed line is the leak threshold, {LEAK_THRESHOLD_DB:g} dB.{_constant_accuracy(items)}</p>")
    if not ok:
        return "<h2>Charts</h2>" + notice("No cell finished without an error: nothing to chart.")
    parts = []
    for axis in axes:
        others = [a for a in axes if a != axis]
        if is_numeric(it.fields.get(axis) for it in ok):
            parts.append(_numeric_axis(items, axis, others, ok))
        else:
            parts.append(_categorical_axis(items, axis, others, ok))
    return intro + "".join(parts)


def _settings(src: Source, axes: Sequence[str]) -> tuple[str, list[tuple[str, str, float | None]]]:
    """The verdict-per-setting table (worst first) and the settings as (verdict, label, max PSNR)."""
    groups: dict[tuple[str, ...], list[Item]] = defaultdict(list)
    for it in src.items:
        groups[tuple(field_text(a, it.fields.get(a)) for a in axes)].append(it)
    rows, summary = [], []
    for key, members in groups.items():
        v = setting_verdict(it.label for it in members)
        c = count(it.label for it in members)
        psnrs = [it.psnr for it in members if it.psnr is not None]
        judged_psnr = [p for it in judged(members) if (p := num(it.psnr)) is not None]
        worst = min(members, key=lambda it: worst_first(it.label, it.psnr, it.rel))
        best = max(psnrs) if psnrs else None
        rows.append((worst_first(v, best), [badge(v, title=f"{c.get(LEAKED, 0)} leaked of {len(members)}"), *key,
                                            len(members), c.get(LEAKED, 0), c.get(DEFENDED, 0),
                                            c.get(INCONCLUSIVE, 0), c.get(FAILED, 0), best,
                                            mean_std(judged_psnr)[0] if judged_psnr else None, worst.key], v))
        summary.append((v, ", ".join(f"{a}={k}" for a, k in zip(axes, key, strict=True)), best))
    rows.sort(key=lambda r: r[0])
    summary.sort(key=lambda s: worst_first(s[0], s[2]))
    cols = ["verdict", *axes, "cells", "leaked", "defended", "inconclusive", "failed", "max PSNR",
            "mean PSNR (judged)", "worst cell"]
    keys = ["verdict", *axes, "cells", "leaked", "defended", "inconclusive", "failed", "psnr_max", "psnr_mean",
            "cell"]
    html = ("<h2>Verdict per setting (worst first)</h2>"
            + table(cols, [r[1] for r in rows[:MAX_TABLE_ROWS]], keys=keys, row_verdicts=[r[2] for r in rows]))
    return html, summary


def _worst_over_attacks(src: Source, axes: Sequence[str]) -> str:
    """Per client setting (the varying fields that are not the attacker's), the worst verdict over
    the attacks run on it (gradleak.outcome.worst over each attack's setting verdict): a client one
    attack fails on and another rebuilds is a leaking client. Empty unless attacks vary."""
    attack_axes = [a for a in axes if a in ATTACK_SIDE]
    if "attack" not in attack_axes:
        return ""
    client_axes = [a for a in axes if a not in ATTACK_SIDE]
    groups: dict[tuple[str, ...], dict[tuple[str, ...], list[Item]]] = defaultdict(lambda: defaultdict(list))
    for it in src.items:
        client = tuple(field_text(a, it.fields.get(a)) for a in client_axes)
        attacker = tuple(field_text(a, it.fields.get(a)) for a in attack_axes)
        groups[client][attacker].append(it)
    rows = []
    for client, by_attack in groups.items():
        verdicts = {attacker: setting_verdict(it.label for it in members) for attacker, members in by_attack.items()}
        v = worst_verdict(verdicts.values())
        worst_attacker = min(verdicts, key=lambda a: worst_first(verdicts[a]))
        each = Html("; ".join(f"{escape(', '.join(a))}: {badge(verdicts[a], title='')}" for a in verdicts))
        rows.append((worst_first(v), [badge(v, title=""), *client, each, ", ".join(worst_attacker)], v))
    rows.sort(key=lambda r: r[0])
    cols = ["worst case", *client_axes, f"verdict per attack ({', '.join(attack_axes)})", "worst attack"]
    keys = ["verdict", *client_axes, "attacks", "attack"]
    return ("<h2>Worst case over the attacks, per client setting</h2>"
            '<p class="sub">A setting is as exposed as the strongest attack run on it: the worst verdict over the '
            "attacks (each attack's verdict over its seeds as in the table below). \"defended\" only when every "
            "attack's is.</p>"
            + table(cols, [r[1] for r in rows[:MAX_TABLE_ROWS]], keys=keys, row_verdicts=[r[2] for r in rows]))


def _gallery_cells(src: Source, axes: Sequence[str], reps: Sequence[str]) -> str:
    head = "<h2>Reconstructions (worst first)</h2>"
    with_image = sorted((it for it in src.items if it.image), key=lambda it: worst_first(it.label, it.psnr, it.rel))
    if not with_image:
        how = ("the experiment kept no run folder for these cells" if src.kind == "experiment" else
               "these run folders hold no reconstruction.png" if src.kind == "runs" else
               "rerun the sweep with --save-runs to keep each cell's run folder (DIR/runs/CELL/reconstruction.png), "
               "which this page then shows")
        return head + notice(f"No reconstruction pictures were saved with these cells: {how}.")
    budget = ImageBudget()
    cards = []
    for it in with_image:
        png = budget.read(src.image_root, it.image)
        if png is None:
            continue
        title = (f"{badge(it.verdict)} <b>{escape(_psnr_text(it))}</b><br>"
                 f"{escape(setting_label(it.fields, [*axes, *reps]) or 'the one setting')}")
        cards.append(card(title, png, f"reconstruction of cell {it.key}", f"cell {it.key}"))
    return (head + '<p class="sub">Originals (top row) above the reconstructions paired with them (bottom row), '
            "with each image's PSNR and labels.</p>" + f'<div class="gallery">{"".join(cards)}</div>'
            + budget.note(f"{display_name(src.image_root)}/runs/CELL/{RUN_IMAGE}"))


def _cells_table(src: Source, axes: Sequence[str], reps: Sequence[str]) -> str:
    items = sorted(src.items, key=lambda it: worst_first(it.label, it.psnr, it.rel))
    metrics = ["psnr_mean", "ssim_mean", "label_accuracy"]
    # the worst image's PSNR beside the mean (a mean of 86 dB hides an image at 17 dB), for batches
    lowest = {it.key: worst_image(it.metrics) if it.status == "ok" and len(it.metrics.get("per_image") or ()) > 1
              else None for it in items}
    if any(lowest.values()):
        metrics.insert(1, "psnr_min")
    if any(it.metrics.get("iip") is not None for it in items):
        metrics.append("iip")
    # a closed form's inputs read off the update ("S of K"), when a cell records them
    separated = {it.key: separated_text(it.metrics) if it.status == "ok" else None for it in items}
    if any(separated.values()):
        metrics.append("separated")
    names = {"psnr_mean": "PSNR", "psnr_min": "min PSNR", "ssim_mean": "SSIM", "label_accuracy": "label acc.", "iip": "IIP",
             "separated": "separated"}
    cols = ["verdict", "cell", *axes, *reps, *[names[m] for m in metrics], "rel. distance", "why"]
    keys = ["verdict", "cell_id", *axes, *reps, *metrics, "rel", "why"]
    reports = _report_links(src, items[:MAX_TABLE_ROWS])
    if any(reports.values()):   # run folders kept (--save-runs, an experiment's runs/): link each report
        cols.append("report")
        keys.append("report")
    failed = [it for it in src.items if it.status != "ok"]
    # each failed cell's error is said once, in "Failed cells" (cut to one line: data.shown_error)
    listed = {it.key for it in failed[:MAX_TABLE_ROWS]}
    rows = []
    for it in items[:MAX_TABLE_ROWS]:
        why = it.verdict.reason if it.status == "ok" else (
            "failed: error under Failed cells" if it.key in listed else (it.error or it.verdict.reason))
        rows.append([badge(it.verdict), it.key, *[field_text(a, it.fields.get(a)) for a in [*axes, *reps]],
                     *[_metric_cell(it, k, separated, lowest) for k in metrics], it.rel, why])
        if "report" in keys:
            link = reports.get(it.key)
            rows[-1].append(Html(f'<a href="{escape(link, quote=True)}">report.html</a>') if link else "")
    more = (f'<p class="muted">{len(items) - MAX_TABLE_ROWS} more cells in results.csv</p>'
            if len(items) > MAX_TABLE_ROWS else "")
    fail_html = ""
    if failed:
        fail_html = "<h2>Failed cells</h2>" + table(
            ["cell_id", *axes, *reps, "error"],
            [[it.key, *[field_text(a, it.fields.get(a)) for a in [*axes, *reps]], it.error]
             for it in failed[:MAX_TABLE_ROWS]])
        if len(failed) > MAX_TABLE_ROWS:
            fail_html += f'<p class="muted">{len(failed) - MAX_TABLE_ROWS} more failed cells in results.csv</p>'
    return ("<h2>All cells (worst first)</h2>" + table(cols, rows, keys=keys, row_verdicts=[it.label for it in items],
                                                       cls="cells")
            + more + fail_html)


def _metric_cell(it: Item, key: str, separated: Mapping[Any, str | None],
                 lowest: Mapping[Any, tuple[float, str] | None]) -> Any:
    """One measured cell of the cells table: a closed form's "S of K", the worst image's PSNR, or
    the metric as recorded."""
    if key == "separated":
        return separated[it.key]
    if key == "psnr_min":
        worst = lowest.get(it.key)
        return worst[0] if worst else None
    return it.metrics.get(key)


def _report_links(src: Source, items: Sequence[Item]) -> dict[Any, str | None]:
    """Each cell's run folder report.html (DIR/runs/CELL/report.html, a plain file inside the
    store's folder), as a link relative to the page; None when the cell kept no run folder."""
    import os
    from urllib.parse import quote

    import re

    links: dict[Any, str | None] = {}
    runs = src.runs_dir
    for it in items:
        path = runs / str(it.key) / "report.html"
        ok = (it.status == "ok" and re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", str(it.key)) is not None
              and plain_file(src.data, os.path.relpath(path, src.data)) and src.page_dir is not None)
        links[it.key] = quote(os.path.relpath(path, src.page_dir)) if ok else None
    return links


def _setup(src: Source, axes: Sequence[str], reps: Sequence[str], derived: Mapping[str, str]) -> str:
    """One line: what was held fixed, what varies, what repeats, how many cells and runs."""
    records = src.records
    parts: list[tuple[str, str]] = []
    if src.experiment:
        parts.append(("experiment", src.experiment))
    for k in SETUP_FIELDS:
        if k in axes or k in reps or k in derived or not records or not any(k in r.config for r in records):
            continue
        v = records[0].config.get(k)
        if v is None or (k in ("local_steps", "clients") and v == 1):
            continue    # defaults that say nothing
        parts.append((k, field_text(k, v)))
    if axes:
        parts.append(("varying", ", ".join(axes)))
    follows: dict[str, list[str]] = {}
    for f, g in derived.items():
        follows.setdefault(g, []).append(f)
    for g, fs in follows.items():
        parts.append((f"set by {g}", ", ".join(fs)))
    if reps:
        parts.append(("repeated over", ", ".join(f"{r} ({len({field_text(r, x.config.get(r)) for x in records})})"
                                                 for r in reps)))
    parts.append(("run folders" if src.kind == "runs" else "cells", str(len(records))))
    if src.kind != "runs":
        parts.append(("sweep runs", str(src.sweeps)))
    if records:
        parts.append(("finished", f"{min(r.finished_at for r in records)} to {max(r.finished_at for r in records)}"))
    return '<p class="setup">' + "".join(f"<span><b>{escape(k)}</b> {escape(v)}</span>" for k, v in parts) + "</p>"


def sweep_body(src: Source) -> str:
    if not src.records:
        return notice("No cell has finished yet.")
    axes = varying_fields(src.records)
    derived = derived_fields(src.records, axes)
    axes = [a for a in axes if a not in derived]
    reps = varying_fields(src.records, replicates=True)
    counts = count(it.label for it in src.items)
    worst = min(src.items, key=lambda it: worst_first(it.label, it.psnr, it.rel))
    settings_html, settings = _settings(src, axes) if axes else ("", [])
    lines = []
    if axes:
        sc = count(v for v, _, _ in settings)
        lines.append(f"<b>{len(settings)} settings</b> ({escape(', '.join(axes))} vary"
                     + (f"; each repeated over {escape(', '.join(reps))}" if reps else "") + "): "
                     + ", ".join(f"{sc.get(v, 0)} {v}" for v in (LEAKED, DEFENDED, INCONCLUSIVE))
                     + (f", {sc[FAILED]} failed" if sc.get(FAILED) else "") + ".")
        leaked = [f"{label} ({p:.1f} dB)" if p is not None else label for v, label, p in settings if v == LEAKED]
        if leaked:
            lines.append(f"{badge(LEAKED, title='')} {listed_names(leaked)}")
        defended = [label for v, label, _ in settings if v == DEFENDED]
        if defended:
            lines.append(f"{badge(DEFENDED, title='')} {listed_names(defended)}")
    inconclusive = counts.get(INCONCLUSIVE, 0)
    if inconclusive:
        lines.append(f"{inconclusive} cell(s) are inconclusive (the attack did not converge and stayed below "
                     f"{LEAK_THRESHOLD_DB:g} dB): they are left out of the leakage charts and means below, and "
                     "listed as such in the cell table.")
    worst_what = escape(setting_label(worst.fields, [*axes, *reps]) or f"cell {worst.key}")
    has_truth = any(it.verdict.truth for it in src.items)
    no_truth = any(not it.verdict.truth and it.status == "ok" for it in src.items)
    body = [_setup(src, axes, reps, derived), headline(counts, "cells"),
            worst_box(worst, f"{worst_what} (cell {escape(str(worst.key))})", counts, "cells"),
            answer_list(lines), _worst_over_attacks(src, axes), settings_html,
            rules(truth=has_truth, no_truth=no_truth, unit="cell"),
            _gallery_cells(src, axes, reps), _charts(src, axes), _cells_table(src, axes, reps)]
    return "".join(body)
