"""The image run report: the sections of an image run folder's report.html (summary, pictures,
per-image scores, the defense's evidence, the loss), framed by the run report skeleton
(:mod:`gradleak.report.run_page`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from gradleak.errors import DataError
from gradleak.paths import check_input_file
from gradleak.report.figures import loss_plot_png
from gradleak.report.page import figure, format_value, inputs_exact, kv_table, page_css, value_cell
from gradleak.report.run_page import RunFolder, RunPage, check_not_link, folded_json, render_run_report

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# A run folder's PNGs are read whole: a few hundred KB.
MAX_PNG_BYTES = 64 * 1024 * 1024

#: metrics.json keys that get their own place on the page (everything else is listed generically).
_SUMMARY_KEYS = (
    "psnr_mean", "zero_psnr_mean", "above_zero_image", "ssim_mean", "mse_mean", "label_accuracy",
    "fft2d_mean", "rpsnr_mean", "lpips_mean", "iip",
    "iterations", "wall_seconds", "batch_size",
)
_PLACED_KEYS = frozenset(_SUMMARY_KEYS) | {
    "attack", "model", "data", "per_image", "threat", "defenses", "update", "versions", "class_names",
    "iip_feature_space", "iip_pool_size", "lpips_notice",
}
_PER_IMAGE_COLUMNS = ("index", "name", "psnr", "zero_psnr", "ssim", "mse", "fft2d", "rpsnr", "lpips", "identified",
                      "label_true", "label_restored")
_LABEL_COLUMNS = frozenset({"label_true", "label_restored"})

#: The image report's own rules (the dashboards add theirs after them, gradleak.report.risk).
REPORT_RULES = """tr.miss td { background: #fff4f4; }
.notice { background: #fff8e1; border: 1px solid #f0d78c; padding: .6em 1em; border-radius: 4px; }
.flex { display: flex; gap: 2em; align-items: flex-start; flex-wrap: wrap; }
.flex > aside { flex: 0 0 320px; }
.flex > div { flex: 1 1 500px; min-width: 0; }
figure { margin: 0 0 1.2em; }
figure img { max-width: 100%; image-rendering: pixelated; border: 1px solid #eee; }
"""
#: The image report's stylesheet: the shared rules with REPORT_RULES in between.
_CSS = page_css(REPORT_RULES)


# --------------------------------------------------------------------------- reading


def _read_png(path: Path) -> bytes | None:
    """PNG bytes at ``path``, None if absent or not a PNG (never embed something mislabelled); a
    link is one DataError."""

    if not os.path.lexists(path):
        return None
    check_not_link(path)
    p = check_input_file(path, "run file", max_bytes=MAX_PNG_BYTES)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise DataError(f"run file {path} cannot be read: {exc.strerror or exc}") from None
    return data if data.startswith(_PNG_MAGIC) else None


# --------------------------------------------------------------------------- formatting


def _number(key: str, value: float) -> str:
    """A finite float with the unit its key suggests (PSNR in dB, accuracy in %, seconds)."""
    k = key.lower()
    if "psnr" in k:
        return f"{value:.2f} dB"
    if "ssim" in k:
        return f"{value:.4f}"
    if "accuracy" in k:
        return f"{100.0 * value:.1f} %"
    if "seconds" in k:
        return f"{value:.1f} s"
    return f"{value:.4g}"


def format_metric(key: str, value: Any) -> str:
    """Human-readable, HTML-escaped rendering of one value, with units inferred from its key."""
    return format_value(key, value, _number)


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _cell(key: str, value: Any) -> str:
    return value_cell(value, format_metric(key, value))


def _kv_table(items: Mapping[str, Any]) -> str:
    """Two-column key/value table; keys and values escaped."""
    return kv_table(items, format_metric)


def _label(value: Any, class_names: Sequence[Any]) -> str:
    """A label with its class name when known, e.g. ``3 (cat)``; escaped."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(class_names):
        return f"{escape(str(value))} ({escape(str(class_names[value]))})"
    return format_metric("label", value)


# --------------------------------------------------------------------------- sections


def _summary(metrics: Mapping[str, Any], has_truth: bool) -> str:
    labels = {
        "psnr_mean": "PSNR (mean)",
        "zero_psnr_mean": "PSNR of the zero image (mean; reads nothing of the update)",
        "above_zero_image": "Images above their own zero image", "ssim_mean": "SSIM (mean)", "mse_mean": "MSE (mean)",
        "label_accuracy": "Label accuracy", "iterations": "Iterations",
        "wall_seconds": "Wall time", "batch_size": "Batch size",
        "fft2d_mean": "FFT2D cosine distance (mean)", "rpsnr_mean": "Registered PSNR (mean)",
        "lpips_mean": "LPIPS (mean)", "iip": "IIP",
    }
    rows = "".join(
        f"<tr><th>{labels[k]}</th>{_cell(k, metrics.get(k))}</tr>" + (_worst_row(metrics) if k == "psnr_mean" else "")
        for k in _SUMMARY_KEYS if k in metrics or k in ("psnr_mean", "ssim_mean", "mse_mean", "label_accuracy")
    )
    exact = inputs_exact(metrics)
    if exact:
        rows += f"<tr><th>Inputs read off exactly (closed form)</th><td>{escape(exact)}</td></tr>"
    out = f"<table>{rows}</table>"
    if metrics.get("iip_feature_space"):
        out += (f'<p class="sub">IIP: nearest neighbour in {escape(str(metrics["iip_feature_space"]))} among '
                f'{escape(str(metrics.get("iip_pool_size")))} real images.</p>')
    if metrics.get("status") == "diverged":
        div = metrics.get("divergence")
        detail = f": {div.get('message', '')}" if isinstance(div, Mapping) and div.get("message") else ""
        out += (f'<p class="notice">The attack diverged and stopped at its last good state'
                f"{escape(str(detail))}; the numbers are for that state.</p>")
    if metrics.get("lpips_notice"):
        out += f'<p class="notice">{escape(str(metrics["lpips_notice"]))}</p>'
    if not has_truth:
        out += ('<p class="notice">No ground truth given: image similarity and label accuracy '
                "could not be measured; only the attack's output is shown.</p>")
    return out


def _defense_evidence(metrics: Mapping[str, Any], start_png: bytes | None) -> str:
    """The positive evidence a defended run's verdict weighed (outcome.py): the decoy test and,
    where it ran, the truth-start test (the same attack started from the true batch), per image."""
    test = metrics.get("decoy_test") if isinstance(metrics.get("decoy_test"), Mapping) else None
    start = metrics.get("truth_start_test") if isinstance(metrics.get("truth_start_test"), Mapping) else None
    if test is None and start is None:
        return ""
    out = "<h2>Evidence about the defense</h2>"
    if test is not None:
        decoys = test.get("decoys") if isinstance(test.get("decoys"), list) else []
        out += (f'<p>Decoy test ({escape(str(test.get("measure", "")))}): the true batch at '
                f'{format_metric("", test.get("truth"))}, the best of {len(decoys)} decoy batches (public photos '
                f'with its labels) at {format_metric("", test.get("best_decoy"))}, noise spread '
                f'{format_metric("", test.get("spread"))}: '
                + ("the update still picks the true batch out of the decoys (an identification, not a "
                   "reconstruction)." if test.get("separated") else "the update cannot tell the true batch from them.")
                + "</p>")
    if start is not None:
        runs = [r for r in start.get("runs") or [] if isinstance(r, Mapping)]
        out += ("<p>Truth-start test: each attack started from the true batch on the defended update: "
                + ("every one walked away to an answer that is no leak." if start.get("walked_away") else
                   f"a leak remains ({escape(str(start.get('leak') or ''))}).") + "</p>"
                "<table><tr><th>attack</th><th>iterations</th><th>seconds</th><th>relative distance</th><th>image</th>"
                "<th>PSNR</th><th>SSIM</th><th>coarse SSIM</th><th>recognisable</th></tr>")
        for run in runs:
            for r in run.get("per_image") or []:
                if isinstance(r, Mapping):
                    out += (f"<tr><td>{escape(str(run.get('attack')))}</td>"
                            f"<td>{format_metric('', run.get('iterations'))} of "
                            f"{format_metric('', run.get('budget_iterations'))}</td>"
                            f"{_cell('seconds', run.get('seconds'))}{_cell('', run.get('relative_gradient_distance'))}"
                            f"<td>{escape(str(r.get('name') or r.get('index')))}</td>{_cell('psnr', r.get('psnr'))}"
                            f"{_cell('ssim', r.get('ssim'))}{_cell('ssim', r.get('coarse_ssim'))}"
                            f"<td>{'yes' if r.get('recognisable') else 'no'}</td></tr>")
        out += "</table>"
        if start_png is not None:
            out += figure(start_png, "truth-start answers", "Originals (top) and each attack's answer when started "
                                                            "from them on the defended update (below).")
    return out


def worst_image(metrics: Mapping[str, Any]) -> tuple[float, str] | None:
    """The batch's worst-rebuilt image as (PSNR, name): the lowest PSNR of ``per_image`` (a mean of
    86 dB hides an image at 17 dB), or metrics.json's ``psnr_min`` when no row holds one; None
    without ground truth."""
    rows = metrics.get("per_image") if isinstance(metrics.get("per_image"), list) else []
    scored = [(float(r["psnr"]), str(r.get("name", r.get("index", "?")))) for r in rows
              if isinstance(r, Mapping) and isinstance(r.get("psnr"), (int, float)) and not isinstance(r.get("psnr"), bool)]
    if scored:
        return min(scored, key=lambda s: s[0])
    low = metrics.get("psnr_min")
    return (float(low), "?") if isinstance(low, (int, float)) and not isinstance(low, bool) else None


def convergence_text(metrics: Mapping[str, Any]) -> str:
    """The attack's own convergence in a few words, as every summary states it: a converged
    answer under a noise floor fits the update only as well as the true data would (it does not
    "explain" it), and a closed form that did not converge ran out of nothing (it has no budget)."""
    conv = metrics.get("convergence") if isinstance(metrics.get("convergence"), Mapping) else {}
    rel, floor = conv.get("relative_gradient_distance"), conv.get("noise_floor")
    dist = f"relative distance {rel:.2e}" if isinstance(rel, float) else "no finite distance"
    if metrics.get("converged"):
        if isinstance(floor, (int, float)) and floor > 0:
            return f"yes: fits the defended update as well as the true data would ({dist}; the truth's {floor:.2e})"
        return f"yes ({dist})"
    if metrics.get("closed_form"):
        return f"no: computed in closed form (no iterations); its answer does not explain the whole update ({dist})"
    return f"no ({dist})"


def _worst_row(metrics: Mapping[str, Any]) -> str:
    worst = worst_image(metrics) if isinstance(metrics.get("per_image"), list) and len(metrics["per_image"]) > 1 else None
    if worst is None:
        return ""
    return f"<tr><th>PSNR (worst image: {escape(worst[1])})</th>{_cell('psnr_min', worst[0])}</tr>"


def _attacked(metrics: Mapping[str, Any]) -> str:
    """The "what was attacked" panel: threat model, defenses, batch, model, update metadata."""
    parts = ["<h2>What was attacked</h2>"]
    parts.append(_kv_table({
        "model": metrics.get("model"), "data": metrics.get("data"),
        "batch size": metrics.get("batch_size"), "attack": metrics.get("attack"),
    }))
    threat = metrics.get("threat")
    parts.append("<h3>Threat model</h3>")
    if isinstance(threat, Mapping) and threat:
        parts.append(_kv_table(threat))
    elif threat:
        parts.append(f"<p>{format_metric('threat', threat)}</p>")
    else:
        parts.append('<p class="muted">not recorded</p>')
    defenses = metrics.get("defenses")
    parts.append("<h3>Defenses</h3>")
    if isinstance(defenses, Sequence) and not isinstance(defenses, str) and defenses:
        items = "".join(
            f"<li>{escape(d) if isinstance(d, str) else format_metric('defense', d)}</li>" for d in defenses
        )
        parts.append(f"<ul>{items}</ul>")
    elif isinstance(defenses, str) and defenses:
        parts.append(f"<p>{escape(defenses)}</p>")
    else:
        parts.append("<p>none</p>")
    update = metrics.get("update")
    if isinstance(update, Mapping) and update:
        parts.append("<h3>Shared update</h3>")
        parts.append(_kv_table(update))
    return "".join(parts)


def _pictures(recon: bytes | None, candidates: bytes | None, has_truth: bool,
              others: Sequence[tuple[str, bytes, str]] = ()) -> str:
    parts = ["<h2>Pictures</h2>"]
    if recon is not None:
        caption = ("Originals (top) and the reconstructions paired with them (bottom)."
                   if has_truth else "Reconstructions.")
        parts.append(figure(recon, "reconstruction", caption))
    else:
        parts.append('<p class="muted">no reconstruction.png in this run folder</p>')
    if candidates is not None:
        parts.append(figure(candidates, "candidates",
                            "Candidates: one row per seed, then the consensus."))
    for name, png, verdict in others:   # auto's other attacks on the same update
        parts.append(figure(png, f"reconstruction by {name}", f"auto also ran {name} on this update: {verdict}."))
    return "".join(parts)


def _other_answers(run_dir: Path, metrics: Mapping[str, Any]) -> list[tuple[str, bytes, str]]:
    """The pictures of the other attacks ``auto`` ran (reconstruction-<attack>.png), each with its
    verdict and PSNR from metrics.json's auto.tried."""
    auto = metrics.get("auto") if isinstance(metrics.get("auto"), Mapping) else {}
    tried = auto.get("tried") if isinstance(auto.get("tried"), list) else []
    out = []
    for t in tried:
        name = t.get("attack") if isinstance(t, Mapping) else None
        if not isinstance(name, str) or name == auto.get("used") or not name.isidentifier():
            continue
        png = _read_png(run_dir / f"reconstruction-{name}.png")
        if png is None:
            continue
        psnr = t.get("psnr_mean")
        verdict = str(t.get("verdict") or ("converged" if t.get("converged") else "not converged"))
        out.append((name, png, verdict + (f", {psnr:.1f} dB" if isinstance(psnr, (int, float)) else "")))
    return out


def _per_image(metrics: Mapping[str, Any], has_truth: bool) -> str:
    per_image = metrics.get("per_image") or []
    rows_in = [r for r in per_image if isinstance(r, Mapping)] if isinstance(per_image, list) else []
    if not rows_in:
        msg = "no ground truth given" if not has_truth else "no per-image scores recorded"
        return f'<h2>Per image</h2><p class="muted">{msg}</p>'
    class_names = metrics.get("class_names")
    class_names = class_names if isinstance(class_names, list) else []
    columns = [c for c in _PER_IMAGE_COLUMNS if c in ("index", "psnr") or any(c in r for r in rows_in)]
    for r in rows_in:  # show every extra scalar column too (matched_slot, ...)
        columns += [k for k, v in r.items() if k not in columns and _is_scalar(v)]
    head = "".join(f"<th>{escape(str(c))}</th>" for c in columns)
    body = []
    for r in rows_in:
        cells = []
        for c in columns:
            v = r.get(c)
            cells.append(f"<td>{_label(v, class_names)}</td>" if c in _LABEL_COLUMNS else _cell(c, v))
        row_cls = ' class="miss"' if r.get("label_true") != r.get("label_restored") else ""
        body.append(f"<tr{row_cls}>{''.join(cells)}</tr>")
    return (f"<h2>Per image</h2><table><tr>{head}</tr>{''.join(body)}</table>"
            '<p class="muted">Rows with a shaded background: restored label differs from the '
            "true label of the paired image.</p>")


def _other_metrics(metrics: Mapping[str, Any]) -> str:
    scalars = {k: v for k, v in metrics.items() if k not in _PLACED_KEYS and _is_scalar(v)}
    others = {k: v for k, v in metrics.items() if k not in _PLACED_KEYS and not _is_scalar(v)}
    out = ""
    if scalars:
        out += "<h2>Other metrics</h2>" + _kv_table(scalars)
    if others:
        out += "<h2>Other recorded fields</h2>" + folded_json(
            others, f"{len(others)} structured fields ({', '.join(escape(str(k)) for k in list(others)[:8])}"
                    f"{', ...' if len(others) > 8 else ''}), as recorded in metrics.json")
    return out


def _iterations_logged(history: list[dict[str, Any]]) -> int:
    return len({str(row.get("iteration")) for row in history if row.get("loss") not in (None, "")})


def _loss(history: list[dict[str, Any]] | None, metrics: Mapping[str, Any]) -> str:
    if history is None:
        return '<h2>Loss</h2><p class="muted">no history.csv in this run folder</p>'
    if _iterations_logged(history) < 2:
        # A closed-form attack (or a run stopped at its first step) has at most one point: a chart
        # of it would be an empty axis. Say what there is instead.
        dist = metrics.get("relative_gradient_distance")
        shown = (f" Its answer's relative gradient distance is {_number('relative_gradient_distance', dist)}."
                 if isinstance(dist, (int, float)) and not isinstance(dist, bool) else "")
        why = ("the attack computes its answer in closed form; it does not optimise" if metrics.get("closed_form")
               or metrics.get("iterations") in (0, None) else "the run logged a single iteration")
        return f'<h2>Loss</h2><p class="muted">No loss curve: {why}.{shown}</p>'
    return "<h2>Loss</h2>" + figure(loss_plot_png(history), "loss curve",
                                    "Gradient-matching loss per logged iteration (log scale).")


# --------------------------------------------------------------------------- page


def _has_truth(metrics: Mapping[str, Any]) -> bool:
    """Whether the run was scored against ground truth (``psnr_mean`` or ``per_image`` recorded)."""
    return metrics.get("psnr_mean") is not None or bool(metrics.get("per_image"))


def _summary_of(run: RunFolder) -> str:
    return _summary(run.metrics, _has_truth(run.metrics))


def _evidence(run: RunFolder) -> list[str]:
    """The image report's own sections: the defense's evidence, what was attacked beside the
    pictures (with the other answers of ``auto``), the per-image scores, the other metrics. The
    PNGs are read here, the reconstruction and the candidates first."""
    metrics, has_truth = run.metrics, _has_truth(run.metrics)
    recon = _read_png(run.path / "reconstruction.png")
    candidates = _read_png(run.path / "candidates.png")
    return [
        _defense_evidence(metrics, _read_png(run.path / "truth-start.png")),
        f'<div class="flex"><aside>{_attacked(metrics)}</aside><div>'
        f'{_pictures(recon, candidates, has_truth, _other_answers(run.path, metrics))}</div></div>',
        _per_image(metrics, has_truth),
        _other_metrics(metrics),
    ]


def _loss_of(run: RunFolder) -> str:
    return _loss(run.history, run.metrics)


#: The image modality's part of its run report.
IMAGE_PAGE = RunPage(kind="run report", css=_CSS, fmt=format_metric, summary=_summary_of, evidence=_evidence,
                     history=_loss_of)


def render_report(run_dir: str | os.PathLike[str], *, name: str | None = None) -> Path:
    """Write ``run_dir/report.html``, a self-contained page describing one run, and return its path.

    Reads the run folder contract described in the module's notes in docs/. Only metrics.json is
    required; missing optional files are mentioned on the page. When no ground truth was given
    (``psnr_mean`` null and ``per_image`` empty) the page says so and still renders.
    ``name``: the run's name in the subtitle (default: the folder's name, without the staging
    decoration when ``run_dir`` is a staging folder, see :func:`gradleak.report.run_page.run_name`).
    Raises :class:`gradleak.errors.DataError` (or InputFileError, ConfigError for a report.html
    that cannot be replaced) before anything is written if a file is missing or unusable.
    """
    return render_run_report(run_dir, IMAGE_PAGE, name=name)
