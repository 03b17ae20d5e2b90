"""The dashboard page of a guard folder (gradleak.guard's guard.csv and its run folders): what each
client decided in each round, the verdicts before and after, and the pictures of both checks.
Every string read from the folder is escaped here (or by the table helpers)."""

from __future__ import annotations

import csv
import io
import os
import re
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gradleak.errors import DataError
from gradleak.paths import one_line
from gradleak.report.dashboard.data import MAX_AUDIT_BYTES, RUN_IMAGE, Source, client_order, plain_file
from gradleak.report.risk import Html, ImageBudget, Verdict, badge, card, finite, notice, table

#: The guard's decisions (gradleak.guard.DECISIONS; a test holds them equal), worst first.
DECISIONS = ("refused model", "withheld", "remedied", "passed")
GUARD_REQUIRED = ("round", "client", "decision", "verdict_before", "verdict_after")
GUARD_NUMERIC = ("noise_multiplier", "noise_sigma", "clip", "seconds", "train_seconds")
# A check's run folder as guard.csv names it (gradleak.guard.flower.RUNS).
GUARD_RUN = re.compile(r"guard-runs/[A-Za-z0-9_][A-Za-z0-9_.-]*")
MAX_GRID_ROUNDS, MAX_GRID_CLIENTS, MAX_PAIRS = 60, 200, 24


@dataclass
class GuardSource(Source):
    """A guard folder: guard.csv's rows (validated by :func:`read_guard`)."""

    rows: list[dict[str, str]] = field(default_factory=list)


def read_guard(path: Path) -> list[dict[str, str]]:
    """The rows of a guard.csv: the header names GUARD_REQUIRED, every row has its fields, round is
    an integer, decision one of DECISIONS, the numeric columns numbers (or empty), a run folder
    guard-runs/NAME (or empty); otherwise one DataError naming the file and line."""
    from gradleak.paths import read_text_file

    text = read_text_file(path, "guard file", max_bytes=MAX_AUDIT_BYTES)
    if "\x00" in text:
        raise DataError(f"guard file {path} holds NUL bytes: not a CSV file")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if not header:
            raise DataError(f"guard file {path} is empty: no header line")
        missing = [c for c in GUARD_REQUIRED if c not in header]
        if missing:
            raise DataError(f"guard file {path} has no column {', '.join(missing)}")
        rows = []
        for fields in reader:
            if fields:
                rows.append(_row(path, reader.line_num, dict(zip(header, fields, strict=False)), len(fields),
                                 len(header)))
    except csv.Error as exc:
        raise DataError(f"guard file {path} is not a readable CSV file: {one_line(str(exc))}") from None
    return rows


def _row(path: Path, line: int, row: dict[str, str], n: int, width: int) -> dict[str, str]:
    where = f"guard file {path} line {line}"
    if n != width:
        raise DataError(f"{where}: {n} fields, the header has {width}")
    try:
        if not 0 <= int(row["round"]) < 2**31:
            raise ValueError
    except ValueError:
        raise DataError(f"{where}: round {one_line(repr(row['round']), 40)} is not a round number") from None
    if row["decision"] not in DECISIONS:
        raise DataError(f"{where}: decision {one_line(repr(row['decision']), 40)} is not one of {', '.join(DECISIONS)}")
    for c in GUARD_NUMERIC:
        if row.get(c) and finite(row[c]) is None:
            raise DataError(f"{where}: {c} {one_line(repr(row[c]), 40)} is not a finite number")
    for c in ("run_before", "run_after"):
        if row.get(c) and not GUARD_RUN.fullmatch(row[c]):
            raise DataError(f"{where}: {c} {one_line(repr(row[c]), 80)} is not a run folder of the guard "
                            "(guard-runs/NAME)")
    return row


def load_guard(folder: Path) -> GuardSource:
    return GuardSource(kind="guard", folder=folder, data=folder, rows=read_guard(folder / "guard.csv"))


def _verdict(label: str) -> Html:
    return badge(Verdict(label, True, "")) if label else Html('<span class="muted">&ndash;</span>')


def _grid(rows: list[dict[str, str]], rounds: list[int], clients: list[str]) -> str:
    cell = {(int(r["round"]), r["client"]): r for r in rows}
    shown_r, shown_c = rounds[:MAX_GRID_ROUNDS], clients[:MAX_GRID_CLIENTS]
    head = "<tr><th>client \\ round</th>" + "".join(f"<th>{r}</th>" for r in shown_r) + "</tr>"
    body = []
    for c in shown_c:
        tds = []
        for r in shown_r:
            row = cell.get((r, c))
            tds.append('<td class="muted">&ndash;</td>' if row is None else
                       f'<td><b>{escape(row["decision"])}</b><br>{_verdict(row["verdict_before"])}'
                       + (f' &rarr; {_verdict(row["verdict_after"])}' if row["verdict_after"] else "") + "</td>")
        body.append(f"<tr><th>{escape(c)}</th>{''.join(tds)}</tr>")
    return (f'<h2>Decision per client and round</h2><div class="scroll"><table class="matrix">{head}{"".join(body)}'
            "</table></div>")


def _pairs(src: GuardSource) -> str:
    """Before / after pictures: each check's reconstruction.png (the client's batch above the
    attack's answer), the update as it was and the one the guard decided on."""
    budget = ImageBudget()
    parts = ["<h2>Before and after</h2>", '<p class="sub">Left: the worst-case attack on the update as trained; '
             "right: on the update the guard decided on (noised). Top row of each picture: the client's batch.</p>"]
    shown = 0
    for row in sorted(src.rows, key=lambda r: (DECISIONS.index(r["decision"]), int(r["round"]))):
        if shown >= MAX_PAIRS or not row.get("run_before"):
            continue
        cards = []
        for col, what in (("run_before", "before"), ("run_after", "after")):
            if row.get(col):
                png = budget.read(src.data, f"{row[col]}/{RUN_IMAGE}")
                label = row["verdict_before"] if what == "before" else row["verdict_after"]
                cards.append(card(f"<b>{what}</b> {_verdict(label)}", png, f"{what}: round {row['round']} client "
                                  f"{row['client']}"))
        parts.append(f"<h3>Round {escape(row['round'])}, client {escape(row['client'])}: "
                     f"{escape(row['decision'])}</h3><div class=\"gallery\">{''.join(cards)}</div>")
        shown += 1
    if shown == 0:
        return parts[0] + notice("No check wrote a run folder (the guard ran without an output folder, or refused "
                                 "every model before training).")
    return "".join(parts) + budget.note(f"{src.folder.name}/guard-runs/")


def _report_link(src: GuardSource, run: str) -> Any:
    if not run or src.page_dir is None or not plain_file(src.data, f"{run}/report.html"):
        return ""
    link = quote(os.path.relpath(src.data / run / "report.html", src.page_dir))
    return Html(f'<a href="{escape(link, quote=True)}">report.html</a>')


TABLE = ("round", "client", "decision", "verdict_before", "verdict_after", "attack", "noise_multiplier", "noise_sigma",
         "seconds", "train_seconds")
HEADERS = {"verdict_before": "before", "verdict_after": "after", "noise_multiplier": "z", "noise_sigma": "sigma",
           "seconds": "guard s", "train_seconds": "training s"}


def guard_body(src: GuardSource) -> str:
    rows = src.rows
    if not rows:
        return notice("guard.csv has no rows yet: no client has checked an update.")
    rounds = sorted({int(r["round"]) for r in rows})
    clients = client_order(r["client"] for r in rows)
    counts = {d: sum(r["decision"] == d for r in rows) for d in DECISIONS}
    stats = "".join(f'<div class="stat"><div class="n">{counts[d]}</div><div class="l">{escape(d)}</div></div>'
                    for d in DECISIONS)
    guard_s = [finite(r.get("seconds")) for r in rows if finite(r.get("seconds")) is not None]
    train_s = [finite(r.get("train_seconds")) for r in rows if finite(r.get("train_seconds")) is not None]
    leaking = [r for r in rows if r["verdict_before"] == "leaked"]
    lines = [f"<b>{len(rows)} client-rounds</b>: {len(clients)} clients over {len(rounds)} round(s).",
             f"{len(leaking)} update(s) leaked as trained; "
             f"{sum(r['decision'] == 'remedied' for r in leaking)} remedied, "
             f"{sum(r['decision'] == 'withheld' for r in leaking)} withheld, "
             f"{sum(r['decision'] == 'passed' for r in leaking)} sent as they were (policy report or on_error send)."]
    if guard_s:
        lines.append(f"Guard time per client-round: mean {sum(guard_s) / len(guard_s):.1f} s (max {max(guard_s):.1f} s)"
                     + (f", beside training's mean {sum(train_s) / len(train_s):.2f} s." if train_s else "."))
    body = [f'<div class="headline">{stats}</div>',
            "<ul>" + "".join(f"<li>{line}</li>" for line in lines) + "</ul>", _grid(rows, rounds, clients),
            _pairs(src)]
    ordered = sorted(rows, key=lambda r: (DECISIONS.index(r["decision"]), int(r["round"])))
    table_rows = []
    for r in ordered:
        cells: list[Any] = []
        for c in TABLE:
            v = r.get(c, "")
            cells.append(_verdict(v) if c.startswith("verdict") else int(v) if c == "round" else
                         finite(v) if c in GUARD_NUMERIC else v)
        cells += [r.get("reason", ""), _report_link(src, r.get("run_before", "")),
                  _report_link(src, r.get("run_after", ""))]
        table_rows.append(cells)
    heads = [HEADERS.get(c, c) for c in TABLE] + ["why", "before", "after"]
    body.append("<h2>Every decision</h2>" + table(heads, table_rows, keys=[*TABLE, "why", "report", "report_after"],
                                                  cls="cells"))
    return "".join(body)


__all__ = ["DECISIONS", "GUARD_RUN", "GuardSource", "guard_body", "load_guard", "read_guard"]
