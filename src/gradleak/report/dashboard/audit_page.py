"""The body of the dashboard page of a Flower audit (client updates per round): who leaks, in which
round, worst first. Every string read from the folder is escaped here (or by the table helpers)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from html import escape
from typing import Any

from gradleak.report.dashboard.data import Item, Source, client_order, num, plain_file
from gradleak.report.dashboard.pages import (MAX_SERIES, MAX_TABLE_ROWS, THRESHOLD_LINE, answer_list, judged,
                                             listed_names, worst_box)
from gradleak.report.figures import errorbar_png
from gradleak.report.run_page import display_name
from gradleak.report.risk import (LEAKED, SKIPPED, Html, ImageBudget, badge, card, chart, count, finite, headline, notice, rules,
                                  table, worst_first)

MAX_MATRIX_ROUNDS = 60
MAX_MATRIX_CLIENTS = 200


def _audit_value(it: Item) -> str:
    if it.psnr is not None:
        return f"{it.psnr:.1f} dB"
    if it.status == "ok" and it.rel is not None:
        return f"rel {it.rel:.1e}"
    return ""


def _matrix(items: Sequence[Item], rounds: Sequence[int], clients: Sequence[str]) -> str:
    cell: dict[tuple[int, str], Item] = {}
    for it in items:   # several rows for one client and round: the worst is shown
        k = it.key
        if k not in cell or worst_first(it.label, it.psnr, it.rel) < worst_first(cell[k].label, cell[k].psnr,
                                                                                   cell[k].rel):
            cell[k] = it
    shown_r, shown_c = list(rounds[:MAX_MATRIX_ROUNDS]), list(clients[:MAX_MATRIX_CLIENTS])
    head = "<tr><th>client \\ round</th>" + "".join(f"<th>{r}</th>" for r in shown_r) + "</tr>"
    body = []
    for c in shown_c:
        tds = []
        for r in shown_r:
            it = cell.get((r, c))
            if it is None:
                tds.append('<td class="muted">&ndash;</td>')
            else:
                tds.append(f'<td>{badge(it.verdict)}<span class="v">{escape(_audit_value(it))}</span></td>')
        body.append(f"<tr><th>{escape(c)}</th>{''.join(tds)}</tr>")
    more = []
    if len(rounds) > len(shown_r):
        more.append(f"{len(rounds) - len(shown_r)} later rounds")
    if len(clients) > len(shown_c):
        more.append(f"{len(clients) - len(shown_c)} more clients")
    note = f'<p class="muted">Not in the grid: {escape(", ".join(more))} (see the table below).</p>' if more else ""
    return (f'<h2>Verdict per client and round</h2><div class="scroll"><table class="matrix">{head}{"".join(body)}'
            f"</table></div>{note}")


def _audit_chart(items: Sequence[Item], rounds: Sequence[int], clients: Sequence[str]) -> str:
    if len(rounds) < 2:
        return ""
    pts = [it for it in judged(items) if num(it.psnr) is not None]
    if not pts:
        return ""
    per_client = len(clients) <= MAX_SERIES
    groups: dict[str, dict[Any, list[float]]] = defaultdict(lambda: defaultdict(list))
    for it in pts:
        groups[f"client {it.key[1]}" if per_client else "all clients (mean ± std)"][it.key[0]].append(float(it.psnr))
    png = errorbar_png(groups, "round", "PSNR (dB)", "leakage per round and client", hline=THRESHOLD_LINE)
    return ("<h2>Leakage per round</h2>"
            + chart(png, "PSNR per round and client", "reconstruction PSNR of each client's update per round (leaked "
                    "and defended updates; inconclusive ones left out)", axis="round", metric="psnr_mean"))


def _audit_gallery(src: Source, rounds: Sequence[int], clients: Sequence[str]) -> str:
    head = "<h2>Reconstructions per round</h2>"
    with_image = [it for it in src.items if it.image]
    runs = "run" in src.audit_columns   # each attacked update's run folder (else an audit before them)
    if not with_image:
        return head + notice("No audited update has a run folder with a reconstruction (none was attacked to the "
                             "end: see the table below)." if runs else
                             "This audit saved no reconstructions (it was written before audits kept a run folder "
                             "per update, without --save-reconstructions): audit again to see them here.")
    budget = ImageBudget()
    pngs: dict[int, bytes] = {}
    for it in sorted(with_image, key=lambda it: worst_first(it.label, it.psnr, it.rel)):
        png = budget.read(src.image_root, it.image)
        if png is not None:
            pngs[id(it)] = png
    order = {c: i for i, c in enumerate(clients)}
    parts = [head, '<p class="sub">Each picture (the update\'s run folder, runs/ROUND-CLIENT/reconstruction.png): the '
                   "client's batch (top row) above the reconstruction paired with it (bottom row), with each image's "
                   "PSNR and labels; without ground truth, the reconstruction alone.</p>" if runs else
             '<p class="sub">Each picture: every image of the client\'s batch (left) beside the reconstruction '
             "paired with it (right), with its PSNR and labels (batches of more than 4: the batch above the "
             "reconstructions); without ground truth, the reconstruction alone.</p>"]
    for r in rounds:
        members = sorted((it for it in with_image if it.key[0] == r and id(it) in pngs),
                         key=lambda it: order.get(it.key[1], len(order)))
        if not members:
            continue
        cards = [card(f"<b>client {escape(it.key[1])}</b> {badge(it.verdict)} {escape(_audit_value(it))}",
                      pngs[id(it)], f"round {r} client {it.key[1]}") for it in members]
        parts.append(f'<h3>Round {r}</h3><div class="gallery">{"".join(cards)}</div>')
    parts.append(budget.note(f"{display_name(src.folder)}/runs/" if runs else f"{display_name(src.folder)}/reconstructions/"))
    return "".join(parts)


AUDIT_TABLE = ("round", "client", "attack", "server", "status", "num_examples", "psnr_mean", "ssim_mean",
               "label_accuracy", "separated", "relative_gradient_distance", "defenses", "iterations", "attack_seconds")
AUDIT_HEADERS = {"num_examples": "examples", "psnr_mean": "PSNR", "ssim_mean": "SSIM", "label_accuracy": "label acc.",
                 "relative_gradient_distance": "rel. distance", "attack_seconds": "attack time"}
_AUDIT_NUMBERS = {"num_examples", "psnr_mean", "ssim_mean", "label_accuracy", "relative_gradient_distance",
                  "iterations", "attack_seconds"}


def _audit_cell(col: str, it: Item) -> Any:
    if col == "round":
        return it.key[0]
    v = it.fields.get(col, "")
    if col in _AUDIT_NUMBERS:
        f = finite(v)
        if f is not None and col in ("num_examples", "iterations") and f.is_integer() and abs(f) < 2**53:
            return int(f)
        return f if f is not None else (v or None)
    return v


def _run_reports(src: Source, items: Sequence[Item]) -> list[str | None]:
    """Each audited update's report.html (DIR/runs/NAME/report.html, a plain file), as a link
    relative to the page; None for an update without a run folder."""
    import os
    from urllib.parse import quote

    links: list[str | None] = []
    for it in items:
        path = src.data / it.run / "report.html" if it.run else None
        ok = path is not None and plain_file(src.data, f"{it.run}/report.html") and src.page_dir is not None
        links.append(quote(os.path.relpath(path, src.page_dir)) if ok else None)
    return links


def audit_body(src: Source) -> str:
    items = src.items
    if not items:
        return notice("audit.csv has no rows yet: no client update has been audited.")
    rounds = sorted({it.key[0] for it in items})
    clients = client_order(it.key[1] for it in items)
    counts = count(it.label for it in items)
    worst = min(items, key=lambda it: worst_first(it.label, it.psnr, it.rel))
    leaky = client_order(it.key[1] for it in items if it.label == LEAKED)
    attacked = [it for it in items if it.status == "ok"]
    with_truth = sum(1 for it in attacked if it.verdict.truth)
    lines = [f"<b>{len(items)} client updates</b>: {len(clients)} clients over {len(rounds)} round(s) "
             f"({rounds[0]}&ndash;{rounds[-1]})."]
    if leaky:
        lines.append(f"Clients that leaked in at least one round: <b>{listed_names(leaky, 12)}</b> "
                     f"({len(leaky)} of {len(clients)}).")
    else:
        lines.append("No client leaked in any round.")
    per_round = []
    for r in rounds[:12]:
        rs = [it for it in items if it.key[0] == r]
        per_round.append(f"round {r}: {sum(it.label == LEAKED for it in rs)}/{len(rs)}")
    lines.append("Leaked per round: " + ", ".join(per_round) + (" &hellip;" if len(rounds) > 12 else "") + ".")
    if attacked and with_truth == len(attacked):
        lines.append("Every attacked update was scored against the client's data (ground truth).")
    elif attacked and with_truth == 0:
        lines.append("<b>No ground truth</b> (a real federation): the verdicts come from the attack's convergence "
                     "alone (rule below); a leak is then presumed (outlined badge, marked *).")
    elif attacked:
        lines.append(f"{with_truth} of {len(attacked)} attacked updates were scored against ground truth; the others "
                     "are judged from convergence alone (a presumed leak: outlined badge, marked *).")
    if counts.get(SKIPPED):
        lines.append(f"{counts[SKIPPED]} update(s) were not attacked (more examples than max_batch_size).")
    what = f"client {escape(worst.key[1])} in round {worst.key[0]}"
    body = [headline(counts, "updates"), worst_box(worst, what, counts, "updates"), answer_list(lines),
            rules(truth=with_truth > 0, no_truth=with_truth < len(attacked), unit="update"),
            _matrix(items, rounds, clients), _audit_chart(items, rounds, clients), _audit_gallery(src, rounds, clients)]
    ordered = sorted(items, key=lambda it: worst_first(it.label, it.psnr, it.rel))
    # columns that say something: not empty everywhere, status only when not all "ok"
    columns = [c for c in AUDIT_TABLE if c in ("round", "client") or any(it.fields.get(c) for it in items)]
    if all(it.status == "ok" for it in items) and "status" in columns:
        columns.remove("status")
    rows = [[badge(it.verdict), *[_audit_cell(c, it) for c in columns],
             it.verdict.reason if it.status == "ok" else (it.error or it.verdict.reason)]
            for it in ordered[:MAX_TABLE_ROWS]]
    heads, keys = ["verdict", *[AUDIT_HEADERS.get(c, c) for c in columns], "why"], ["verdict", *columns, "why"]
    links = _run_reports(src, ordered[:MAX_TABLE_ROWS])
    if any(links):   # each attacked update's run folder: link its report
        heads.append("report")
        keys.append("report")
        for row, link in zip(rows, links, strict=True):
            row.append(Html(f'<a href="{escape(link, quote=True)}">report.html</a>') if link else "")
    body.append("<h2>All audited updates (worst first)</h2>"
                + table(heads, rows, keys=keys, row_verdicts=[it.label for it in ordered], cls="cells"))
    if len(ordered) > MAX_TABLE_ROWS:
        body.append(f'<p class="muted">{len(ordered) - MAX_TABLE_ROWS} more rows in audit.csv</p>')
    return "".join(body)
