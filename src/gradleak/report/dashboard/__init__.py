"""The dashboard: one self-contained HTML risk report of a sweep, an experiment, a Flower audit or a
folder of runs (or a comparison of two); `gradleak dashboard`.

* :mod:`.data`: what a folder holds, as judged items (reading a sweep store through the
  :class:`~.data.StoreAccess` the caller hands in: the sweeps sit above the report);
* :mod:`.pages`: the page of one folder; :mod:`.compare`: the page comparing two;
* :mod:`.render`: checks the target, writes the page atomically (:func:`render_dashboard`).

The command (flags, and the sweep stores handed in) is gradleak.sweep.dashboard_cli.
"""

from gradleak.report.dashboard.data import StoreAccess
from gradleak.report.dashboard.render import (GENERATOR, LEAKED_DB, check_dashboard_target, read_audit,
                                              render_dashboard, stale_page_temps, write_dashboard_page)

__all__ = ["GENERATOR", "LEAKED_DB", "StoreAccess", "check_dashboard_target", "read_audit", "render_dashboard",
           "stale_page_temps", "write_dashboard_page"]
