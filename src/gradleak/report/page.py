"""What gradleak's self-contained HTML pages share: the image run report
(:mod:`gradleak.report.html`), the text run report (:mod:`gradleak.text.report`) and the sweep
dashboard (:mod:`gradleak.report.dashboard`)."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Mapping
from html import escape
from pathlib import Path
from typing import Any

from gradleak.errors import DataError
from gradleak.paths import atomic_write_bytes
from gradleak.outcome import LEAKED, tried_summary

#: No script, font, stylesheet, frame or image from anywhere; images only as data: URIs.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

# The rules every page has: its frame, headings and tables ...
_CSS_HEAD = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto;
       max-width: 1200px; padding: 0 1em; color: #1d1d1f; background: #fff; line-height: 1.4; }
h1 { font-size: 1.6em; margin-bottom: .2em; }
h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ddd; padding-bottom: .2em; }
h3 { font-size: 1em; margin: 1em 0 .3em; }
.sub { color: #666; margin-top: 0; }
table { border-collapse: collapse; margin: .4em 0; font-size: .92em; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f5f5f7; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
"""
# ... and, after the page's own rules, its captions, preformatted text and muted notes.
_CSS_TAIL = """figcaption { color: #555; font-size: .9em; }
pre { background: #f5f5f7; padding: 1em; overflow-x: auto; font-size: .85em; border-radius: 4px; }
.muted { color: #888; }
.outcome { border-left: 6px solid #b26a00; padding: .4em .8em; background: #fafafa; }
.outcome.v-leaked, .outcome.v-presumed-leaked { border-color: #c62828; }
.outcome.v-defended { border-color: #2e7d32; } .outcome.v-failed, .outcome.v-skipped { border-color: #555; }
.outcome .verdict { font-weight: 700; text-transform: uppercase; letter-spacing: .03em; }
"""


def page_css(own: str) -> str:
    """A page's stylesheet: the shared rules with the page's ``own`` rules (lines of CSS) in between."""
    return _CSS_HEAD + own + _CSS_TAIL


def script_csp(script: str) -> str:
    """The page's Content-Security-Policy allowing exactly the inline ``script`` (by its SHA-256
    hash) and nothing else that CSP does not already allow."""
    import base64
    import hashlib

    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    return f"{CSP}; script-src 'sha256-{digest}'"


def html_page(title: str, subtitle: str, body: str, *, css: str, generator: str | None = None,
              script: str | None = None) -> str:
    """One whole page: head (charset, CSP, viewport, ``<title>gradleak: TITLE</title>``, the CSS),
    then ``<h1>TITLE</h1>``, the subtitle and ``body``. ``title``, ``subtitle`` and ``body`` are
    HTML; ``generator``, when given, is written as a ``<meta name="generator">`` right after the
    charset (early, where a reader looking for it finds it)."""
    generator_meta = f'<meta name="generator" content="{escape(generator)}">\n' if generator is not None else ""
    csp = script_csp(script) if script else CSP
    tail = f"<script>{script}</script>\n" if script else ""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
{generator_meta}<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>gradleak: {title}</title>
<style>{css}</style>
</head>
<body>
<h1>{title}</h1>
<p class="sub">{subtitle}</p>
{body}
{tail}</body>
</html>
"""


def write_page(path: Path, page: str) -> Path:
    """Write an HTML page atomically (unpredictable temporary name, then rename): a crash or a
    full disk leaves the previous page; a link planted next to it is never followed."""

    try:
        atomic_write_bytes(path, page.encode("utf-8"))
    except OSError as exc:
        raise DataError(f"{path} cannot be written: {exc.strerror or exc}") from None
    return path


# --------------------------------------------------------------------------- values and tables


def format_value(key: str, value: Any, number: Callable[[str, float], str]) -> str:
    """One value as escaped HTML: None as a muted "n/a", a bool as yes/no, a finite float as
    ``number(key, value)`` writes it (the page's units), anything else as its text or JSON."""
    if value is None:
        return '<span class="muted">n/a</span>'
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return escape(str(value))
    if isinstance(value, float):
        return number(key, value) if math.isfinite(value) else escape(str(value))
    if isinstance(value, str):
        return escape(value)
    return escape(json.dumps(value, default=str, ensure_ascii=False))


def value_cell(value: Any, html: str) -> str:
    """A table cell holding ``html`` (``value`` formatted), right-aligned when ``value`` is a number."""
    cls = ' class="num"' if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
    return f"<td{cls}>{html}</td>"


def kv_table(items: Mapping[str, Any], fmt: Callable[[str, Any], str],
             labels: Mapping[str, str] | None = None) -> str:
    """A two-column table: each key (or its label), escaped, and its value as ``fmt(key, value)``."""
    labels = labels or {}
    rows = "".join(f"<tr><th>{escape(labels.get(k, str(k)))}</th>{value_cell(v, fmt(str(k), v))}</tr>"
                   for k, v in items.items())
    return f"<table>{rows}</table>"


# --------------------------------------------------------------------------- figures


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def figure(png: bytes, alt: str, caption: str) -> str:
    """A ``<figure>`` with the PNG embedded and its caption; ``alt`` and ``caption`` are escaped."""
    return (f'<figure><img src="{data_uri(png)}" alt="{escape(alt)}">'
            f"<figcaption>{escape(caption)}</figcaption></figure>")


def inputs_exact(metrics: Mapping[str, Any]) -> str | None:
    """A closed form's inputs read off the update exactly, as "k of K" (``separated``, CPA's
    ``exact_inputs``; K the batch); None for an optimisation attack or a defended update, whose
    separated inputs are read off noise and are not exact."""
    if not metrics.get("closed_form") or metrics.get("defenses"):
        return None
    k, n = metrics.get("separated", metrics.get("exact_inputs")), metrics.get("batch_size")
    if isinstance(k, bool) or not isinstance(k, int) or isinstance(n, bool) or not isinstance(n, int):
        return None
    return f"{k} of {n}"


def verdict_notice(metrics: Mapping[str, Any]) -> str:
    """The verdict on the client (:func:`outcome_notice`), what ``auto`` tried, and the attack's own
    convergence, worded so that the boxes agree with the verdict: under "leaked" the attack's fit
    is a plain line (the scores against the truth decide; "not evidence that the client is safe"
    would contradict the badge), elsewhere a non-converged attack gets one notice, said once."""
    if "converged" not in metrics:
        return ""
    conv = metrics.get("convergence") if isinstance(metrics.get("convergence"), Mapping) else {}
    reason = str(conv.get("reason", "")).rstrip(". ")
    auto = metrics.get("auto") if isinstance(metrics.get("auto"), Mapping) else None
    chosen = ""
    if auto is not None:  # --attack auto: which attack it used, and why
        chosen = (f'<p class="sub"><b>auto</b> used {escape(str(auto.get("used")))}: {escape(str(auto.get("why")))}. '
                  f"Tried: {escape(tried_summary(auto))}.</p>")
    head = outcome_notice(metrics) + chosen
    if metrics.get("converged") is True:
        return f'{head}<p class="sub"><b>Converged</b>: {escape(reason)}.</p>'
    if metrics.get("verdict") == LEAKED:
        return f'{head}<p class="sub"><b>The attack\'s own fit</b>: {escape(_fit_line(metrics, conv))}.</p>'
    safe = "" if "not evidence that the client is safe" in reason else \
        " Low scores here are not evidence that the client is safe."
    return f'{head}<p class="notice"><b>The attack did not converge.</b> {escape(reason)}.{safe}</p>'


def _fit_line(metrics: Mapping[str, Any], conv: Mapping[str, Any]) -> str:
    """A leaked run's convergence, in numbers: the verdict rests on the scores against the truth."""
    rel, line = conv.get("relative_gradient_distance"), conv.get("threshold")
    fit = (f"relative distance {rel:.2e} > its line {line:g}" if isinstance(rel, (int, float))
           and isinstance(line, (int, float)) else "no finite distance recorded")
    exact = inputs_exact(metrics)
    how = f"a closed form that read {exact} inputs off the update exactly; " if exact else ""
    return (f"{how}not converged ({fit}); the verdict rests on what was rebuilt, measured against the client's "
            "data")


def outcome_notice(metrics: Mapping[str, Any]) -> str:
    """The verdict on the client (gradleak/outcome.py) as a badge, with its reason, what would
    decide it, the positive control and the evidence it was judged on (for the auditor to check)."""
    verdict = metrics.get("verdict")
    if not isinstance(verdict, str) or not verdict:
        return ""
    slug = "".join(c if c.isalnum() else "-" for c in verdict.lower())
    reason = escape(str(metrics.get("verdict_reason", "")))
    nxt = metrics.get("next_step")
    nxt_html = f"<br>Next: {escape(str(nxt))}" if nxt and verdict != "leaked" else ""
    control = metrics.get("control") if isinstance(metrics.get("control"), Mapping) else None
    control_html = ""
    if control is not None:
        psnr = control.get("psnr_mean")
        shown = f", PSNR {psnr:.1f} dB" if isinstance(psnr, (int, float)) and not isinstance(psnr, bool) else ""
        control_html = (f"<br>Positive control (the same attack on the update without the defenses): "
                        f"<b>{escape(str(control.get('verdict')))}</b>{escape(shown)}")
    evidence = metrics.get("evidence") if isinstance(metrics.get("evidence"), Mapping) else {}
    details = ""
    if evidence:
        rows = "".join(f"<tr><th>{escape(str(k))}</th><td>{escape(str(v))}</td></tr>" for k, v in evidence.items())
        details = f"<details><summary>the evidence judged (outcome.py)</summary><table>{rows}</table></details>"
    return (f'<div class="outcome v-{escape(slug)}"><span class="verdict">{escape(verdict)}</span>: {reason}'
            f"{nxt_html}{control_html}{details}</div>")
