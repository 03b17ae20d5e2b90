"""PNG figures for runs and experiments: image grids, loss curves, generic line plots."""

from __future__ import annotations

import io
import math
import os
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure

#: Rendering resolution; the grid is laid out in pixels at this dpi, so 1 px == 1 px.
_DPI = 100
#: Target edge length of one upscaled image cell in the grid, in pixels.
_CELL_TARGET_PX = 96
_MARGIN_PX = 8
_GAP_PX = 6
_ROW_TITLE_PX = 20
_CAPTION_FONT_PT = 7
_CAPTION_LINE_PX = 11
_TITLE_FONT_PT = 9
# Width of a row title's character, an upper estimate (DejaVu Sans Bold at 9 pt and 100 dpi averages
# ~0.62 em of 12.5 px): the figure is made wide enough for its longest title.
_TITLE_CHAR_PX = 8
# Numbers beyond this magnitude are left out of plots: matplotlib cannot lay out an axis whose
# span overflows (+-1e308 raises in the tick locator), and no real loss, PSNR or accuracy is near it.
MAX_PLOTTED = 1e100
# PNG "Software" metadata would embed matplotlib's URL; drop it (the HTML report must hold no URLs).
_PNG_METADATA: dict[str, str | None] = {"Software": None}


# --------------------------------------------------------------------------- saving


def atomic_savefig(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Render ``fig`` as PNG and write it to ``path`` atomically (see the module's notes in docs/)."""
    from ..paths import atomic_write_bytes

    path = Path(path)
    atomic_write_bytes(path, png_bytes(fig))
    return path


def png_bytes(fig: Figure) -> bytes:
    """Render ``fig`` to PNG bytes in memory."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, metadata=_PNG_METADATA)
    return buf.getvalue()


# --------------------------------------------------------------------------- image grid


def _to_hwc_uint8(img: torch.Tensor, scale: int) -> np.ndarray:
    """[C, H, W] in [0, 1] (C = 1 or 3) -> [H*scale, W*scale, 3] uint8, nearest-neighbour upscaled."""
    img = torch.nan_to_num(img.detach().to("cpu", torch.float32), nan=0.0).clamp(0.0, 1.0)
    if img.shape[0] == 1:
        img = img.expand(3, -1, -1)
    if scale > 1:
        img = img.repeat_interleave(scale, dim=1).repeat_interleave(scale, dim=2)
    return (img.permute(1, 2, 0).numpy() * 255.0 + 0.5).astype(np.uint8)


def _wrap(caption: str, width_px: int) -> list[str]:
    """Split a caption into lines that fit under a cell ``width_px`` wide (approximate)."""
    chars = max(6, int(width_px / (_CAPTION_FONT_PT * 0.8)))  # ~5.6 px per char at 7 pt, 100 dpi
    lines: list[str] = []
    for part in caption.splitlines() or [""]:
        lines.extend(textwrap.wrap(part, chars, break_long_words=True) or [""])
    return lines


MAX_GRID_COLUMNS = 64   # images drawn per row
MAX_GRID_ROWS = 32      # rows drawn


def _bounded_grid(rows: Sequence[torch.Tensor], titles: Sequence[str], captions: Sequence[Sequence[str]] | None
                  ) -> tuple[list[torch.Tensor], list[str], list[list[str]] | None]:
    """The rows, titles and captions cut to MAX_GRID_ROWS x MAX_GRID_COLUMNS, each cut said."""
    out_rows, out_titles = [], []
    for row, title in zip(rows[:MAX_GRID_ROWS], titles[:MAX_GRID_ROWS], strict=True):
        k = int(row.shape[0]) if row.ndim >= 1 else 0
        out_rows.append(row[:MAX_GRID_COLUMNS])
        out_titles.append(f"{title} (first {MAX_GRID_COLUMNS} of {k})" if k > MAX_GRID_COLUMNS else str(title))
    if len(rows) > MAX_GRID_ROWS:
        out_titles[-1] += f"; {len(rows) - MAX_GRID_ROWS} more rows not drawn"
    cut = None if captions is None else [list(c)[:MAX_GRID_COLUMNS] for c in captions[:MAX_GRID_ROWS]]
    return out_rows, out_titles, cut


def save_image_grid(
    path: str | os.PathLike[str],
    rows: Sequence[torch.Tensor],
    row_titles: Sequence[str],
    captions: Sequence[Sequence[str]] | None = None,
) -> Path:
    """Write one PNG with image rows stacked top to bottom, each with a title and captions.

    rows:       R tensors [K_r, C, H, W] in [0, 1], C = 1 or 3, same H and W for all rows
                (e.g. originals above the paired reconstructions, or one row per seed).
    row_titles: R strings, drawn above each row.
    captions:   optional, R lists of up to K_r strings drawn under each cell
                (e.g. "PSNR 41.2 dB / label 3"); long captions wrap.

    Images are upscaled by an integer factor with nearest neighbour (about 96 px per cell) so
    28-32 px images stay crisp, and placed pixel-exact (``figimage``, no resampling).
    At most MAX_GRID_ROWS rows of MAX_GRID_COLUMNS images are drawn (a row's title then says
    "first N of K"): a batch size that an update file's metadata states, or 256 seeds, must not
    become a picture of gigabytes. Returns ``path``.
    """
    if len(rows) == 0:
        raise ValueError("save_image_grid needs at least one row")
    if len(row_titles) != len(rows):
        raise ValueError(f"got {len(rows)} rows but {len(row_titles)} row titles")
    if captions is not None and len(captions) != len(rows):
        raise ValueError(f"got {len(rows)} rows but {len(captions)} caption lists")
    rows, row_titles, captions = _bounded_grid(rows, row_titles, captions)
    height, width = _grid_image_size(rows)
    scale = max(1, round(_CELL_TARGET_PX / max(height, width)))
    cell_h, cell_w = height * scale, width * scale
    ncols = max(max(int(row.shape[0]) for row in rows), 1)
    wrapped, caption_px = _wrapped_captions(rows, captions, cell_w)

    fig_w = max(2 * _MARGIN_PX + ncols * cell_w + (ncols - 1) * _GAP_PX, 160,
                2 * _MARGIN_PX + _TITLE_CHAR_PX * max(len(str(t)) for t in row_titles))
    fig_h = _MARGIN_PX + sum(_ROW_TITLE_PX + cell_h + cap + _GAP_PX for cap in caption_px) + _MARGIN_PX
    canvas = np.full((fig_h, fig_w, 3), 255, dtype=np.uint8)
    fig = Figure(figsize=(fig_w / _DPI, fig_h / _DPI), dpi=_DPI, facecolor="white")
    _draw_rows(fig, canvas, rows, row_titles, wrapped, caption_px, scale)
    # figimage places the array 1:1 in device pixels (figure dpi == savefig dpi), no resampling.
    fig.figimage(canvas, xo=0, yo=0, origin="upper", zorder=0)
    return atomic_savefig(fig, path)


def _grid_image_size(rows: Sequence[torch.Tensor]) -> tuple[int, int]:
    """(H, W) shared by every row's images; ValueError unless each row is [K, C, H, W], C = 1 or 3."""
    height = width = None
    for r, row in enumerate(rows):
        if row.ndim != 4 or row.shape[1] not in (1, 3):
            raise ValueError(f"row {r} must be [K,C,H,W] with C = 1 or 3, got {tuple(row.shape)}")
        if height is None:
            height, width = int(row.shape[2]), int(row.shape[3])
        elif (int(row.shape[2]), int(row.shape[3])) != (height, width):
            raise ValueError("all rows must hold images of the same height and width")
    assert height is not None and width is not None
    return height, width


def _wrapped_captions(rows: Sequence[torch.Tensor], captions: Sequence[Sequence[str]] | None,
                      cell_w: int) -> tuple[list[list[list[str]]], list[int]]:
    """(the caption lines of every cell, row by row; the caption band's height in px per row,
    0 for a row without captions)."""
    wrapped: list[list[list[str]]] = []
    for r, row in enumerate(rows):
        texts = list(captions[r]) if captions is not None else []
        texts += [""] * (int(row.shape[0]) - len(texts))
        wrapped.append([_wrap(str(t), cell_w) for t in texts[: int(row.shape[0])]])
    caption_px = [
        (max((len(c) for c in row_caps if any(c)), default=0) * _CAPTION_LINE_PX + 4)
        if any(any(c) for c in row_caps)
        else 0
        for row_caps in wrapped
    ]
    return wrapped, caption_px


def _draw_rows(fig: Figure, canvas: np.ndarray, rows: Sequence[torch.Tensor], row_titles: Sequence[str],
               wrapped: list[list[list[str]]], caption_px: list[int], scale: int) -> None:
    """Each row's title and captions as text on ``fig``, its upscaled images into ``canvas``
    [fig_h, fig_w, 3] uint8, top to bottom."""
    fig_h, fig_w = canvas.shape[0], canvas.shape[1]
    cell_h, cell_w = int(rows[0].shape[2]) * scale, int(rows[0].shape[3]) * scale

    def text(x_px: float, y_px_from_top: float, s: str, **kw: Any) -> None:
        # parse_math=False: titles/captions come from file names and labels; a "$" must stay a "$".
        fig.text(x_px / fig_w, 1.0 - y_px_from_top / fig_h, s, parse_math=False, **kw)

    y = _MARGIN_PX
    for r, row in enumerate(rows):
        text(_MARGIN_PX, y + _ROW_TITLE_PX - 5, str(row_titles[r]), fontsize=_TITLE_FONT_PT,
             fontweight="bold", ha="left", va="baseline")
        y += _ROW_TITLE_PX
        for c in range(int(row.shape[0])):
            x = _MARGIN_PX + c * (cell_w + _GAP_PX)
            canvas[y : y + cell_h, x : x + cell_w] = _to_hwc_uint8(row[c], scale)
            lines = wrapped[r][c]
            if any(lines):
                text(x + cell_w / 2, y + cell_h + 2, "\n".join(lines), fontsize=_CAPTION_FONT_PT,
                     ha="center", va="top", linespacing=1.1)
        y += cell_h + caption_px[r] + _GAP_PX


# --------------------------------------------------------------------------- plots


def plottable_float(value: Any) -> float | None:
    """A plottable float from a history cell (float, int, numeric string): finite and at most
    MAX_PLOTTED in magnitude, else None."""
    if value is None or value == "":
        return None
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return out if math.isfinite(out) and abs(out) <= MAX_PLOTTED else None


def _loss_figure(history: Sequence[Mapping[str, Any]]) -> Figure:
    """Figure of loss (log scale) vs iteration, plus PSNR on a second axis when logged."""
    fig = Figure(figsize=(6.4, 3.6), dpi=_DPI, facecolor="white", layout="constrained")
    ax = fig.add_subplot()
    it_loss: list[tuple[float, float]] = []
    it_psnr: list[tuple[float, float]] = []
    for i, row in enumerate(history):
        it = plottable_float(row.get("iteration"))
        it = float(i) if it is None else it
        loss = plottable_float(row.get("loss"))
        if loss is not None:
            it_loss.append((it, loss))
        p = plottable_float(row.get("psnr"))
        if p is not None:
            it_psnr.append((it, p))

    ax.set_xlabel("iteration")
    ax.set_ylabel("gradient-matching loss")
    ax.set_title("Attack loss", fontsize=10)
    if not it_loss and not it_psnr:
        ax.text(0.5, 0.5, "no history logged", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        return fig

    handles = []
    if it_loss:
        xs, ys = zip(*it_loss, strict=True)
        (h,) = ax.plot(xs, ys, color="tab:blue", lw=1.4, label="loss")
        handles.append(h)
        # A log axis needs positive values; a loss that hits exactly 0 is masked, not fatal.
        if any(v > 0 for v in ys):
            ax.set_yscale("log", nonpositive="mask")
    ax.grid(True, which="major", alpha=0.3)
    if it_psnr:
        ax2 = ax.twinx()
        xs, ys = zip(*it_psnr, strict=True)
        (h,) = ax2.plot(xs, ys, color="tab:orange", lw=1.2, marker="o", ms=3, label="PSNR (dB)")
        ax2.set_ylabel("PSNR (dB)")
        handles.append(h)
    ax.legend(handles=handles, loc="best", fontsize=8)
    return fig


def loss_plot_png(history: Sequence[Mapping[str, Any]]) -> bytes:
    """The :func:`save_loss_plot` figure as in-memory PNG bytes (for embedding in HTML)."""
    return png_bytes(_loss_figure(history))


def save_loss_plot(path: str | os.PathLike[str], history: Sequence[Mapping[str, Any]]) -> Path:
    """Write the loss curve of an attack run as PNG.

    history: rows like ``{"iteration": int, "loss": float, "psnr": float (optional)}``
    (``Reconstruction.history`` or rows read back from history.csv). Loss is drawn on a log
    axis; if any row carries a finite "psnr", PSNR is drawn on a second y-axis.
    An empty history still yields a (labelled) figure. Returns ``path``.
    """
    return atomic_savefig(_loss_figure(history), path)


def save_line_plot(
    path: str | os.PathLike[str],
    x: Sequence[Any],
    series: Mapping[str, Sequence[float | None]],
    xlabel: str,
    ylabel: str,
    title: str,
    logy: bool = False,
) -> Path:
    """Write a generic line plot (one line per series) as PNG, for experiment sweeps.

    x:      N x positions (numbers, or strings for a categorical axis).
    series: name -> N y values (None / NaN points are left as gaps).
    logy:   log-scale y axis (non-positive values are masked).
    Returns ``path``.
    """
    fig = Figure(figsize=(6.4, 4.0), dpi=_DPI, facecolor="white", layout="constrained")
    ax = fig.add_subplot()
    xs = list(x)
    for name, values in series.items():
        ys = [np.nan if v is None else float(v) for v in values]
        if len(ys) != len(xs):
            raise ValueError(f"series {name!r} has {len(ys)} values for {len(xs)} x positions")
        ax.plot(xs, ys, marker="o", ms=4, lw=1.4, label=str(name))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if logy:
        ax.set_yscale("log", nonpositive="mask")
    ax.grid(True, alpha=0.3)
    if series:
        ax.legend(loc="best", fontsize=8)
    return atomic_savefig(fig, path)


# --------------------------------------------------------------------------- dashboard charts
# In-memory PNGs for the dashboards (gradleak.report.dashboard): values are plotted as given (the
# caller drops what is not finite or beyond MAX_PLOTTED); series and category names are text.


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample std (0 for one value); values near the float limit give inf/nan, never
    OverflowError (``x ** 2`` raises where ``x * x`` overflows to inf)."""
    m = sum(values) / len(values)        # not math.fsum: it raises on intermediate overflow
    var = sum((v - m) * (v - m) for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return m, math.sqrt(var) if var == var and var >= 0 else float("nan")


def _short(text: str, n: int = 28) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _threshold_line(ax: Any, hline: tuple[float, str] | None) -> None:
    if hline is not None:
        ax.axhline(hline[0], color="#c62828", lw=1.0, ls="--", alpha=0.8, label=hline[1])


def errorbar_png(groups: Mapping[str, Mapping[Any, Sequence[float]]], xlabel: str, ylabel: str, title: str, *,
                 logx: bool = False, hline: tuple[float, str] | None = None) -> bytes:
    """One line per series: mean +- std of its values at each x. ``groups``: series -> x -> values
    (x numbers); ``hline``: (y, label) drawn dashed (a threshold)."""
    fig = Figure(figsize=(6.4, 3.8), dpi=_DPI, facecolor="white", layout="constrained")
    ax = fig.add_subplot()
    for name, points in sorted(groups.items()):
        xs = sorted(points)
        stats = [mean_std(list(points[x])) for x in xs]
        ax.errorbar(xs, [m for m, _ in stats], yerr=[s for _, s in stats], marker="o", ms=4, lw=1.4, capsize=3,
                    label=_short(str(name), 40))
    _threshold_line(ax, hline)
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
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8)
    return png_bytes(fig)


def bars_png(groups: Mapping[str, Mapping[str, Sequence[float]]], ylabel: str, title: str, *,
             order: Sequence[str] | None = None, hline: tuple[float, str] | None = None) -> bytes:
    """Grouped bars: mean +- std of each series' values per category. ``groups``: series ->
    category -> values; ``order``: the categories left to right (default: "none" first, then
    sorted)."""
    cats = list(order) if order is not None else sorted({c for points in groups.values() for c in points},
                                                        key=lambda c: (c != "none", c))
    names = sorted(groups)
    fig = Figure(figsize=(6.4, 3.8), dpi=_DPI, facecolor="white", layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        xs, ys, es = [], [], []
        for j, c in enumerate(cats):
            if c in groups[name] and groups[name][c]:
                m, s = mean_std(list(groups[name][c]))
                xs.append(j + (i - (len(names) - 1) / 2) * width)
                ys.append(m)
                es.append(s)
        ax.bar(xs, ys, width=width, yerr=es, capsize=3, label=_short(str(name), 40))
    _threshold_line(ax, hline)
    ax.set_xticks(range(len(cats)))
    ax.set_xticklabels([_short(c, 18) for c in cats], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    if ax.get_legend_handles_labels()[0] and (len(names) > 1 or hline is not None):
        ax.legend(loc="best", fontsize=8)
    return png_bytes(fig)


def scatter_png(points: Mapping[str, Sequence[tuple[float, float]]], xlabel: str, ylabel: str, title: str, *,
                diagonal: bool = False, threshold: float | None = None) -> bytes:
    """One colour per series of (x, y) points; ``diagonal``: the y = x line (no change);
    ``threshold``: dashed lines at that value on both axes."""
    fig = Figure(figsize=(6.4, 3.8) if not diagonal else (5.2, 4.6), dpi=_DPI, facecolor="white",
                 layout="constrained")
    ax = fig.add_subplot()
    for name, xy in sorted(points.items()):
        ax.scatter([x for x, _ in xy], [y for _, y in xy], s=22, alpha=0.85, label=_short(str(name), 40))
    every = [v for xy in points.values() for p in xy for v in p]
    if diagonal and every:
        lo, hi = min(every), max(every)
        pad = 0.05 * (hi - lo) if hi > lo else 1.0
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="#888", lw=1, ls=":", label="no change")
    if threshold is not None:
        ax.axhline(threshold, color="#c62828", lw=1.0, ls="--", alpha=0.8)
        ax.axvline(threshold, color="#c62828", lw=1.0, ls="--", alpha=0.8, label=f"leak threshold {threshold:g} dB")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8)
    return png_bytes(fig)


#: The verdict colours of the dashboards (gradleak.report.risk's badges).
VERDICT_COLOURS = {"leaked": "#c62828", "defended": "#2e7d32", "inconclusive": "#b26a00", "failed": "#555555",
                   "skipped": "#9e9e9e"}


def verdict_bars_png(counts: Mapping[str, Mapping[str, int]], order: Sequence[str], ylabel: str, title: str, *,
                     xlabel: str = "cells") -> bytes:
    """Horizontal stacked bars: for each category (top to bottom in ``order``) how many updates
    (``xlabel``) got each verdict (``counts``: category -> verdict -> n), coloured as the badges."""
    n = max(1, len(order))
    fig = Figure(figsize=(5.2, min(1.3 + 0.42 * n, 9.0)), dpi=_DPI, facecolor="white", layout="constrained")
    ax = fig.add_subplot()
    ys = list(range(n))[::-1]
    left = [0.0] * n
    for verdict, colour in VERDICT_COLOURS.items():
        widths = [float(counts.get(c, {}).get(verdict, 0)) for c in order]
        if any(widths):
            ax.barh(ys, widths, left=left, color=colour, label=verdict, height=0.62)
            for y, l0, w in zip(ys, left, widths, strict=True):
                if w:
                    ax.text(l0 + w / 2, y, f"{int(w)}", ha="center", va="center", color="white", fontsize=8,
                            fontweight="bold")
            left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_yticks(ys)
    ax.set_yticklabels([_short(str(c), 24) for c in order], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(True, axis="x", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        fig.legend(loc="outside lower center", ncol=5, fontsize=8, frameon=False)
    return png_bytes(fig)
