"""The self-contained HTML report of a text run folder: original and recovered sentences side by
side, word pieces coloured by match, in the run report skeleton (:mod:`gradleak.report.run_page`)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from html import escape
from pathlib import Path
from typing import Any

from ..report.figures import plottable_float, png_bytes
from ..report.page import data_uri, format_value, kv_table, page_css
from ..report.run_page import RunFolder, RunPage, render_run_report

#: The shared rules with these in between: word pieces coloured by match.
_CSS = page_css(""".notice { background: #fff8e1; border: 1px solid #f0d78c; padding: .6em 1em; border-radius: 4px; }
.tok { display: inline-block; margin: 1px; padding: 0 .3em; border-radius: 3px; font-family: ui-monospace,
       SFMono-Regular, Menlo, monospace; font-size: .9em; border: 1px solid transparent; }
.hit { background: #d9f2d9; border-color: #8fd18f; }
.near { background: #fff0c2; border-color: #e8c766; }
.miss { background: #fbdada; border-color: #e79b9b; }
.plain { background: #eef0f3; border-color: #d5d9df; }
figure { margin: 0 0 1.2em; } figure img { max-width: 100%; border: 1px solid #eee; }
""")

_SUMMARY = (("token_accuracy", "Token accuracy (position-wise)"), ("token_set_precision", "Token-set precision"),
            ("token_set_recall", "Token-set recall"), ("bleu", "BLEU (sacrebleu, 0-100)"), ("rouge1", "ROUGE-1 F1"),
            ("rouge2", "ROUGE-2 F1"), ("rougeL", "ROUGE-L F1"), ("exact_sentences", "Sentences recovered exactly"),
            ("label_accuracy", "Label accuracy"),
            ("gradient_distance", "Gradient distance"), ("iterations", "Iterations"), ("wall_seconds", "Wall time"))


def _number(key: str, v: float) -> str:
    """A finite float: the accuracies, precision and recall in %, seconds, BLEU to one decimal."""
    if key in ("token_accuracy", "label_accuracy", "token_set_precision", "token_set_recall"):
        return f"{100 * v:.1f} %"
    if key == "wall_seconds":
        return f"{v:.1f} s"
    if key == "bleu":
        return f"{v:.1f}"
    return f"{v:.4g}"


def _fmt(key: str, v: Any) -> str:
    return format_value(key, v, _number)


def _table(items: Mapping[str, Any], labels: Mapping[str, str] | None = None) -> str:
    return kv_table(items, _fmt, labels)


def _list(v: Any) -> list[Any]:
    """A list field of metrics.json as a list (anything else written there counts as empty)."""
    return v if isinstance(v, list) else []


def _defenses(v: Any) -> list[Any]:
    return [v] if isinstance(v, str) and v else _list(v)


def _tokens(tokens: list[Any], classes: list[str]) -> str:
    return "".join(f'<span class="tok {c}">{escape(str(t))}</span>' for t, c in zip(tokens, classes, strict=True)) or \
        '<span class="muted">(none)</span>'


def _sentences(metrics: Mapping[str, Any]) -> str:
    rows = metrics.get("per_sentence")
    if not isinstance(rows, list) or not rows:
        recovered = _list(metrics.get("recovered_sentences"))
        items = "".join(f"<li>{escape(str(s))}</li>" for s in recovered)
        return ('<h2>Sentences</h2><p class="notice">No ground truth given: only the reconstruction is shown.</p>'
                f"<ol>{items}</ol>")
    out = ["<h2>Sentences</h2><table><tr><th>#</th><th>original</th><th>recovered</th><th>token acc.</th>"
           "<th>BLEU</th><th>ROUGE-1 / 2 / L</th><th>exact</th><th>label true / restored</th></tr>"]
    for r in rows:
        if not isinstance(r, Mapping):
            continue
        t_tok = _list(r.get("tokens_true"))
        r_tok = _list(r.get("tokens_recovered"))
        match = _list(r.get("match"))
        in_set = _list(r.get("recovered_in_set"))
        t_cls = ["hit" if i < len(match) and match[i] else "plain" for i in range(len(t_tok))]
        r_cls = []
        for j in range(len(r_tok)):
            hit = j < len(t_tok) and j < len(match) and match[j]
            r_cls.append("hit" if hit else ("near" if j < len(in_set) and in_set[j] else "miss"))
        out.append(
            f"<tr><td class=\"num\">{_fmt('index', r.get('index'))}</td>"
            f"<td>{escape(str(r.get('original', '')))}<br>{_tokens(t_tok, t_cls)}</td>"
            f"<td>{escape(str(r.get('recovered', '')))}<br>{_tokens(r_tok, r_cls)}</td>"
            f"<td class=\"num\">{_fmt('token_accuracy', r.get('token_accuracy'))}</td>"
            f"<td class=\"num\">{_fmt('bleu', r.get('bleu'))}</td>"
            f"<td class=\"num\">{_fmt('rouge1', r.get('rouge1'))} / {_fmt('rouge2', r.get('rouge2'))} / "
            f"{_fmt('rougeL', r.get('rougeL'))}</td>"
            f"<td>{'yes' if r.get('exact') else 'no'}</td>"
            f"<td>{_fmt('label', r.get('label_true'))} / {_fmt('label', r.get('label_restored'))}</td></tr>")
    out.append("</table><p class=\"muted\">Word pieces: <span class=\"tok hit\">same position</span> "
               "<span class=\"tok near\">in the sentence, other position</span> "
               "<span class=\"tok miss\">not in the sentence</span> "
               "<span class=\"tok plain\">true token not recovered at its position</span></p>")
    return "".join(out)


def _bag(metrics: Mapping[str, Any]) -> str:
    bag = metrics.get("bag_of_words")
    if not isinstance(bag, Mapping):
        return ""
    tokens = [str(t) for t in _list(bag.get("tokens"))]
    how = "exactly non-zero rows" if bag.get("exact") else "largest rows (the update is noisy: approximate)"
    return (f"<h2>Bag of words</h2><p>{len(tokens)} tokens from the word-embedding gradient ({escape(how)}); "
            f"longest sentence: {_fmt('length', bag.get('length'))} tokens.</p>"
            f"<p>{_tokens(tokens, ['plain'] * len(tokens))}</p>")


def _history_png(history: list[dict[str, str]]) -> bytes | None:
    if not history:
        return None
    from matplotlib.figure import Figure

    def num(v: str | None) -> float:
        x = plottable_float(v)   # finite and plottable, else NaN (left out)
        return float("nan") if x is None else x
    fig = Figure(figsize=(6.4, 3.6), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    for phase, colour in (("dlg", "C0"), ("discrete", "C1"), ("search", "C1"), ("bow", "C2")):
        pts = [(num(h.get("iteration")), num(h.get("loss"))) for h in history if h.get("phase") == phase]
        pts = [(x, y) for x, y in pts if y > 0 and math.isfinite(y)]
        if pts:
            ax.plot(*zip(*pts, strict=True), ".-" if phase != "dlg" else "-", color=colour, ms=3, lw=1.2,
                    label={"dlg": "optimisation", "discrete": "rounded to tokens", "search": "order search"}.get(phase))
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_ylabel("gradient distance")
    handles, labels = ax.get_legend_handles_labels()
    acc = [(num(h.get("iteration")), num(h.get("token_accuracy"))) for h in history]
    acc = [(x, y) for x, y in acc if math.isfinite(y)]
    if acc:
        ax2 = ax.twinx()
        ax2.plot(*zip(*acc, strict=True), "o", color="C2", ms=3, label="token accuracy")
        ax2.set_ylim(-0.02, 1.02)
        ax2.set_ylabel("token accuracy")
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    if handles:
        ax.legend(handles, labels, loc="center right", fontsize=8)
    return png_bytes(fig)


def _summary(run: RunFolder) -> str:
    """The summary table and, after an order search, the scores before it."""
    metrics = run.metrics
    summary = {k: metrics.get(k) for k, _ in _SUMMARY}
    before = ""
    if metrics.get("token_accuracy_dlg") is not None:
        before = (f"<p>Before the order search (each position's most probable token after optimisation): token "
                  f"accuracy {_fmt('token_accuracy', metrics.get('token_accuracy_dlg'))}, gradient distance "
                  f"{_fmt('x', metrics.get('gradient_distance_dlg'))}.</p>")
    return f"{_table(summary, dict(_SUMMARY))}{before}"


def _evidence(run: RunFolder) -> list[str]:
    """The text report's own sections: what was attacked, the sentences, the bag of words."""
    metrics = run.metrics
    attacked = {"model": metrics.get("model"), "data": metrics.get("data"), "batch size": metrics.get("batch_size"),
                "attack": metrics.get("attack"), "threat": metrics.get("threat"),
                "defenses": ", ".join(str(d) for d in _defenses(metrics.get("defenses"))) or "none",
                "label method": metrics.get("label_method")}
    return [f"<h2>What was attacked</h2>{_table(attacked)}", _sentences(metrics), _bag(metrics)]


def _progress(run: RunFolder) -> str:
    """The gradient distance and token accuracy per iteration (history.csv); "" without one."""
    png = _history_png(run.history or [])
    if png is None:
        return ""
    return (f'<h2>Progress</h2><figure><img alt="progress" src="{data_uri(png)}">'
            "<figcaption>Gradient distance per iteration "
            "(optimisation, then each accepted search move) and token accuracy where observed."
            "</figcaption></figure>")


#: The text modality's part of its run report.
TEXT_PAGE = RunPage(kind="text run report", css=_CSS, fmt=_fmt, summary=_summary, evidence=_evidence,
                    history=_progress)


def render_text_report(run_dir: str | os.PathLike[str], *, name: str | None = None) -> Path:
    """Write ``run_dir/report.html`` for a text run folder and return its path.

    ``name``: the run's name in the subtitle (default: the folder's name without the staging
    decoration). Every file is checked and read (bounded, see :mod:`gradleak.report.run_page`)
    before anything is drawn or written; a problem is one DataError / InputFileError /
    ConfigError naming the file."""
    return render_run_report(run_dir, TEXT_PAGE, name=name)


__all__ = ["render_text_report"]
