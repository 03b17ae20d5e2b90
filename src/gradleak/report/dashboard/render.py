"""The dashboard's page (`gradleak dashboard DIR [--compare OTHER] [--out FILE]`): one
self-contained HTML page, a risk report: who leaks, how much, under which setting."""

from __future__ import annotations

import os
import re
import tempfile
import time
from html import escape
from pathlib import Path

from gradleak.errors import ConfigError, DataError
from gradleak.paths import HOST, one_line, process_alive
from gradleak.report.dashboard.compare import compare_body
from gradleak.report.dashboard.data import EXPERIMENT_CELLS, MAX_AUDIT_BYTES, Cell, Source, StoreAccess, cell_verdict
from gradleak.report.dashboard.folders import load_source, read_audit
from gradleak.report.dashboard.audit_page import audit_body
from gradleak.report.dashboard.guard_page import guard_body
from gradleak.report.dashboard.pages import MAX_TABLE_ROWS, sweep_body
from gradleak.report.run_page import check_folder, display_name
from gradleak.report.page import html_page
from gradleak.report.risk import CSS, LEAK_THRESHOLD_DB, LEAKED, notice

# Written on every dashboard page, early: an existing --out file is replaced only if it holds it.
GENERATOR = "gradleak dashboard"
# A cell rebuilt the data when its mean PSNR reaches this (gradleak.report.risk.LEAK_THRESHOLD_DB,
# the experiments' success threshold: MSE 0.01 on [0, 1] pixels).
LEAKED_DB = LEAK_THRESHOLD_DB
DEFAULT_PAGE = "dashboard.html"
DEFAULT_COMPARISON = "comparison.html"
# Files of a data folder a page may never replace (besides the store's): audits' and experiments'.
_OWN_FILES = ("audit.csv", "audit.json", "experiment.json", "results.md", "summary.csv", "guard.csv", "federation.json")

__all__ = ["GENERATOR", "LEAKED_DB", "MAX_AUDIT_BYTES", "MAX_TABLE_ROWS",
           "check_dashboard_target", "render_dashboard", "read_audit", "stale_page_temps", "write_dashboard_page"]


def _rebuilt(r: Cell) -> bool:
    """Whether a cell rebuilt the data (mean PSNR >= LEAKED_DB), whatever its attack's verdict."""
    v = cell_verdict(r)
    return v.label == LEAKED and v.truth


# ------------------------------------------------------------------ entry point
def _is_dashboard(path: Path) -> bool:
    """Whether ``path`` holds a page this command wrote (the generator mark near the top)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(16384)
    except OSError:
        return False
    return head.lstrip().startswith(b"<!DOCTYPE html>") and GENERATOR.encode() in head


def _data_files(folder: Path, stores: StoreAccess) -> list[tuple[str, Path]]:
    out = [(f"the folder's {name}", folder / name) for name in (*stores.files, *_OWN_FILES)]
    out += [(f"the folder's {EXPERIMENT_CELLS}/{name}", folder / EXPERIMENT_CELLS / name) for name in stores.files]
    return out


def check_dashboard_target(folder: Path, out: str | os.PathLike[str] | None, *, stores: StoreAccess,
                           others: tuple[Path, ...] = (), default: str = DEFAULT_PAGE) -> Path:
    """Where the page goes, checked before anything is read: a file path (not a folder, link or
    device, in a folder that can be written, a UTF-8 name), never one of the data files of
    ``folder`` or ``others`` (``stores.files``, audit.csv, an experiment's outputs), and if it
    exists, a page an earlier dashboard wrote (nothing else is replaced)."""
    from gradleak.paths import check_distinct, check_output_file

    what = "--out" if out is not None else "dashboard page"
    target = check_output_file(out if out is not None else folder / default, what)
    for f in (folder, *others):
        for name, path in _data_files(f, stores):
            check_distinct((what, target), (name, path))
    if target.exists() and not _is_dashboard(target):
        raise ConfigError(f"{what} {target} exists and is not a page gradleak dashboard wrote; "
                          "choose a new file name (nothing else is replaced)")
    return target


def _page(title: str, subtitle: str, body: str) -> str:
    """The page: ``title`` and ``subtitle`` as text (escaped here), ``body`` HTML."""
    return html_page(escape(title), escape(subtitle), body, css=CSS, generator=GENERATOR, script=SORT_AND_FILTER)


# Sorting and filtering: a click on a column's header sorts that table by it (numbers as
# numbers; again: the other way); a table whose rows carry two verdicts or more gets a "show"
# selector above it. The only script on the page, allowed by its hash in the Content-Security-
# Policy (report/page.py script_csp); it reads the tables' text and loads nothing.
SORT_AND_FILTER = """(function () {
  function text(row, i) { var c = row.cells[i]; return c ? c.textContent.trim() : ""; }
  function key(s) { var n = parseFloat(s.replace(/[^0-9eE+.-]/g, "")); return isNaN(n) ? null : n; }
  document.querySelectorAll("table").forEach(function (table) {
    var head = table.rows[0];
    if (!head || table.rows.length < 3) { return; }
    Array.prototype.forEach.call(head.cells, function (th, i) {
      th.classList.add("sortable");
      th.title = "sort by this column";
      th.addEventListener("click", function () {
        var dir = th.getAttribute("data-sort") === "asc" ? -1 : 1;
        th.setAttribute("data-sort", dir === 1 ? "asc" : "desc");
        var rows = Array.prototype.slice.call(table.rows, 1);
        rows.sort(function (a, b) {
          var x = text(a, i), y = text(b, i), nx = key(x), ny = key(y);
          if (nx !== null && ny !== null) { return dir * (nx - ny); }
          return dir * x.localeCompare(y);
        });
        rows.forEach(function (r) { r.parentNode.appendChild(r); });
      });
    });
    var kinds = {};
    Array.prototype.slice.call(table.rows, 1).forEach(function (r) {
      var m = /(?:^| )r-([a-z]+)/.exec(r.className); if (m) { kinds[m[1]] = true; }
    });
    var names = Object.keys(kinds);
    if (names.length < 2) { return; }
    var select = document.createElement("select");
    select.className = "verdict-filter";
    ["all"].concat(names.sort()).forEach(function (n) {
      var o = document.createElement("option");
      o.value = n; o.textContent = n === "all" ? "show all" : "show " + n;
      select.appendChild(o);
    });
    select.addEventListener("change", function () {
      Array.prototype.slice.call(table.rows, 1).forEach(function (r) {
        r.style.display = select.value === "all" || r.classList.contains("r-" + select.value) ? "" : "none";
      });
    });
    var box = table.closest(".scroll") || table;
    box.parentNode.insertBefore(select, box);
  });
})();"""


def _title(src: Source, store_name: str) -> tuple[str, str]:
    name = display_name(src.folder)
    if src.kind == "audit":
        return f"Flower audit: {name}", "gradleak dashboard · leakage per client and round (from audit.csv)"
    if src.kind == "experiment":
        what = f"Experiment {src.experiment}" if src.experiment else "Experiment"
        return f"{what}: {name}", f"gradleak dashboard · from {EXPERIMENT_CELLS}/{store_name}"
    if src.kind == "guard":
        return f"Guard: {name}", "gradleak dashboard · what each client's guard decided per round (from guard.csv)"
    if src.kind == "runs":
        return f"Runs: {name}", f"gradleak dashboard · {len(src.records)} gradleak attack run folders"
    return f"Sweep: {name}", f"gradleak dashboard · from {store_name}"


def links_note(src: Source) -> str:
    """A notice of the symbolic links the folder's scan did not follow ("" when none): a page shows
    only what its folder holds, and says what it left out."""
    if not src.links_skipped:
        return ""
    names = ", ".join(one_line(n, 80) for n in src.links_skipped[:5])
    more = f" (+{len(src.links_skipped) - 5} more)" if len(src.links_skipped) > 5 else ""
    return notice(f"{len(src.links_skipped)} symbolic link(s) in {display_name(src.folder)} not followed: {names}"
                  f"{more}. A dashboard shows only what its folder holds and never follows a link.")


def render_dashboard(folder: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, *,
                     compare: str | os.PathLike[str] | None = None, stores: StoreAccess) -> Path:
    """Write DIR/dashboard.html (or ``out``) from DIR's results.sqlite, cells/results.sqlite (an
    experiment), audit.csv or run folders; with ``compare``, DIR/comparison.html (or ``out``)
    comparing DIR (A) with that folder (B). ``stores``: how sweep stores are found and read
    (gradleak.sweep.dashboard_cli.sweep_stores(); the report does not import the sweeps).

    Checks first, before reading anything: the folders are folders; ``out`` is a file path that
    is not one of their data files and, if it exists, an earlier dashboard page. Then each store
    is validated whole (every row), so a damaged store is one DataError naming it and row, and
    the page is written atomically: a failure leaves the previous page (or nothing) in place.
    """
    folder = Path(folder)
    check_folder(folder, "sweep folder", "give the --out folder of a sweep, an experiment or a Flower audit")
    other = Path(compare) if compare is not None else None
    if other is not None:
        check_folder(other, "--compare folder", "give the --out folder of a sweep, an experiment or a Flower audit")
    target = check_dashboard_target(folder, out, stores=stores, others=(other,) if other is not None else (),
                                    default=DEFAULT_COMPARISON if other is not None else DEFAULT_PAGE)
    src = load_source(folder, stores)
    src.page_dir = target.parent
    if other is None:
        title, subtitle = _title(src, stores.name)
        body = audit_body(src) if src.kind == "audit" else guard_body(src) if src.kind == "guard" else sweep_body(src)
        return write_dashboard_page(target, _page(title, subtitle, links_note(src) + body))
    b = load_source(other, stores)
    body = links_note(src) + links_note(b) + compare_body(src, b)
    title = f"Comparison: {display_name(src.folder)} (A) vs {display_name(b.folder)} (B)"
    return write_dashboard_page(target, _page(title, "gradleak dashboard · A = DIR, B = --compare; Δ = B − A", body))


# ------------------------------------------------------------------ writing the page
# A temporary file older than this, of the unnamed form (no process id), was abandoned: writing
# a page takes well under a second.
ABANDONED_SECONDS = 3600
_NAME_MAX = 255
_OURS = re.compile(r"(?P<host>[A-Za-z0-9_-]+)-(?P<pid>\d+)-[a-z0-9_]{8}\.tmp")
_UNNAMED = re.compile(r"[a-z0-9_]{8}\.tmp")


def _temp_stem(target: Path) -> str:
    """``.<page name>.``, the name cut (whole UTF-8 characters) so that the temporary file's
    name fits a 255-byte name limit with the host, the process id and mkstemp's 8 characters."""
    room = _NAME_MAX - len(f"..{HOST}-{2**22}-12345678.tmp")
    data = target.name.encode("utf-8", "surrogateescape")
    name = target.name if len(data) <= room else data[:room].decode("utf-8", "ignore")
    return f".{name}."


def stale_page_temps(target: Path) -> list[Path]:
    """Temporary files of the page ``target`` that no running writer owns: ``.<page>.<host>-
    <pid>-<random>.tmp`` of a process of this host that no longer runs, and the unnamed
    ``.<page>.<random>.tmp`` (gradleak.paths.atomic_write_bytes, older dashboards) untouched
    for :data:`ABANDONED_SECONDS`."""
    stem = _temp_stem(target)
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return []
    stale = []
    now = time.time()
    for entry in entries:
        if not entry.name.startswith(stem) or not entry.is_file(follow_symlinks=False):
            continue
        rest = entry.name[len(stem):]
        ours = _OURS.fullmatch(rest)
        if ours is not None:
            if ours["host"] == HOST and not process_alive(int(ours["pid"])):
                stale.append(Path(entry.path))
        elif _UNNAMED.fullmatch(rest):
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime > ABANDONED_SECONDS:
                    stale.append(Path(entry.path))
            except OSError:
                pass
    return stale


def write_dashboard_page(target: Path, page: str) -> Path:
    """Write the page atomically (a temporary file beside it, renamed onto it when complete; a
    link planted next to it is never followed): a failure, Ctrl-C or SIGTERM (under
    :func:`~gradleak.errors.sigterm_as_interrupt`) leaves the previous page (or none) and
    no temporary file. First removes the temporary files killed writers left (:func:`stale_page_temps`)."""
    for stale in stale_page_temps(target):
        try:
            stale.unlink()
        except OSError:
            pass
    data = page.encode("utf-8")
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f"{_temp_stem(target)}{HOST}-{os.getpid()}-",
                                   suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        raise DataError(f"{one_line(str(target))} cannot be written: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return target


