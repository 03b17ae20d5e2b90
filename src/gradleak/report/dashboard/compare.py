"""`gradleak dashboard A --compare B`: one page comparing two sweeps, two experiments or two Flower
audits, e.g. before (A) and after (B) a defense."""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from html import escape
from typing import Any

from gradleak.errors import DataError
from gradleak.report.dashboard.data import (RUN_ONLY_FIELDS, Item, Source, derived_fields, field_text, num,
                                            setting_label, varying_fields)
from gradleak.report.dashboard.pages import MAX_TABLE_ROWS, answer_list
from gradleak.report.figures import scatter_png
from gradleak.report.run_page import display_name
from gradleak.report.risk import (DEFENDED, FAILED, INCONCLUSIVE, LEAK_THRESHOLD_DB, LEAKED, VERDICTS, Html,
                                  ImageBudget, badge, chart, count, headline, image, notice, table, worst_first)

MAX_UNMATCHED_ROWS = 50
MAX_PAIR_PICTURES = 24


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


_KINDS = {"sweep": "sweep", "experiment": "experiment", "audit": "Flower audit", "runs": "folder of runs"}


def _label(src: Source) -> str:
    kind = _KINDS.get(src.kind, src.kind) + (f" {src.experiment}" if src.experiment else "")
    return f"{display_name(src.folder)} ({kind})"


def changed_fields(a: Source, b: Source) -> list[str]:
    """Config fields whose values in A and in B have none in common (RUN_ONLY_FIELDS aside)."""
    fields: list[str] = []
    for r in [*a.records, *b.records]:
        for k in r.config:
            if isinstance(k, str) and k not in fields and k not in RUN_ONLY_FIELDS:
                fields.append(k)
    out = []
    for f in fields:
        va = {_canon(r.config.get(f)) for r in a.records}
        vb = {_canon(r.config.get(f)) for r in b.records}
        if va and vb and not va & vb:
            out.append(f)
    return out


def pairs_of(a: Source, b: Source) -> tuple[list[tuple[Item, Item]], list[Item], list[Item], list[str]]:
    """Matched pairs (A item, B item), A's and B's unmatched items, and the changed fields
    (cells; empty for audits). See the docs notes."""
    if a.kind == "audit":
        key_a = {it.key: it for it in a.items}
        key_b = {it.key: it for it in b.items}
        pairs = [(key_a[k], key_b[k]) for k in key_a if k in key_b]
        return (pairs, [it for k, it in key_a.items() if k not in key_b],
                [it for k, it in key_b.items() if k not in key_a], [])
    changed = changed_fields(a, b)
    fields = sorted({k for r in [*a.records, *b.records] for k in r.config if isinstance(k, str)}
                    - RUN_ONLY_FIELDS - set(changed))

    def key(it: Item) -> tuple[str, ...]:
        return tuple(_canon(it.fields.get(f)) for f in fields)
    by_b: dict[tuple[str, ...], list[Item]] = defaultdict(list)
    for it in b.items:
        by_b[key(it)].append(it)
    keys_a = {key(it) for it in a.items}
    pairs = [(ia, ib) for ia in a.items for ib in by_b.get(key(ia), [])]
    return (pairs, [it for it in a.items if key(it) not in by_b], [it for it in b.items if key(it) not in keys_a],
            changed)


def _side_values(src: Source, f: str) -> str:
    vals: list[str] = []
    for r in src.records:
        t = field_text(f, r.config.get(f), 40)
        if t not in vals:
            vals.append(t)
    return ", ".join(vals[:6]) + (f" (+{len(vals) - 6})" if len(vals) > 6 else "")


def _delta(a: Item, b: Item) -> Any:
    if a.psnr is None or b.psnr is None:
        return None
    d = b.psnr - a.psnr
    if d != d or abs(d) == float("inf"):
        return None
    cls = "delta-up" if d > 0 else "delta-down" if d < 0 else ""
    return Html(f'<span class="{cls}">{d:+.1f} dB</span>')


def _transitions(pairs: Sequence[tuple[Item, Item]]) -> str:
    c = Counter((a.label, b.label) for a, b in pairs)
    present = [v for v in VERDICTS if any(v in k for k in c)]
    head = "<tr><th>A \\ B</th>" + "".join(f"<th>{badge(v, title='')}</th>" for v in present) + "</tr>"
    body = []
    for va in present:
        tds = "".join(f'<td class="num">{c.get((va, vb), 0) or ""}</td>' for vb in present)
        body.append(f"<tr><th>{badge(va, title='')}</th>{tds}</tr>")
    return ("<h2>Verdict changes</h2><p class=\"sub\">Matched pairs by verdict in A (rows) and in B (columns); the "
            f'diagonal is unchanged.</p><table class="matrix">{head}{"".join(body)}</table>')


def _answer_lines(pairs: Sequence[tuple[Item, Item]]) -> list[str]:
    c = Counter((a.label, b.label) for a, b in pairs)
    n = len(pairs)
    lines = [f"<b>{n} matched pairs</b>."]
    def k(va: str | None, vb: str | None) -> int:
        return sum(m for (x, y), m in c.items() if (va is None or x == va) and (vb is None or y == vb))
    stopped = k(LEAKED, DEFENDED)
    if stopped:
        lines.append(f"{badge(LEAKED, title='')} &rarr; {badge(DEFENDED, title='')} {stopped}: leaked in A, "
                     "defended in B (a defense stopped an attack that leaks without it: outcome.py).")
    still = k(LEAKED, LEAKED)
    if still:
        lines.append(f"{badge(LEAKED, title='')} &rarr; {badge(LEAKED, title='')} {still}: still leaked in B.")
    failed = k(LEAKED, INCONCLUSIVE) + k(LEAKED, FAILED)
    if failed:
        lines.append(f"{badge(LEAKED, title='')} &rarr; {badge(INCONCLUSIVE, title='')}/{badge(FAILED, title='')} "
                     f"{failed}: no leak seen in B, but no evidence of protection either (the attack did not "
                     "rebuild the data in B; that is not evidence that B protects).")
    new = sum(m for (x, y), m in c.items() if y == LEAKED and x != LEAKED)
    if new:
        lines.append(f"&rarr; {badge(LEAKED, title='')} {new}: leaked in B but not in A.")
    deltas = [d for a, b in pairs if a.psnr is not None and b.psnr is not None
              and (d := num(b.psnr - a.psnr)) is not None]
    if deltas:
        lines.append(f"PSNR change B &minus; A over the {len(deltas)} pairs scored in both: mean "
                     f"{statistics.fmean(deltas):+.1f} dB, median {statistics.median(deltas):+.1f} dB.")
    return lines


def _scatter(pairs: Sequence[tuple[Item, Item]], series_fields: Sequence[str]) -> str:
    pts: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for a, b in pairs:
        if a.psnr is not None and b.psnr is not None and abs(a.psnr) <= 1e100 and abs(b.psnr) <= 1e100:
            name = setting_label(b.fields, series_fields) if series_fields else "matched pairs"
            pts[name].append((a.psnr, b.psnr))
    if not pts:
        return ""
    if len(pts) > 10:
        pts = {"matched pairs": [p for v in pts.values() for p in v]}
    png = scatter_png(pts, "PSNR in A (dB)", "PSNR in B (dB)", "each matched pair: below the diagonal = less leakage "
                      "in B", diagonal=True, threshold=LEAK_THRESHOLD_DB)
    return "<h2>PSNR before and after</h2>" + chart(png, "PSNR A vs B", "one point per matched pair; dashed: the "
                                                    f"leak threshold {LEAK_THRESHOLD_DB:g} dB", axis="pair",
                                                    metric="psnr_mean")


def _name(src: Source, it: Item) -> str:
    return f"round {it.key[0]}, client {it.key[1]}" if src.kind == "audit" else f"cell {it.key}"


def compare_body(a: Source, b: Source) -> str:
    if (a.kind == "audit") != (b.kind == "audit"):
        raise DataError(f"cannot compare {_label(a)} with {_label(b)}: compare two sweeps or experiments, or two "
                        "Flower audits")
    pairs, only_a, only_b, changed = pairs_of(a, b)
    cells = a.kind != "audit"
    # the fields that tell pairs apart (besides the changed ones), and the changed ones that vary within a run
    both = [*a.records, *b.records]
    shown: list[str] = []
    if cells:
        shown = [f for f in varying_fields(both) if f not in changed]
        shown = [f for f in shown if f not in derived_fields(both, shown)] + varying_fields(both, replicates=True)
    shown_changed = [f for f in changed if len({field_text(f, r.config.get(f)) for r in a.records}) > 1
                     or len({field_text(f, r.config.get(f)) for r in b.records}) > 1]
    body = []
    for tag, src in (("A", a), ("B", b)):
        c = count(it.label for it in src.items)
        worst = min(src.items, key=lambda it: worst_first(it.label, it.psnr, it.rel)) if src.items else None
        worst_txt = ""
        if worst is not None and worst.label == LEAKED:
            worst_txt = (f'<p class="sub">worst: {badge(worst.verdict)} {escape(_name(src, worst))}'
                         + (f" &middot; PSNR {worst.psnr:.1f} dB" if worst.psnr is not None else "") + "</p>")
        body.append(f"<h2>{tag}: {escape(_label(src))}</h2>" + headline(c, src.noun) + worst_txt)
    if cells:
        if changed:
            diff = "".join(f"<li><b>{escape(f)}</b>: A {escape(_side_values(a, f))} &rarr; B "
                           f"{escape(_side_values(b, f))}</li>" for f in changed)
            rule = ("Cells are matched when their configs are equal in every field except how they ran (threads, "
                    "device, ...) and the fields that changed wholesale between the runs (no value in common):"
                    f"<ul>{diff}</ul>Any other field must be equal; a cell whose setting only one run has stays "
                    "unmatched.")
        else:
            rule = ("The two runs share a value in every field, so cells are matched on their whole config (except "
                    "how they ran: threads, device, ...): the same settings, compared between the two runs.")
    else:
        rule = "Client updates are matched by round and client: the same client in the same round."
    rule += (f" <b>{len(pairs)}</b> pairs; {len(only_a)} {a.noun} only in A, {len(only_b)} only in B. "
             "&Delta; = B &minus; A.")
    body.append(f'<details class="rules" open><summary>Matching rule</summary><p>{rule}</p></details>')
    if not pairs:
        body.append(notice("No pair matched: the two runs attacked different settings."))
    else:
        body.append(answer_list(_answer_lines(pairs)))
        body.append(_transitions(pairs))
        body.append(_scatter(pairs, shown_changed))
        body.append(_pairs_table(a, b, pairs, shown, shown_changed))
        body.append(_pictures(a, b, pairs, shown))
    body.append(_unmatched(a, b, only_a, only_b, shown))
    return "".join(body)


def _setting(src: Source, it: Item, shown: Sequence[str]) -> str:
    return _name(src, it) if src.kind == "audit" else (setting_label(it.fields, shown) or "the one setting")


def _pairs_table(a: Source, b: Source, pairs: Sequence[tuple[Item, Item]], shown: Sequence[str],
                 shown_changed: Sequence[str]) -> str:
    ordered = sorted(pairs, key=lambda p: (worst_first(p[1].label, p[1].psnr, p[1].rel),
                                           worst_first(p[0].label, p[0].psnr, p[0].rel)))
    if a.kind == "audit":
        setting_cols = ["round", "client"]
        setting = [[p[0].key[0], p[0].key[1]] for p in ordered]
    else:
        setting_cols = [*shown, *[f"{f} (A)" for f in shown_changed], *[f"{f} (B)" for f in shown_changed]]
        setting = [[field_text(f, p[0].fields.get(f)) for f in shown]
                   + [field_text(f, p[0].fields.get(f)) for f in shown_changed]
                   + [field_text(f, p[1].fields.get(f)) for f in shown_changed] for p in ordered]
    cols = ["B verdict", "A verdict", *setting_cols, "PSNR A", "PSNR B", "ΔPSNR", "rel. distance A", "rel. distance B"]
    keys = ["verdict", "verdict", *setting_cols, "psnr", "psnr", "delta", "rel", "rel"]
    rows = [[badge(pb.verdict), badge(pa.verdict), *s, pa.psnr, pb.psnr, _delta(pa, pb), pa.rel, pb.rel]
            for (pa, pb), s in zip(ordered[:MAX_TABLE_ROWS], setting, strict=False)]
    more = (f'<p class="muted">{len(ordered) - MAX_TABLE_ROWS} more pairs not listed</p>'
            if len(ordered) > MAX_TABLE_ROWS else "")
    return ("<h2>Matched pairs (worst in B first)</h2>"
            + table(cols, rows, keys=keys, row_verdicts=[p[1].label for p in ordered]) + more)


def _pictures(a: Source, b: Source, pairs: Sequence[tuple[Item, Item]], shown: Sequence[str]) -> str:
    with_pics = [p for p in pairs if p[0].image or p[1].image]
    if not with_pics:
        return ""
    ordered = sorted(with_pics, key=lambda p: (worst_first(p[1].label, p[1].psnr, p[1].rel),
                                               worst_first(p[0].label, p[0].psnr, p[0].rel)))
    budget = ImageBudget(max_images=2 * MAX_PAIR_PICTURES)
    cards = []
    for pa, pb in ordered:
        ia = budget.read(a.image_root, pa.image) if pa.image else None
        ib = budget.read(b.image_root, pb.image) if pb.image else None
        if ia is None and ib is None:
            continue
        side = []
        for tag, it, png in (("A", pa, ia), ("B", pb, ib)):
            psnr = f" {it.psnr:.1f} dB" if it.psnr is not None else ""
            pic = image(png, f"{tag}: {_setting(a if tag == 'A' else b, it, shown)}") if png is not None else \
                Html('<p class="muted">no picture</p>')
            side.append(f"<div>{tag} {badge(it.verdict)}{escape(psnr)}{pic}</div>")
        cards.append(f'<div class="card"><div class="t">{escape(_setting(a, pa, shown))}</div>'
                     f'<div class="pair">{"".join(side)}</div></div>')
    return ("<h2>Pictures before and after (worst in B first)</h2>"
            '<p class="sub">Each pair: A on the left, B on the right; originals above reconstructions.</p>'
            f'<div class="gallery">{"".join(cards)}</div>' + budget.note("the two folders"))


def _unmatched(a: Source, b: Source, only_a: Sequence[Item], only_b: Sequence[Item], shown: Sequence[str]) -> str:
    if not only_a and not only_b:
        return ""
    out = ["<h2>Unmatched</h2>"]
    for tag, src, items in (("A", a, only_a), ("B", b, only_b)):
        if not items:
            continue
        ordered = sorted(items, key=lambda it: worst_first(it.label, it.psnr, it.rel))
        rows = [[badge(it.verdict), _name(src, it), _setting(src, it, shown), it.psnr]
                for it in ordered[:MAX_UNMATCHED_ROWS]]
        out.append(f"<h3>Only in {tag} ({len(items)})</h3>"
                   + table(["verdict", "which", "setting", "PSNR"], rows, keys=["verdict", "which", "setting", "psnr"],
                           row_verdicts=[it.label for it in ordered]))
        if len(items) > MAX_UNMATCHED_ROWS:
            out.append(f'<p class="muted">{len(items) - MAX_UNMATCHED_ROWS} more not listed</p>')
    return "".join(out)


__all__ = ["changed_fields", "compare_body", "pairs_of"]
