"""The dashboard: one self-contained HTML risk report of a sweep, an experiment, a Flower audit or a
folder of runs (or a comparison of two); `gradleak dashboard`."""

from gradleak.report.dashboard.data import StoreAccess
from gradleak.report.dashboard.guard_page import read_guard
from gradleak.report.dashboard.render import (GENERATOR, LEAKED_DB, check_dashboard_target, read_audit,
                                              render_dashboard, stale_page_temps, write_dashboard_page)

__all__ = ["GENERATOR", "LEAKED_DB", "StoreAccess", "check_dashboard_target", "read_audit", "read_guard", "render_dashboard",
           "stale_page_temps", "write_dashboard_page"]
