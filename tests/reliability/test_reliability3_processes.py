"""Processes, signals and bounded output (reliability issue, part 3):

* the workers a command starts (Ray tasks and actors, the sweep's process pool) never import
  modules from the folder the command was started in (nor from the driver script's folder);
* a failed `audit-flower` leaves nothing in --out (staged like `attack`), so its rerun works;
* SIGTERM while a command writes leaves no temporary file, and a rerun removes what a killed
  writer left (the dashboard's page, the sweep's results.csv, the audit's staging folder);
* errors of any size are shown cut to one bounded line, once (dashboard, results.csv, console);
  the store keeps them whole.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gradleak.cli import main

# The installed console script, as a user starts it: its sys.path[0] is the script's folder
# (not the working folder), so whatever a worker imports from the working folder, the worker
# put there itself. (`python -m gradleak.cli` would put the working folder on the driver's path;
# `python -P` would hand -P to the pool's children and hide the bug.)
GRADLEAK = str(Path(sys.executable).parent / "gradleak")
TINY = {"attack": "dlg", "model": "lenet-dlg", "iterations": 3, "paper_metrics": False, "threads": 1}
PLANTED = ("click", "multiprocessing", "gradleak", "gradleak_planted_probe")


@pytest.fixture
def one_ray():
    """The lock tests/conftest.py takes around tests that start Ray (one Ray at a time on 2 cores)."""
    from conftest import ray_lock

    with ray_lock():
        yield


def _plant(folder: Path, names: tuple[str, ...] = PLANTED) -> None:
    """Modules a worker would import if the folder were on its path: each leaves a mark
    (PLANTED-<name>, with the importing process's id) and fails the import."""
    body = textwrap.dedent("""\
        import os
        with open(os.path.join({folder!r}, "PLANTED-{name}"), "a") as fh:
            fh.write(str(os.getpid()) + "\\n")
        raise ImportError("planted {name} was imported from the working folder")
        """)
    for name in names:
        if name == "gradleak":   # a package: what `import gradleak...` in a worker finds first
            (folder / name).mkdir()
            (folder / name / "__init__.py").write_text(body.format(folder=str(folder), name=name))
        else:
            (folder / f"{name}.py").write_text(body.format(folder=str(folder), name=name))


def _marks(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in folder.glob("PLANTED-*")}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for key in ("PYTHONSAFEPATH", "PYTHONPATH", "PYTHONWARNINGS"):
        env.pop(key, None)
    env["FLWR_TELEMETRY_ENABLED"] = "0"
    return env


def _spec(path: Path, seeds: int = 1, **base) -> Path:
    fields = {**TINY, **base}
    path.write_text("base: {" + ", ".join(f"{k}: {v}" for k, v in fields.items()) + "}\n"
                    f"grid:\n  seed: [{', '.join(str(s) for s in range(seeds))}]\n")
    return path


def _cells(out: Path) -> list[dict[str, str]]:
    with open(out / "results.csv", newline="") as fh:
        return list(csv.DictReader(fh))


# ------------------------------------------------------------------ 1. workers and the working folder
@pytest.mark.timeout(180)
def test_ray_workers_do_not_import_from_the_drivers_folder(tmp_path, one_ray):
    """A driver script run from its own folder (`python driver.py`: the script's folder is the
    working folder and on the driver's path): a Ray task started through gradleak.localray
    does not find a module of that folder (the driver itself does: its own choice)."""
    _plant(tmp_path, ("gradleak_planted_probe",))
    (tmp_path / "driver.py").write_text(textwrap.dedent("""\
        import importlib, sys
        import ray
        from gradleak.localray import local_ray
        with local_ray(1):
            try:
                ray.get(ray.remote(importlib.import_module).remote("gradleak_planted_probe"))
                print("IMPORTED")
            except ray.exceptions.RayTaskError as exc:
                print("NOT-FOUND" if "No module named 'gradleak_planted_probe'" in str(exc) else "OTHER: " + str(exc))
        """))
    proc = subprocess.run([sys.executable, "driver.py"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _marks(tmp_path) == {} and proc.stdout.strip().splitlines()[-1] == "NOT-FOUND", proc.stdout[-2000:]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("executor", ["ray", "local"])
def test_sweep_workers_do_not_import_from_the_working_folder(executor, tmp_path, one_ray):
    """`gradleak sweep` started in a folder holding click.py, multiprocessing.py, gradleak/ ...:
    neither Ray's workers nor the process pool's (spawned with `python -c`, whose path starts
    with the working folder) import them; the sweep runs its cell."""
    _plant(tmp_path)
    _spec(tmp_path / "spec.yaml")
    proc = subprocess.run([GRADLEAK, "sweep", "spec.yaml", "--out", "sw", "--executor", executor, "--workers", "1",
                           "--no-progress"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=200)
    assert _marks(tmp_path) == {}, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _cells(tmp_path / "sw")
    assert len(rows) == 1 and rows[0]["cell_status"] == "ok", rows


@pytest.mark.timeout(300)
def test_audit_flower_workers_do_not_import_from_the_working_folder(tmp_path, one_ray):
    """The red team's case: click.py in the folder where `gradleak audit-flower` starts (Flower's
    client actors import click through typer)."""
    _plant(tmp_path)
    proc = subprocess.run([GRADLEAK, "audit-flower", "--rounds", "1", "--clients", "2", "--attack", "idlg",
                           "--iterations", "2", "--out", "audit"], cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=280)
    assert _marks(tmp_path) == {}, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "audit" / "audit.csv")))
    assert len(rows) == 2 and all(r["status"] == "ok" for r in rows), rows


def test_pool_children_get_a_safe_path_and_the_environment_is_given_back(monkeypatch):
    """The process pool's children start with PYTHONSAFEPATH=1 (no working folder at the head of
    their sys.path); the parent's environment is what it was once the executor is done."""
    import multiprocessing.spawn

    from gradleak.sweep.executors import run_cells

    monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
    seen = []
    real = multiprocessing.spawn.get_command_line

    def spy(**kwargs):   # called in the parent as each child is started
        seen.append(os.environ.get("PYTHONSAFEPATH"))
        return real(**kwargs)

    monkeypatch.setattr(multiprocessing.spawn, "get_command_line", spy)
    spec = _spec_cells(2)
    done = list(run_cells(spec.cells, "local", workers=1))
    assert [r["status"] for _, r in done] == ["failed", "failed"]     # unknown attack: fails at once
    assert seen and set(seen) == {"1"} and "PYTHONSAFEPATH" not in os.environ


def _spec_cells(n: int):
    from gradleak.sweep import parse_spec

    return parse_spec({"base": {**TINY, "attack": "nope-attack"}, "grid": {"seed": list(range(n))}})


# ------------------------------------------------------------------ 2. a failed audit-flower
AUDIT = ["audit-flower", "--rounds", "1", "--clients", "2", "--attack", "idlg", "--iterations", "1"]


@pytest.fixture
def fake_federation(monkeypatch):
    """The example federation without Ray or Flower: ``mode["rows"]`` says how many of the
    expected audit rows the fake simulation logs, ``mode["raise"]`` an exception it raises after."""
    import contextlib

    import flwr.simulation

    import gradleak.audit.example as example
    import gradleak.localray

    mode: dict = {"rows": 0, "raise": None}
    auditors = []
    real_server_app = example.server_app

    def spy_server_app(s, auditor, result, *args, **kwargs):
        auditors.append(auditor)
        return real_server_app(s, auditor, result, *args, **kwargs)

    def fake_run_simulation(**kwargs):
        auditor = auditors[-1]
        for client in range(mode["rows"]):
            auditor.log_failure(1, str(client), "not attacked (fake federation)")
        if mode["raise"] is not None:
            raise mode["raise"]

    @contextlib.contextmanager
    def no_ray(num_cpus, **kwargs):
        yield

    monkeypatch.setattr(example, "server_app", spy_server_app)
    monkeypatch.setattr(flwr.simulation, "run_simulation", fake_run_simulation)
    monkeypatch.setattr(gradleak.localray, "local_ray", no_ray)
    return mode


def test_failed_audit_flower_leaves_nothing_and_its_rerun_works(tmp_path, capsys, fake_federation):
    out = tmp_path / "audit"
    # the federation ends with updates missing (an error of the run: exit 2)
    fake_federation.update(rows=1, **{"raise": None})
    assert main([*AUDIT, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "without every client's update being audited" in err and "already exists" not in err
    assert not os.path.lexists(out) and sorted(os.listdir(tmp_path)) == []
    # the federation crashes mid-run (any exception)
    fake_federation.update(rows=1, **{"raise": RuntimeError("boom")})
    with pytest.raises(RuntimeError, match="boom"):
        main([*AUDIT, "--out", str(out)])
    assert sorted(os.listdir(tmp_path)) == []
    # the same command again, complete this time: the result is there, whole
    fake_federation.update(rows=2, **{"raise": None})
    assert main([*AUDIT, "--out", str(out)]) == 0, capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["audit"]
    assert sorted(os.listdir(out)) == ["audit.csv", "audit.json"]
    assert len(list(csv.DictReader(open(out / "audit.csv")))) == 2
    doc = json.loads((out / "audit.json").read_text())
    assert doc["settings"]["out"] == str(out)     # the folder it is in, not the staging folder
    capsys.readouterr()


def test_interrupted_audit_flower_leaves_nothing(tmp_path, capsys, fake_federation):
    out = tmp_path / "nested" / "audit"
    fake_federation.update(rows=1, **{"raise": KeyboardInterrupt()})
    assert main([*AUDIT, "--out", str(out)]) == 130
    assert sorted(os.listdir(tmp_path)) == []          # the parent it created is gone too
    capsys.readouterr()


# ------------------------------------------------------------------ 3. signals while writing
def _sweep_folder(folder: Path, error: str = "DataError: boom") -> Path:
    """A sweep folder with one failed cell (no attack run)."""
    from gradleak.sweep import ResultStore

    folder.mkdir(parents=True, exist_ok=True)
    with ResultStore(folder) as store:
        store.add("0123456789abcdef", {"seed": 0}, {**TINY, "seed": 0},
                  {"status": "failed", "metrics": None, "error": error, "wall_seconds": 0.1, "worker": "w"})
    return folder


def _child_dying_at_replace(code: str, name: str, sig: int, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a child python whose os.replace sends the child ``sig`` when it is about to
    rename a temporary file onto ``name`` (the file is then written, not yet in place)."""
    prog = textwrap.dedent(f"""\
        import os, signal, sys, time
        real = os.replace
        def replace(src, dst, *a, **k):
            if os.path.basename(os.fspath(dst)) == {name!r}:
                os.kill(os.getpid(), {int(sig)})
                time.sleep(20)
            return real(src, dst, *a, **k)
        os.replace = replace
        """) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", prog], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=120)


def _temps(folder: Path, name: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f".{name}.") and p.name.endswith(".tmp"))


def test_dashboard_sigterm_while_writing_leaves_no_temporary_file(tmp_path):
    folder = _sweep_folder(tmp_path / "sw")
    proc = _child_dying_at_replace(f"""
        from gradleak.cli import main
        sys.exit(main(["dashboard", {str(folder)!r}]))
        """, "dashboard.html", signal.SIGTERM, tmp_path)
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, proc.stderr[-3000:])
    assert _temps(folder, "dashboard.html") == [] and not (folder / "dashboard.html").exists()
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "SIGTERM" in lines[0], proc.stderr[-3000:]


def test_dashboard_rerun_removes_what_a_killed_writer_left(tmp_path):
    folder = _sweep_folder(tmp_path / "sw")
    proc = _child_dying_at_replace(f"""
        from gradleak.cli import main
        sys.exit(main(["dashboard", {str(folder)!r}]))
        """, "dashboard.html", signal.SIGKILL, tmp_path)
    assert proc.returncode == -signal.SIGKILL
    left = _temps(folder, "dashboard.html")
    assert len(left) == 1                                  # SIGKILL: nobody could clean up
    # an older writer's temporary file (no process id in its name), long abandoned
    old = folder / ".dashboard.html.k3j5x_9q.tmp"
    old.write_text("<!DOCTYPE html> half")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert main(["dashboard", str(folder)]) == 0
    assert _temps(folder, "dashboard.html") == [] and (folder / "dashboard.html").is_file()


def test_dashboard_keeps_the_temporary_file_of_a_live_writer(tmp_path):
    from gradleak.report.dashboard import stale_page_temps

    folder = _sweep_folder(tmp_path / "sw")
    page = folder / "dashboard.html"
    fresh = folder / ".dashboard.html.a1b2c3d4.tmp"      # an older writer's name, written just now
    fresh.write_text("x")
    live = folder / f".dashboard.html.{_host()}-{os.getpid()}-abc123.tmp"   # this process's
    live.write_text("x")
    assert stale_page_temps(page) == []
    assert main(["dashboard", str(folder)]) == 0
    assert fresh.exists() and live.exists()


def _host() -> str:
    from gradleak.paths import HOST

    return HOST


def test_sweep_rerun_removes_the_csv_temporary_file_of_a_killed_sweep(tmp_path):
    spec = _spec(tmp_path / "spec.yaml", attack="nope-attack")   # the cell fails at once: no attack runs
    out = tmp_path / "sw"
    proc = _child_dying_at_replace(f"""
        from gradleak.sweep import load_spec, run_sweep
        run_sweep(load_spec({str(spec)!r}), {str(out)!r}, executor="inline", progress=False)
        """, "results.csv", signal.SIGKILL, tmp_path)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert len(_temps(out, "results.csv")) == 1
    from gradleak.sweep import load_spec, run_sweep

    run_sweep(load_spec(spec), out, executor="inline", progress=False)
    assert _temps(out, "results.csv") == [] and len(_cells(out)) == 1


def test_sweep_sigterm_while_writing_the_csv_leaves_no_temporary_file(tmp_path):
    spec = _spec(tmp_path / "spec.yaml", attack="nope-attack")
    out = tmp_path / "sw"
    proc = _child_dying_at_replace(f"""
        from gradleak.cli import main
        sys.exit(main(["sweep", {str(spec)!r}, "--out", {str(out)!r}, "--executor", "inline", "--no-progress"]))
        """, "results.csv", signal.SIGTERM, tmp_path)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]
    assert _temps(out, "results.csv") == []


@pytest.mark.timeout(300)
def test_audit_flower_sigterm_mid_federation_leaves_nothing(tmp_path, one_ray):
    """SIGTERM while the audit attacks the clients' updates: exit 143 within seconds, no crash
    trace (Ray's "*** SIGTERM received"), no --out and no staging folder left; the same
    command then runs."""
    cmd = [GRADLEAK, "audit-flower", "--rounds", "3", "--clients", "2", "--attack", "idlg", "--iterations", "300",
           "--out", "audit"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 200
        while not _audit_rows(tmp_path):
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no update audited in time"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGTERM)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=90)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "SIGTERM received" not in err and "PC: @" not in err, err[-3000:]
    assert took < 45, took
    assert sorted(os.listdir(tmp_path)) == [], os.listdir(tmp_path)


def _client_update(rounds: int = 1):
    """The example federation's model, the global weights and one client's trained weights."""
    from gradleak.audit.example import FederationSettings, build_example_model, client_batch, local_training

    s = FederationSettings(rounds=rounds, clients=2, examples=1, local_steps=1, batch_size=1, lr=0.05)
    global_weights = {k: v.clone() for k, v in build_example_model(s).module.state_dict().items()}
    model = build_example_model(s)
    model.module.load_state_dict(global_weights)
    local_training(model, client_batch(s, 0, 1), steps=1, batch_size=1, lr=0.05, private_seed=0)
    return s, global_weights, dict(model.module.state_dict())


def test_a_stopped_auditor_ends_its_attack_and_writes_nothing_more(tmp_path):
    """LeakageAuditor.stop() from another thread (the CLI's main thread on SIGTERM): the attack
    running in the audit's thread ends after its step, audit() raises AuditStopped (an Exception:
    Flower's ServerApp thread ends quietly), and audit.csv is left as it was."""
    import threading

    from gradleak.audit import AuditSettings, LeakageAuditor
    from gradleak.audit.auditor import AuditStopped
    from gradleak.audit.example import build_example_model
    from gradleak.fl.threats import ThreatModel

    s, g, c = _client_update()
    auditor = LeakageAuditor(build_example_model(s), AuditSettings(attack={"attack": "dlg", "iterations": 100_000},
                                                                   out=tmp_path / "a", local_lr=0.05))
    threat = ThreatModel(name="fedavg", local_steps=1, local_lr=0.05)
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(auditor.audit(1, "0", g, c, num_examples=1, threat=threat))
        except BaseException as exc:  # noqa: BLE001 - what the thread ended with
            outcome.append(exc)

    before = (tmp_path / "a" / "audit.csv").read_bytes()
    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 60
    while not auditor._sessions:          # the attack has started
        assert thread.is_alive() and time.monotonic() < deadline, outcome
        time.sleep(0.01)
    time.sleep(0.5)
    auditor.stop()
    thread.join(30)
    assert not thread.is_alive() and len(outcome) == 1 and isinstance(outcome[0], AuditStopped), outcome
    assert auditor.rows == [] and (tmp_path / "a" / "audit.csv").read_bytes() == before
    with pytest.raises(AuditStopped):     # and nothing more is audited or logged
        auditor.log_failure(1, "1", "late")
    assert auditor.rows == []


def test_the_servers_wait_for_replies_ends_when_stopped():
    """StoppableGrid: the ServerApp's wait for replies (600 s in the example) ends at once when
    the audit is stopped; without a stop it is the grid's own push-then-pull."""
    import threading
    from types import SimpleNamespace

    from gradleak.audit.auditor import AuditStopped
    from gradleak.audit.example import StoppableGrid

    class Grid:   # replies never come
        pull_interval = 0.05

        def push_messages(self, messages):
            return ["m1", "m2"]

        def pull_messages(self, ids):
            return []

        def get_node_ids(self):
            return [1, 2]

    stop = threading.Event()
    grid = StoppableGrid(Grid(), stop)
    assert grid.get_node_ids() == [1, 2]
    assert grid.send_and_receive(["a", "b"], timeout=0.2) == []          # the timeout, as flwr's
    threading.Timer(0.3, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(AuditStopped):
        grid.send_and_receive(["a", "b"], timeout=600)
    assert time.monotonic() - t0 < 5

    class Replying(Grid):
        def pull_messages(self, ids):
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)) for i in ids]

    replies = StoppableGrid(Replying(), threading.Event()).send_and_receive(["a", "b"], timeout=600)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m1", "m2"]


def _audit_rows(folder: Path) -> bool:
    for csv_path in [*folder.glob("audit/audit.csv"), *folder.glob(".audit.partial-*/audit.csv")]:
        try:
            if len(csv_path.read_text().splitlines()) >= 2:
                return True
        except OSError:
            pass
    return False


# ------------------------------------------------------------------ 4. huge errors
HUGE = 7 * 1024 * 1024


def test_dashboard_of_huge_errors_is_small_and_says_each_once(tmp_path):
    from gradleak.sweep import ResultStore

    folder = _sweep_folder(tmp_path / "sw", "DataError: " + "E" * HUGE + " THE-END")
    assert main(["dashboard", str(folder)]) == 0
    page = (folder / "dashboard.html").read_text()
    assert len(page) < 200_000, len(page)
    assert page.count("DataError: EEEE") == 1            # once, not in two tables
    with ResultStore(folder, create=False) as store:     # the store keeps it whole
        assert next(store.records()).error.endswith(" THE-END")


def test_audit_dashboard_cuts_huge_errors(tmp_path):
    folder = tmp_path / "audit"
    folder.mkdir()
    cols = ["round", "client", "attack", "status", "verdict", "error"]
    with open(folder / "audit.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        w.writerow([1, "0", "idlg", "failed", "failed", "GradleakError: " + "X" * 120_000])
    assert main(["dashboard", str(folder)]) == 0
    page = (folder / "dashboard.html").read_text()
    assert len(page) < 100_000 and page.count("GradleakError: XXX") == 1, len(page)


def test_sweep_csv_and_console_cut_huge_errors(tmp_path, monkeypatch):
    from rich.console import Console

    from gradleak.sweep import ResultStore, executors, load_spec, run_sweep

    def failing_cell(config, run_dir=None):
        return {"status": "failed", "metrics": None, "error": "DataError: " + "\n" * 3 + "E" * HUGE,
                "wall_seconds": 0.0, "worker": "w"}

    monkeypatch.setattr(executors, "run_cell", failing_cell)
    buf = io.StringIO()
    out = tmp_path / "sw"
    # a grid value of 20 000 characters (echoed on the cell's line too)
    long_path = "/nowhere/" + "/".join(["d" * 200] * 100)
    (tmp_path / "spec.yaml").write_text(json.dumps({"base": TINY, "grid": {"data": [long_path]}}))
    run_sweep(load_spec(tmp_path / "spec.yaml"), out, executor="inline", progress=False,
              console=Console(file=buf, width=100))
    assert len(buf.getvalue()) < 5000, len(buf.getvalue())
    assert (out / "results.csv").stat().st_size < 30_000      # the grid value itself is a column
    row = _cells(out)[0]
    assert row["cell_error"].startswith("DataError: \\n") and row["cell_error"].endswith("...")
    with ResultStore(out, create=False) as store:
        assert len(next(store.records()).error) == len("DataError: \n\n\n") + HUGE


def test_audit_csv_cuts_huge_errors_and_client_names(tmp_path):
    """audit.csv (rewritten after every update) gives an error as one bounded line, audit.json
    keeps it whole; a client's self-reported name is cut to one short line."""
    from types import SimpleNamespace

    from gradleak.audit import AuditSettings, LeakageAuditor
    from gradleak.audit.example import build_example_model
    from gradleak.audit.flower import client_name

    s, _, _ = _client_update()
    auditor = LeakageAuditor(build_example_model(s), AuditSettings(attack={"attack": "idlg"}, out=tmp_path / "a"))
    auditor.log_failure(1, "0", "GradleakError: line one\n" + "E" * HUGE)
    auditor.write_summary()
    assert (tmp_path / "a" / "audit.csv").stat().st_size < 5000
    row = list(csv.DictReader(open(tmp_path / "a" / "audit.csv")))[0]
    assert row["error"].startswith("GradleakError: line one\\nEEE") and row["error"].endswith("...")
    assert len(json.loads((tmp_path / "a" / "audit.json").read_text())["rows"][0]["error"]) > HUGE

    def message(partition):
        return SimpleNamespace(content=SimpleNamespace(config_records={"client-info": {"partition-id": partition}},
                                                       metric_records={}), metadata=SimpleNamespace(src_node_id=7))

    assert client_name(message(3)) == "3"
    name = client_name(message("c\n" * 500_000))
    assert len(name) <= 100 and "\n" not in name
