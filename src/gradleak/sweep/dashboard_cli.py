"""`gradleak dashboard`'s flags and command: the dashboard (gradleak.report.dashboard) given the
sweep stores to read (:func:`sweep_stores`). The dashboard sits in the report, below the sweeps,
and never imports them; this module, at the sweeps' level, hands it their store."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DataError
from ..paths import one_line

if TYPE_CHECKING:
    from ..report.dashboard import StoreAccess


def add_dashboard_parser(sub: Any) -> None:
    d = sub.add_parser("dashboard", help="one self-contained HTML risk report of a sweep, an experiment or a Flower "
                                         "audit (or a comparison of two)")
    d.add_argument("dir", help="sweep --out folder (results.sqlite), experiment --out folder (cells/), "
                               "audit-flower --out folder (audit.csv) or a folder of attack runs (e.g. runs/)")
    d.add_argument("--compare", default=None, metavar="OTHER",
                   help="compare DIR (A, e.g. before a defense) with this folder of the same kind (B, after): one "
                        "page of matched cells or client updates, verdict changes and PSNR deltas "
                        "(default page DIR/comparison.html)")
    d.add_argument("--out", default=None, help="page to write (default DIR/dashboard.html); an existing file "
                                               "is replaced only if it is an earlier dashboard page")
    d.set_defaults(func=cmd_dashboard)


def cmd_dashboard(args: Any) -> int:
    for folder in (args.dir, getattr(args, "compare", None)):
        if folder is not None and not os.path.lexists(folder):   # the common mistake, answered at once
            raise DataError(f"sweep folder {one_line(str(Path(folder)))} does not exist")
    from ..errors import sigterm_as_interrupt
    from ..report.dashboard import render_dashboard
    from ..report.run_page import display_name

    with sigterm_as_interrupt():   # SIGTERM: the page is left as it was, no temporary file (exit 143)
        path = render_dashboard(args.dir, args.out, compare=getattr(args, "compare", None), stores=sweep_stores())
    print(f"wrote {display_name(path, full=True)}")
    return 0


def sweep_stores() -> StoreAccess:
    """How the dashboard finds a sweep's store (results.sqlite, also an experiment's cells/), reads
    it (store.read_cells: checked whole) and which of a sweep folder's files a page never replaces."""
    from ..report.dashboard import StoreAccess
    from .store import STORE_FILES, STORE_NAME, read_cells

    return StoreAccess(name=STORE_NAME, files=STORE_FILES, read=read_cells)


__all__ = ["add_dashboard_parser", "cmd_dashboard", "sweep_stores"]
