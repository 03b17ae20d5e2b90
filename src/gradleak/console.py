"""What the commands print on a terminal: tables that fit its width or wrap (no cell is ever cut),
and notices said once per output folder. Imports nothing heavy, so ``gradleak --help`` stays fast."""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# rich's Table: one space of padding each side of a cell and one border character between
# columns and at both edges.
_CELL_PADDING = 2

# The marker of a notice already said in an output folder (``notice_once``); it holds the
# notice's text, so a different notice (another reason) is said again.
NOTICE_MARKER = ".gradleak-notice-{key}"
_MAX_MARKER_BYTES = 4096


def format_value(v: Any) -> str:
    """A table cell: floats with 3 decimals (scientific below 1e-2 or from 1e5), None empty."""
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.3e}" if (v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e5)) else f"{v:.3f}"
    return str(v)


def _min_width(texts: Sequence[str]) -> int:
    """The narrowest a column can be while wrapping its texts only at spaces."""
    return max((len(word) for t in texts for line in t.splitlines() for word in line.split()), default=1)


def fits(headers: Sequence[str], cells: Sequence[Sequence[str]], width: int) -> bool:
    """Whether a table of ``headers`` and rows ``cells`` fits ``width`` columns when every cell
    wraps at spaces only (each column as wide as its longest word)."""
    need = sum(_min_width([h, *(row[i] for row in cells)]) + _CELL_PADDING for i, h in enumerate(headers))
    return need + len(headers) + 1 <= width


def _widths(headers: Sequence[str], cells: Sequence[Sequence[str]], width: int) -> list[int | None]:
    """Column widths for a table that :func:`fits` ``width``: None (rich's own) when every text
    fits on one line; else each column its longest word plus a share of the room left in
    proportion to how much its texts would use (rich's own narrowing can cut a word in two)."""
    texts = [[h, *(row[i] for row in cells)] for i, h in enumerate(headers)]
    room = width - len(headers) - 1 - _CELL_PADDING * len(headers)
    longest = [max(len(line) for t in col for line in (t.splitlines() or [""])) for col in texts]
    if sum(longest) <= room:
        return [None] * len(headers)
    least = [_min_width(col) for col in texts]
    want = [max(0, a - b) for a, b in zip(longest, least, strict=True)]
    spare, total = room - sum(least), sum(want) or 1
    return [b + spare * w // total for b, w in zip(least, want, strict=True)]


def markdown_table(columns: Sequence[str], cells: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


def print_table(console: Any, columns: Sequence[str], rows: Sequence[Mapping[str, Any] | Sequence[Any]], *,
                title: str | None = None, headers: Sequence[str] | None = None) -> None:
    """Print ``rows`` (dicts keyed by ``columns``, or sequences in their order) on ``console``
    (a rich Console) so that nothing is cut: a rich table whose cells wrap at spaces when it
    fits the console's width that way, else the plain Markdown table (the same text as the
    results files; the terminal wraps its long lines, nothing is lost). ``headers``: what the
    rich table shows above each column (default: the column names with ``_`` as spaces, so a
    header can wrap); the Markdown table always shows the column names."""
    from rich.table import Table

    cells = [[format_value(r.get(c)) if isinstance(r, Mapping) else format_value(r[i]) for i, c in enumerate(columns)]
             for r in rows]
    shown = list(headers) if headers is not None else [c.replace("_", " ") for c in columns]
    if not fits(shown, cells, console.width):
        if title:
            console.print(title, markup=False, highlight=False)
        console.print(markdown_table(list(columns), cells), markup=False, highlight=False, soft_wrap=True)
        return
    table = Table(title=title)
    for h, width in zip(shown, _widths(shown, cells, console.width), strict=True):
        table.add_column(h, width=width, overflow="fold")   # fold, never "..."
    for row in cells:
        table.add_row(*row)
    console.print(table, markup=False, highlight=False)


def notice_once(root: str | os.PathLike[str] | None, key: str, text: str) -> bool:
    """Whether to say ``text`` now: False when it was already said for the output folder
    ``root`` (a marker file ``root/.gradleak-notice-KEY`` holding the same text), else True,
    and the marker is written so that the next run into ``root`` stays quiet. Fails open: when
    ``root`` is None, is not a folder, or the marker cannot be read or written, the notice is
    said (a notice is never lost because of the marker)."""
    if root is None:
        return True
    folder = Path(root)
    marker = folder / NOTICE_MARKER.format(key=key)
    data = text.encode("utf-8", "replace")
    try:
        # O_NOFOLLOW: a planted link is not read through; a folder or FIFO there is not ours.
        fd = os.open(marker, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            if _is_regular(fd) and os.read(fd, _MAX_MARKER_BYTES + 1) == data:
                return False
        finally:
            os.close(fd)
    except OSError:
        pass
    if folder.is_dir():
        from .paths import atomic_write_bytes

        try:
            atomic_write_bytes(marker, data)   # mkstemp + rename: a planted link is replaced, not followed
        except OSError:
            pass
    return True


def _is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


__all__ = ["NOTICE_MARKER", "fits", "format_value", "markdown_table", "notice_once", "print_table"]
