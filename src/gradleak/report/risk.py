"""The risk-report parts of the dashboards (:mod:`gradleak.report.dashboard`): one verdict per
attacked update, said and drawn the same way on every page (a sweep's cells, an experiment's
cells, a Flower audit's client updates, a comparison of two of them)."""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from gradleak.outcome import (BEAT_MARGIN, COARSE_SSIM_LINE, CONVERGED_BELOW, LEAK_PSNR_DB, MIN_DECOY_POOL,
                              PRESUME_RATIO, PRESUMED_LEAKED, RECOGNISABLE_SSIM, STRONG_MARGIN, TEXT_LEAK_TOKEN_ACCURACY,
                              TEXT_SET_PRECISION, TEXT_SET_RECALL, TRUTH_FIT_SLACK, Evidence, evidence_from_metrics,
                              number)
from gradleak.outcome import judge as outcome_judge
from gradleak.errors import GradleakError
from gradleak.report.html import REPORT_RULES, format_metric
from gradleak.report.page import data_uri, page_css, value_cell

#: Mean PSNR (dB) from which an update's data count as rebuilt: the experiments' THRESHOLD_DB
#: (experiments/common.py and defense_tradeoff.py; a test keeps them equal).
LEAK_THRESHOLD_DB = LEAK_PSNR_DB

LEAKED, DEFENDED, INCONCLUSIVE, FAILED, SKIPPED = "leaked", "defended", "inconclusive", "failed", "skipped"
#: Worst first: a leak, then what says nothing about the client, then the evidence of protection.
VERDICTS = (LEAKED, INCONCLUSIVE, FAILED, SKIPPED, DEFENDED)
_RANK = {v: i for i, v in enumerate(VERDICTS)}

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Verdict:
    """``label``: one of VERDICTS; ``truth``: judged against ground truth (a PSNR), else from
    convergence alone; ``reason``: one line saying why."""

    label: str
    truth: bool
    reason: str


def psnr_of(v: Any) -> float | None:
    """A PSNR that can be judged: any number but NaN (a PSNR of +inf is a perfect rebuild)."""
    return number(v)


def finite(v: Any) -> float | None:
    """A finite float from a number or a numeric string, else None (bools are not numbers)."""
    f = psnr_of(v)
    return f if f is not None and math.isfinite(f) else None


def converged_of(metrics: Mapping[str, Any]) -> bool | None:
    """The run's own verdict (metrics "converged", else "convergence"["converged"]); None when
    it recorded none (experiments/common.py converged_of)."""
    value = metrics.get("converged")
    conv = metrics.get("convergence")
    if value is None and isinstance(conv, Mapping):
        value = conv.get("converged")
    return value if isinstance(value, bool) else None


def judge(status: str, psnr: Any, converged: bool | None, *, attack: Any = None, noise_floor: Any = 0.0,
          unmodelled: Sequence[str] = (), defenses: Sequence[str] = (), metrics: Mapping[str, Any] | None = None,
          control: str | None = None) -> Verdict:
    """The verdict of one attacked update: gradleak.outcome.judge (the one set of rules), in the
    dashboard's terms ("presumed leaked" is ``leaked`` judged without ground truth).

    With ``metrics`` (a run's or a stored cell's metrics.json) the whole evidence is read from
    them (outcome.evidence_from_metrics); otherwise from the arguments (an audit.csv row):
    status:      "ok" (attacked), "skipped" (not attacked), anything else failed.
    psnr:        mean PSNR over the batch in dB, None without ground truth.
    converged:   the attack's own verdict (None: not recorded).
    attack, noise_floor, unmodelled: used only without ground truth: the attack's name (its
                 convergence line, CONVERGED_BELOW), the defenses' noise floor (None: unknown)
                 and the defenses the floor does not model.
    defenses:    the update's defenses; ``control``: the verdict of the same attack without them.
    Without the truth's fit to the update and a positive control (which only ``metrics`` of this
    version carry), nothing is "defended": such an update is inconclusive.
    """
    if metrics is not None:
        ev = evidence_from_metrics(metrics, status=status, control=control)
    else:
        p = psnr_of(psnr)
        ev = Evidence(status=status, has_truth=p is not None, psnr=p, converged=converged,
                      defenses=tuple(str(d) for d in defenses), attack_line=CONVERGED_BELOW.get(str(attack)),
                      noise_floor=finite(noise_floor) if noise_floor is not None else None,
                      unmodelled=tuple(str(u) for u in unmodelled), control=control)
    o = outcome_judge(ev)
    label = LEAKED if o.verdict == PRESUMED_LEAKED else o.verdict
    return Verdict(label, ev.has_truth, o.reason)


def rank(label: str) -> int:
    return _RANK.get(label, len(VERDICTS))


def worst_first(label: str, psnr: Any = None, rel: Any = None) -> tuple[float, float, float]:
    """Sort key, worst first: by verdict (VERDICTS order), then highest PSNR, then the answer
    that explains the update best (lowest relative gradient distance)."""
    p, r = psnr_of(psnr), finite(rel)
    return (rank(label), -p if p is not None else math.inf, r if r is not None else math.inf)


def setting_verdict(labels: Iterable[str]) -> str:
    """A setting's verdict from its updates' (the defenses experiment's rule): leaked if any
    leaked, defended if every one is, failed / skipped if every one is, else inconclusive."""
    labels = list(labels)
    if not labels:
        return INCONCLUSIVE
    if LEAKED in labels:
        return LEAKED
    for v in (DEFENDED, FAILED, SKIPPED):
        if all(x == v for x in labels):
            return v
    return INCONCLUSIVE


# ------------------------------------------------------------------ HTML
class Html(str):
    """Text that is already HTML (escaped where it holds data): a table cell written as is."""


#: The dashboards' stylesheet: the run report's rules plus badges, the headline, galleries.
RISK_RULES = """
.badge { display: inline-block; padding: .08em .6em; border-radius: 999px; font-size: .82em; font-weight: 600;
         color: #fff; white-space: nowrap; letter-spacing: .01em; }
.v-leaked { background: #c62828; } .v-defended { background: #2e7d32; } .v-inconclusive { background: #b26a00; }
.v-failed { background: #555; } .v-skipped { background: #9e9e9e; }
th.sortable { cursor: pointer; } th.sortable[data-sort="asc"]::after { content: " \\25B2"; }
th.sortable[data-sort="desc"]::after { content: " \\25BC"; }
.verdict-filter { margin: .3em 0; }
.badge.presumed { background: #fff; color: #c62828; box-shadow: inset 0 0 0 1.5px #c62828; }
.headline { display: flex; gap: .8em; flex-wrap: wrap; margin: .8em 0 .4em; }
.stat { border: 1px solid #ddd; border-top-width: 5px; border-radius: 6px; padding: .4em 1.1em .5em; min-width: 7.5em; }
.stat .n { font-size: 2em; font-weight: 700; line-height: 1.1; font-variant-numeric: tabular-nums; }
.stat .l { color: #444; font-size: .9em; }
.s-leaked { border-top-color: #c62828; } .s-leaked .n { color: #c62828; }
.s-defended { border-top-color: #2e7d32; } .s-defended .n { color: #2e7d32; }
.s-inconclusive { border-top-color: #b26a00; } .s-inconclusive .n { color: #b26a00; }
.s-failed { border-top-color: #555; } .s-skipped { border-top-color: #9e9e9e; }
.answer { margin: .4em 0 .2em; padding-left: 1.2em; }
.answer li { margin: .15em 0; }
.worst { background: #fdecea; border: 1px solid #f5c2bd; border-radius: 6px; padding: .5em 1em; }
.worst.calm { background: #edf7ee; border-color: #b9dfbc; }
.rules { background: #f6f7f9; border-left: 4px solid #8a8f98; padding: .4em 1em; font-size: .9em; margin: 1em 0; }
.rules ul { margin: .3em 0; padding-left: 1.2em; }
.rules summary { cursor: pointer; font-weight: 600; }
tr.r-leaked > td:first-child { box-shadow: inset 4px 0 #c62828; }
tr.r-defended > td:first-child { box-shadow: inset 4px 0 #2e7d32; }
tr.r-inconclusive > td:first-child { box-shadow: inset 4px 0 #b26a00; }
tr.r-failed > td:first-child, tr.r-skipped > td:first-child { box-shadow: inset 4px 0 #9e9e9e; }
table.matrix td { text-align: center; min-width: 4.5em; }
table.matrix td .v { display: block; font-size: .8em; color: #333; margin-top: .15em;
                      font-variant-numeric: tabular-nums; }
.gallery { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: .5em .6em; background: #fff; max-width: 100%; }
.card .t { font-size: .88em; margin-bottom: .35em; }
.card img { display: block; max-width: 100%; height: auto; image-rendering: pixelated; border: 1px solid #eee; }
.card .pair { display: flex; gap: .6em; flex-wrap: wrap; align-items: flex-start; }
.card .pair > div { font-size: .8em; color: #555; }
.scroll { overflow-x: auto; max-width: 100%; }
.setup { color: #444; font-size: .92em; margin: .2em 0 .8em; }
.setup span { display: inline-block; margin: 0 1.3em .2em 0; }
.setup b { color: #222; font-weight: 600; margin-right: .3em; }
.charts { display: flex; flex-wrap: wrap; gap: 1em 1.5em; align-items: flex-start; }
.charts > div { min-width: 0; max-width: 100%; }
table.cells td:last-child { min-width: 14em; }
td.num { white-space: nowrap; }
h4 { font-size: .92em; margin: .8em 0 .2em; }
details > summary { cursor: pointer; color: #444; }
.delta-up { color: #c62828; font-weight: 600; } .delta-down { color: #2e7d32; font-weight: 600; }
"""
CSS = page_css(REPORT_RULES + RISK_RULES)


def badge(verdict: Verdict | str, *, title: str | None = None) -> Html:
    """A coloured verdict label; a verdict without ground truth is marked (hatched, "*")."""
    v = verdict if isinstance(verdict, Verdict) else Verdict(str(verdict), True, "")
    presumed = not v.truth and v.label == LEAKED
    tip = title if title is not None else v.reason
    tip_attr = f' title="{escape(tip)}"' if tip else ""
    label = escape(v.label) + ("*" if presumed else "")
    cls = f"badge v-{v.label}" + (" presumed" if presumed else "") if v.label in _RANK else "badge v-failed"
    return Html(f'<span class="{cls}"{tip_attr}>{label}</span>')


def cell_html(key: str, value: Any) -> str:
    """One table cell: Html as is, anything else formatted with the report's units and escaped."""
    if isinstance(value, Html):
        return f"<td>{value}</td>"
    return value_cell(value, format_metric(key, value))


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], *, keys: Sequence[str] | None = None,
          row_verdicts: Sequence[str] | None = None, cls: str | None = None) -> str:
    """A table: escaped headers, each value formatted by its column's key (units), Html cells as
    is; ``row_verdicts`` marks each row's left edge with its verdict's colour."""
    keys = list(keys or columns)
    head = "".join(f"<th>{escape(str(c))}</th>" for c in columns)
    body = []
    for i, row in enumerate(rows):
        rv = row_verdicts[i] if row_verdicts is not None and i < len(row_verdicts) else None
        tr = f' class="r-{escape(rv)}"' if rv in _RANK else ""
        body.append(f"<tr{tr}>" + "".join(cell_html(str(k), v) for k, v in zip(keys, row, strict=False)) + "</tr>")
    c = f' class="{cls}"' if cls else ""
    return f'<div class="scroll"><table{c}><tr>{head}</tr>{"".join(body)}</table></div>'


def headline(counts: Mapping[str, int], noun: str, *, order: Sequence[str] = (LEAKED, DEFENDED, INCONCLUSIVE,
                                                                               FAILED, SKIPPED)) -> str:
    """The big numbers: how many ``noun`` (e.g. "cells") got each verdict (zeros shown for the
    first three, failed / skipped only when present)."""
    stats = []
    for v in order:
        n = int(counts.get(v, 0))
        if n == 0 and v in (FAILED, SKIPPED):
            continue
        stats.append(f'<div class="stat s-{v}"><div class="n">{n}</div><div class="l">{escape(noun)} {v}</div></div>')
    return f'<div class="headline">{"".join(stats)}</div>'


def count(labels: Iterable[str]) -> Counter[str]:
    return Counter(labels)


def rules(*, truth: bool, no_truth: bool, unit: str = "update") -> str:
    """The verdict rules and thresholds, as the page states them (collapsible, open)."""
    lines = ", ".join(f"{k} {v:g}" for k, v in CONVERGED_BELOW.items())
    items = [
        f"<li>{badge(LEAKED, title='')} rebuilt: mean PSNR over the batch &ge; <b>{LEAK_THRESHOLD_DB:g} dB</b> "
        "(MSE &le; 0.01 on [0, 1] pixels), or <b>recognisable</b> whatever the pixel noise: an image whose SSIM "
        f"against the client's is &ge; {RECOGNISABLE_SSIM:g}, or that the identification search picks out among "
        f"&ge; {MIN_DECOY_POOL} candidates (public decoys included) with a coarse SSIM (4x4 blocks) {BEAT_MARGIN:g} "
        f"above the zero and prior images' (the public photos' and the source's mean), or whose coarse SSIM is "
        f"&ge; {COARSE_SSIM_LINE:g} and {STRONG_MARGIN:g} above them; text: a sentence recovered "
        f"exactly, &ge; {TEXT_LEAK_TOKEN_ACCURACY:.0%} of the tokens in place, or the set of words (token-set "
        f"precision &ge; {TEXT_SET_PRECISION:g}, recall &ge; {TEXT_SET_RECALL:g}). Whatever the attack's own "
        "verdict.</li>",
        f"<li>{badge(DEFENDED, title='')} positive evidence that a <b>defense</b> stopped a capable attack, all of: "
        "the update carries a defense; it cannot tell the client's true batch from decoy batches of public photos "
        "with the same labels (the decoy test), or, where none was recorded, the attack's answer explains the "
        "defended update as well as the client's true data do (relative gradient distance at most the truth's + "
        f"{TRUTH_FIT_SLACK:.0%} + the noise floor's tolerance); nothing is identified or recognisable; the same answer would not be presumed a leak without the truth; under a defense "
        "the attacker's simulation does not reproduce (DP-SGD's clipping, pruning) the truth sits on the modelled "
        "noise floor; and the <b>positive control</b>, the same attack without the defense, leaked. The only "
        "evidence of protection.</li>",
        f"<li>{badge(INCONCLUSIVE, title='')} everything else: an attack that did not converge (relative "
        f"gradient distance above its line, raised by the defenses' noise floor; lines: {escape(lines)}) or that "
        "the true "
        "data fit better than (an optimisation failure), an update with no defense (a failed attack protects "
        "nobody), a control that did not leak either, or evidence a cell did not record (computed by an older "
        f"version). Inconclusive {escape(unit)}s are left out of the leakage charts and means.</li>",
        f"<li>{badge(FAILED, title='')} the attack raised an error (listed).</li>",
    ]
    if no_truth:
        items.append(
            "<li><b>Without ground truth</b> (no PSNR; a presumed leak is drawn "
            f"{badge(Verdict(LEAKED, False, ''), title='')}): the verdict comes from convergence alone. A converged "
            "attack is a <b>presumed leak</b> when the update's defenses leave no noise floor above the attack's own "
            "line (and none the floor does not model, such as pruning): its answer explains the update as well as "
            "on an undefended update, and on this project's "
            "measurements such answers rebuilt the data (DLG/iDLG: every answer below 1e-5 reached &ge; 20 dB; the "
            "GradInversion/IG line 0.4 is coarse), and it fits at least "
            f"{1 / PRESUME_RATIO:g} times better than the attacks' random starts and public decoy batches. Otherwise, converged or not, it is inconclusive: without the "
            "data a leak cannot be told from a defense.</li>")
    setting = (f"<li>A <b>setting</b> (the {escape(unit)}s that differ only by seed) is leaked if any of its "
               f"{escape(unit)}s leaked, defended if all were defended, else inconclusive.</li>")
    if unit == "cell":
        items.append(setting)
    what = "with ground truth" if truth and not no_truth else ("without ground truth" if no_truth and not truth
                                                               else "partly with ground truth")
    return (f'<details class="rules" open><summary>How to read the verdicts ({what})</summary>'
            f"<ul>{''.join(items)}</ul></details>")


# ------------------------------------------------------------------ embedded images
class ImageBudget:
    """Saved reconstructions embedded as data: URIs, in the order asked (worst first), bounded:
    at most ``max_images``, each at most ``max_bytes`` and ``max_total`` bytes in all. Files that
    are missing, outside their folder, not regular files or not PNGs are never embedded (they
    are counted, and :meth:`note` says so); nothing here raises for a bad image."""

    def __init__(self, max_images: int = 48, max_bytes: int = 4 * 1024 * 1024, max_total: int = 48 * 1024 * 1024):
        self.max_images, self.max_bytes, self.max_total = max_images, max_bytes, max_total
        self.embedded = 0
        self.total = 0
        self.over_budget = 0
        self.unusable = 0

    def read(self, root: Path, rel: str | os.PathLike[str] | None) -> bytes | None:
        """The PNG at ``root/rel`` if it may be embedded; None otherwise (counted)."""
        path = inside(root, rel)
        if path is None:
            if rel not in (None, ""):
                self.unusable += 1
            return None
        if self.embedded >= self.max_images:
            self.over_budget += 1
            return None
        try:
            from gradleak.paths import check_input_file

            p = check_input_file(path, "reconstruction image", max_bytes=self.max_bytes)
            if self.total + p.stat().st_size > self.max_total:
                self.over_budget += 1
                return None
            data = p.read_bytes()
        except (GradleakError, OSError):
            self.unusable += 1
            return None
        if not data.startswith(_PNG_MAGIC):
            self.unusable += 1
            return None
        self.embedded += 1
        self.total += len(data)
        return data

    def note(self, where: str) -> str:
        """What was left out, as a muted paragraph ('' when nothing was)."""
        parts = []
        if self.over_budget:
            parts.append(f"{self.over_budget} saved reconstruction(s) not embedded: the page embeds the "
                         f"{self.max_images} worst (at most {self.max_total // 2**20} MiB); see {where}")
        if self.unusable:
            parts.append(f"{self.unusable} reconstruction file(s) skipped: missing, outside the folder, too large "
                         f"(> {self.max_bytes // 2**20} MiB) or not a PNG")
        return "".join(f'<p class="muted">{escape(p)}.</p>' for p in parts)


def inside(root: Path, rel: str | os.PathLike[str] | None) -> Path | None:
    """``root/rel`` when ``rel`` is a relative path that stays inside ``root`` (links resolved)
    and names an existing entry; None otherwise (absolute, ``..``, NUL, escaping links, absent)."""
    if rel is None or rel == "":
        return None
    text = os.fspath(rel)
    if "\x00" in text or os.path.isabs(text) or ".." in Path(text).parts:
        return None
    path = root / text
    try:
        real_root = os.path.realpath(root)
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return None
    if not real.startswith(real_root.rstrip(os.sep) + os.sep) or not os.path.exists(real):
        return None
    return path


def image(png: bytes, alt: str) -> Html:
    return Html(f'<img src="{data_uri(png)}" alt="{escape(alt)}">')


def card(title_html: str, png: bytes | None, alt: str, caption: str = "") -> Html:
    """A gallery card: a title line (HTML), the image (or a muted "no image"), a caption."""
    img = image(png, alt) if png is not None else Html('<p class="muted">no image saved</p>')
    cap = f'<div class="muted" style="font-size:.8em;margin-top:.3em">{escape(caption)}</div>' if caption else ""
    return Html(f'<div class="card"><div class="t">{title_html}</div>{img}{cap}</div>')


def notice(text: str) -> str:
    return f'<p class="notice">{escape(text)}</p>'


def chart(png: bytes, alt: str, caption: str, *, axis: str, metric: str) -> str:
    """A chart figure, tagged with what it plots along what (``data-axis``, ``data-metric``)."""
    return (f'<figure class="chart" data-axis="{escape(axis)}" data-metric="{escape(metric)}">'
            f'<img src="{data_uri(png)}" alt="{escape(alt)}"><figcaption>{escape(caption)}</figcaption></figure>')
