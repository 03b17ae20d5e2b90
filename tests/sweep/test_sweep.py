"""Sweeps: spec validation, cell identity, the SQLite store and results.csv, Ray = local, and a
sweep killed midway that resumes with only the missing cells."""

import csv
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import stored_cells  # tests/ is on sys.path (no package)
from gradleak.cli import main
from gradleak.errors import ConfigError
from gradleak.sweep import ResultStore, cell_identity, load_spec, parse_spec, run_sweep

# Tiny cells: DLG on the paper's LeNet, a few L-BFGS steps, no IIP pool.
BASE = {"attack": "dlg", "model": "lenet-dlg", "iterations": 5, "paper_metrics": False, "threads": 1}
# Metrics that legitimately differ between two runs of the same cell.
VOLATILE = {"wall_seconds", "versions"}


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def stable_metrics(store_dir: Path) -> dict[str, dict]:
    with ResultStore(store_dir, create=False) as store:
        return {r.cell_id: {k: v for k, v in r.metrics.items() if k not in VOLATILE} for r in store.records()}


def assert_close(a, b, where=""):
    """Equal JSON values, floats within 1e-9 relative (same code, same seed, one thread each)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert b == pytest.approx(a, rel=1e-9, abs=1e-12), where
    else:
        assert a == b, where


# ------------------------------------------------------------------ spec validation
@pytest.mark.parametrize("raw, field", [
    ({"base": {"atack": "dlg"}, "grid": {"seed": [0]}}, "base.atack"),
    ({"base": BASE, "grid": {"sed": [0, 1]}}, "grid.sed"),
    ({"base": BASE, "grid": {"seed": []}}, "grid.seed"),
    ({"base": BASE, "grid": {"seed": 3}}, "grid.seed"),
    ({"base": BASE, "grid": {}}, "grid"),
    ({"base": BASE}, "grid"),
    ({"base": BASE, "grid": {"batch_size": [1, "two"]}}, "grid.batch_size[1]"),
    ({"base": BASE, "grid": {"batch_size": [1, 0]}}, "grid.batch_size[1]"),
    ({"base": {**BASE, "threat": "fedprox"}, "grid": {"seed": [0]}}, "base.threat"),
    ({"base": BASE, "grid": {"iterations": [1, 2]}}, "grid.iterations"),          # also in base
    ({"base": BASE, "grid": {"seed": [1, 1]}}, "grid.seed[1]"),                    # duplicate
    ({"base": {**BASE, "out": "x"}, "grid": {"seed": [0]}}, "base.out"),
    ({"base": BASE, "grid": {"seed": [0]}, "extra": 1}, "extra"),
    ([1, 2], "sweep spec"),
])
def test_bad_spec_names_the_field(raw, field):
    with pytest.raises(ConfigError) as err:
        parse_spec(raw)
    assert field in str(err.value)


def test_bad_spec_on_the_cli_is_one_line_exit_2(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text("base: {attack: dlg}\ngrid:\n  batch_size: [1, two]\n")
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "grid.batch_size[1]" in err
    assert not (tmp_path / "out").exists()


def test_cells_and_identity(tmp_path):
    spec = parse_spec({"base": BASE, "grid": {"batch_size": [1, 2], "seed": [0, 1, 2], "defense": [[], "gaussian:0.001"]}})
    assert len(spec.cells) == 12 and len({c.cell_id for c in spec.cells}) == 12
    cell = spec.cells[-1]
    assert cell.grid == {"batch_size": 2, "seed": 2, "defense": ["gaussian:0.001"]}
    assert cell.config["progress"] is False and cell.config["model_seed"] == 0   # defaults resolved
    # Identity depends on the resolved config only: the same cell spelt differently, with the
    # field in base instead of grid, or a default written out, has the same id.
    other = parse_spec({"base": {**BASE, "seed": 2, "model_seed": 0, "defense": ["gaussian:0.001"]},
                        "grid": {"batch_size": [2]}})
    assert other.cells[0].cell_id == cell.cell_id
    assert cell_identity({**cell.config, "progress": True, "out": "elsewhere"}) == cell.cell_id
    assert cell_identity({**cell.config, "iterations": 6}) != cell.cell_id
    # YAML file round trip
    path = tmp_path / "s.yaml"
    path.write_text("base:\n  attack: dlg\n  model: lenet-dlg\ngrid:\n  seed: [0, 1]\n")
    assert [c.grid for c in load_spec(path).cells] == [{"seed": 0}, {"seed": 1}]


# ------------------------------------------------------------------ store, csv, rerun, failures
def test_inline_sweep_store_csv_rerun_and_failures(tmp_path):
    spec = parse_spec({"base": {k: v for k, v in BASE.items() if k != "attack"},
                       "grid": {"attack": ["dlg", "no-such-attack"], "seed": [0]}})
    out = tmp_path / "sw"
    s1 = run_sweep(spec, out, executor="inline", progress=False)
    assert (s1.total, s1.skipped, len(s1.computed), len(s1.failed)) == (2, 0, 2, 1)
    rows = read_csv(out / "results.csv")
    assert len(rows) == 2 and {r["attack"] for r in rows} == {"dlg", "no-such-attack"}
    ok = next(r for r in rows if r["cell_status"] == "ok")
    bad = next(r for r in rows if r["cell_status"] == "failed")
    assert float(ok["psnr_mean"]) > 0 and ok["label_accuracy"] and ok["seed"] == "0"
    assert "unknown attack" in bad["cell_error"] and bad["psnr_mean"] == ""
    with ResultStore(out, create=False) as store:
        recs = {r.cell_id: r for r in store.records()}
    good = recs[next(c.cell_id for c in spec.cells if c.grid["attack"] == "dlg")]
    assert good.config == next(c.config for c in spec.cells if c.grid["attack"] == "dlg")   # full config
    assert good.metrics["per_image"] and good.metrics["versions"]                             # full metrics
    # Rerun: nothing to do; with retry_failed only the failed cell runs again.
    s2 = run_sweep(spec, out, executor="inline", progress=False)
    assert (s2.skipped, s2.computed) == (2, [])
    s3 = run_sweep(spec, out, executor="inline", progress=False, retry_failed=True)
    assert s3.computed == s1.failed
    assert len(read_csv(out / "results.csv")) == 2


def test_a_sweep_takes_the_new_attacks_and_servers(tmp_path):
    """attack: [trap, cpa] x server: [honest, trap] is a grid of 4 cells (a misspelt server is named
    before anything runs); the trap attack rebuilds a batch of 4 exactly on the trap server and, on an
    honest server, whose model has no trap layer, its cell fails with one line saying so. Both cells
    are stored with their config, metrics and results.csv row."""
    four = parse_spec({"base": {"model": "mlp", "batch_size": 4}, "grid": {"attack": ["trap", "cpa"],
                                                                         "server": ["honest", "trap"]}})
    assert [(c.grid["attack"], c.grid["server"]) for c in four.cells] == [
        ("trap", "honest"), ("trap", "trap"), ("cpa", "honest"), ("cpa", "trap")]
    with pytest.raises(ConfigError, match=r"grid\.server\[1\].*unknown server 'trapp'.*did you mean 'trap'"):
        parse_spec({"base": BASE, "grid": {"server": ["honest", "trapp"]}})
    with pytest.raises(ConfigError, match=r"grid\.server\[0\].*give shrink or rate, not both"):
        parse_spec({"base": BASE, "grid": {"server": ["trap:shrink=0.1,rate=0.1"]}})
    spec = parse_spec({"base": {"attack": "trap", "model": "lenet-dlg", "batch_size": 4, "paper_metrics": False,
                                "threads": 1}, "grid": {"server": ["trap", "honest"]}})
    out = tmp_path / "sw"
    summary = run_sweep(spec, out, executor="inline", progress=False)
    assert (summary.total, len(summary.computed), len(summary.failed)) == (2, 2, 1)
    rows = {r["server"]: r for r in read_csv(out / "results.csv")}
    assert rows["trap"]["cell_status"] == "ok" and rows["trap"]["verdict"] == "leaked", rows["trap"]
    assert float(rows["trap"]["psnr_mean"]) >= 40 and rows["trap"]["separated"] == "4"
    assert rows["honest"]["cell_status"] == "failed" and rows["honest"]["psnr_mean"] == ""
    assert rows["honest"]["cell_error"] == ("ModelMismatchError: trap: the update was not computed on a model with "
                                            "the server's trap layer (share with --server trap)")
    with ResultStore(out, create=False) as store:
        recs = {r.config["server"]: r for r in store.records()}
    assert recs["trap"].config["attack"] == "trap" and recs["trap"].metrics["attack"] == "trap"
    assert recs["trap"].metrics["update"]["model_kwargs"]["server"].startswith("trap:rows=2000,shrink=")
    assert recs["trap"].metrics["label_accuracy"] == 1.0 and recs["honest"].metrics is None


def test_csv_lists_the_specs_cells_in_grid_order_store_keeps_all(tmp_path):
    # Cells that fail at once (unknown attack names) are finished cells too: no attack runs here.
    def spec(names):
        return parse_spec({"base": {k: v for k, v in BASE.items() if k != "model"}, "grid": {"seed": [0], "model": names}})
    out = tmp_path / "sw"
    run_sweep(spec(["m:b", "m:a"]), out, executor="inline", progress=False)
    s2 = run_sweep(spec(["m:c", "m:a", "m:b"]), out, executor="inline", progress=False)   # grid extended
    assert s2.skipped == 2 and len(s2.computed) == 1
    assert [r["model"] for r in read_csv(out / "results.csv")] == ["m:c", "m:a", "m:b"]
    run_sweep(spec(["m:d"]), out, executor="inline", progress=False)                        # another spec
    assert [r["model"] for r in read_csv(out / "results.csv")] == ["m:d"]
    with ResultStore(out, create=False) as store:
        assert len(store) == 4


# ------------------------------------------------------------------ executors agree
CELLS = {"base": BASE, "grid": {"batch_size": [1, 2], "seed": [0, 1]}}


@pytest.mark.timeout(240)
def test_ray_sweep_matches_local_executor(tmp_path):
    """The local Ray is gradleak.localray's (loopback only; tests/reliability/test_loopback.py traces it)."""
    import ray

    from gradleak.localray import ENVIRONMENT

    spec = parse_spec(CELLS)
    s_local = run_sweep(spec, tmp_path / "local", executor="local", workers=2, progress=False)
    assert len(s_local.computed) == 4 and not s_local.failed
    env = {key: os.environ.get(key) for key in ENVIRONMENT}
    try:
        s_ray = run_sweep(spec, tmp_path / "ray", executor="ray", workers=2, progress=False)
    finally:
        if ray.is_initialized():
            ray.shutdown()
    assert not ray.is_initialized()          # the sweep shut down the Ray it started
    assert {key: os.environ.get(key) for key in ENVIRONMENT} == env   # and gave the environment back
    assert len(s_ray.computed) == 4 and not s_ray.failed
    local, remote = stable_metrics(tmp_path / "local"), stable_metrics(tmp_path / "ray")
    assert local.keys() == remote.keys() == {c.cell_id for c in spec.cells}
    for cid in local:
        assert_close(local[cid], remote[cid], cid)
    for name in ("local", "ray"):
        rows = read_csv(tmp_path / name / "results.csv")
        assert sorted((r["batch_size"], r["seed"]) for r in rows) == [("1", "0"), ("1", "1"), ("2", "0"), ("2", "1")]


# ------------------------------------------------------------------ killed midway, resumed
@pytest.mark.timeout(240)
def test_sweep_killed_midway_resumes_with_missing_cells_only(tmp_path):
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(
        "base: {attack: dlg, model: lenet-dlg, iterations: 12, paper_metrics: false, threads: 1}\n"
        "grid:\n  seed: [0, 1, 2, 3]\n")
    spec = load_spec(spec_path)
    out = tmp_path / "sw"
    cmd = [sys.executable, "-m", "gradleak.cli", "sweep", str(spec_path), "--out", str(out),
           "--executor", "local", "--workers", "1", "--no-progress"]
    # Own session: the kill reaches the sweep and its pool worker, nothing else.
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while stored_cells(out / "results.sqlite") < 1:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no cell finished in time"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)      # a crash: no chance to clean up
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        proc.stderr.close()
    done_before = stored_cells(out / "results.sqlite")
    assert 1 <= done_before < 4
    # results.csv is rewritten right after each commit: a kill in between leaves it one cell behind
    # the store (never ahead, never torn); the next run rewrites it first.
    assert done_before - 1 <= len(read_csv(out / "results.csv")) <= done_before
    with ResultStore(out, create=False) as store:
        before = {r.cell_id: r.finished_at for r in store.records()}
    summary = run_sweep(spec, out, executor="inline", progress=False)
    assert summary.skipped == done_before
    assert sorted(summary.computed) == sorted(set(c.cell_id for c in spec.cells) - set(before))
    rows = read_csv(out / "results.csv")
    assert sorted(r["cell_id"] for r in rows) == sorted(c.cell_id for c in spec.cells)   # one row per cell
    assert sorted(r["seed"] for r in rows) == ["0", "1", "2", "3"]
    with ResultStore(out, create=False) as store:
        after = {r.cell_id: r.finished_at for r in store.records()}
    assert all(after[c] == t for c, t in before.items())      # finished cells were not recomputed


# ------------------------------------------------------------------ dashboard
def test_dashboard_is_self_contained_and_escaped(tmp_path):
    from gradleak.report.dashboard import render_dashboard
    from gradleak.sweep.dashboard_cli import sweep_stores

    evil = '<script>alert(1)</script>'
    spec = parse_spec({"base": {"model": "lenet-dlg", "data": "/tmp/" + evil},
                       "grid": {"attack": ["dlg", "idlg"], "batch_size": [1, 2, 4], "defense": [[], "gaussian:0.01"]}})
    with ResultStore(tmp_path) as store:
        for i, cell in enumerate(spec.cells):
            k, noisy = cell.config["batch_size"], bool(cell.config["defense"])
            metrics = {"psnr_mean": 30.0 / k - 5 * noisy + i * 0.01, "label_accuracy": 1.0, "iip": 1.0 / k,
                       "ssim_mean": 0.5, "model_accuracy": 0.9 - 0.1 * noisy, "name": evil}
            store.add(cell.cell_id, cell.grid, cell.config, {"status": "ok", "metrics": metrics, "wall_seconds": 1.0})
        store.add("f" * 16, {"attack": evil}, {"attack": evil, "batch_size": 1},
                  {"status": "failed", "error": f"UnknownNameError: {evil}"})
    page = render_dashboard(tmp_path, stores=sweep_stores()).read_text()
    assert evil not in page and "&lt;script&gt;" in page
    from gradleak.report.dashboard.render import SORT_AND_FILTER   # the page's only script: its own, allowed by hash
    assert page.lower().count("<script") == 1 and f"<script>{SORT_AND_FILTER}</script>" in page
    assert "http://" not in page and "https://" not in page
    assert page.count("data:image/png;base64,") >= 6          # psnr, label acc, ssim, IIP, defense bars, trade-off
    for section in ("Leakage vs batch size", "IIP curve", "Defense trade-off", "All cells", "Failed cells"):
        assert section in page
    with pytest.raises(Exception, match="does not exist"):
        render_dashboard(tmp_path / "absent", stores=sweep_stores())
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match="no sweep results"):
        render_dashboard(tmp_path / "empty", stores=sweep_stores())


# ------------------------------------------------------------------ attack defaults and cell identity
DEFAULTS_FILE = Path(__file__).resolve().parents[1] / "attack_defaults.json"
# The reference convnet (14 parameter tensors, 4 BN layers) and ResNet-18 (62, 20): the per-layer
# rules of IG's alpha_TV and GradInversion's preset alphas are read at both.
DEFAULTS_LAYERS = (None, (14, 4), (62, 20))


def _resolved_defaults() -> dict[str, dict]:
    from gradleak.attacks.configs import IMAGE_ATTACK_CONFIGS, resolve_attack

    out = {}
    for attack in sorted(set(IMAGE_ATTACK_CONFIGS) - {"auto"}):
        for preset in (("cpu", "paper", "imagenet") if attack == "gradinversion" else (None,)):
            for layers in DEFAULTS_LAYERS:
                values = {"attack": attack, **({"preset": preset} if preset else {})}
                cfg = resolve_attack(values, bn_statistics_shared=True, layers=layers)
                out[f"{attack}{' ' + preset if preset else ''} layers={layers}"] = cfg.model_dump(mode="json")
    return out


def test_attack_defaults_are_pinned_for_cell_identity():
    """A changed attack default must enter sweep.spec.CHANGED_DEFAULTS, else cell stores hand cells
    computed under the old default to runs under the new one. Regenerate the file with
    ``cd tests && python -c "import json, test_sweep as t; json.dump(t._resolved_defaults(), open(t.DEFAULTS_FILE, 'w'), indent=1)"``
    after adding the field there."""
    from gradleak.sweep.spec import CHANGED_DEFAULTS

    pinned, now = json.loads(DEFAULTS_FILE.read_text()), _resolved_defaults()
    # an attack the file does not pin is new: no store holds its cells, so nothing to regenerate
    # when one is added (its defaults are pinned at the next regeneration); a pinned one must stay
    assert set(pinned) <= set(now), f"attacks gone from the defaults: {sorted(set(pinned) - set(now))}"
    changed = sorted({(key.split()[0], f) for key in pinned
                      for f in set(pinned[key]) | set(now[key])
                      if pinned[key].get(f) != now[key].get(f)})
    assert not changed, (f"attack defaults changed: {changed}; add each (attack, field) to "
                         f"sweep.spec.CHANGED_DEFAULTS (known: {sorted(CHANGED_DEFAULTS)}) and regenerate {DEFAULTS_FILE.name}")


def test_fields_added_since_the_stores_leave_identities_alone_at_their_default():
    """A flag added to AttackConfig after cell stores were written (GradInversion's --distance,
    --box; any new attack's own flags) enters a cell's identity only when it is not at its default:
    stores of before keep their cells, and adding an attack needs no entry in the sweep."""
    from gradleak.config import AttackConfig
    from gradleak.sweep.spec import HASHED_FIELDS, IDENTITY_EXCLUDED

    later = set(AttackConfig.model_fields) - HASHED_FIELDS - IDENTITY_EXCLUDED
    assert HASHED_FIELDS <= set(AttackConfig.model_fields) and {"box", "distance"} <= later
    cell = parse_spec({"base": {"attack": "gradinversion", "iterations": 5}, "grid": {"seed": [0]}}).cells[0].config
    before = {k: v for k, v in cell.items() if k not in later}   # what a store of before hashed
    assert cell_identity(cell) == cell_identity(before)
    assert cell_identity({**cell, "distance": "cosine"}) != cell_identity(cell)
    assert cell_identity({**cell, "box": True}) != cell_identity(cell)


def test_changed_defaults_enter_the_identity_of_cells_that_leave_them_unset():
    from gradleak.sweep.spec import HASHED_FIELDS, changed_defaults

    unset = {k: v for k, v in BASE.items() if k != "iterations"}
    ig = parse_spec({"base": {**unset, "attack": "ig", "model": "convnet"}, "grid": {"seed": [0]}}).cells[0].config
    assert ig["iterations"] is None and set(changed_defaults(ig)) == {"ig.iterations", "ig.alpha_tv", "ig.epoch_prior"}
    # The store of before hashed the config alone: a cell left at IG's default iterations is not
    # that cell any more (it ran 4800 iterations then, 1000 now); one that names them keeps its id.
    # (the fields it hashed: HASHED_FIELDS; those added since, a new attack's flags, at their default)
    legacy = hashlib.sha256(json.dumps({k: v for k, v in ig.items() if k in HASHED_FIELDS},
                                       sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    assert cell_identity(ig) != legacy
    # IG's epoch prior (2026-12-02) is a change too: a store of before ran IG without it
    named = {**ig, "iterations": 4800, "alpha_tv": 0.1}
    assert set(changed_defaults(named)) == {"ig.epoch_prior"}
    named_all = {**named, "epoch_prior": 0.0}
    assert changed_defaults(named_all) == {} and cell_identity(named_all) != cell_identity(named)
    # DLG's L-BFGS gained a line search: its cells that leave the optimizer to DLG get new ids
    # (BASE is a DLG cell); one that names the optimizer keeps its id
    dlg = parse_spec({"base": unset, "grid": {"seed": [0]}}).cells[0].config
    assert dlg["iterations"] is None and set(changed_defaults(dlg)) == {"dlg.optimizer"}
    assert changed_defaults({**dlg, "optimizer": "lbfgs"}) == {}
    named_dlg = {**dlg, "optimizer": "lbfgs"}
    assert cell_identity(named_dlg) == hashlib.sha256(json.dumps(
        {k: v for k, v in named_dlg.items() if k in HASHED_FIELDS},
        sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    # auto without a fallback may run DLG, GradInversion and IG, and its portfolio is itself a change
    auto = {**dlg, "attack": "auto"}
    assert set(changed_defaults(auto)) == {"gradinversion.alpha_g", "gradinversion.alpha_bn", "ig.iterations",
                                           "ig.alpha_tv", "ig.epoch_prior", "auto.fallback", "dlg.optimizer", "idlg.optimizer"}
    assert set(changed_defaults({**auto, "fallback": "idlg"})) == {"idlg.optimizer"}


def test_auto_portfolio_of_the_cell_identity_is_autos_choices():
    """sweep.spec.AUTO_PORTFOLIO (data: sweep does not import the attacks) must list exactly the
    attacks attacks.auto.auto_portfolio can choose, else an `auto` cell's identity misses a changed
    default of an attack it runs."""
    from types import SimpleNamespace

    from gradleak.attacks.auto import auto_portfolio
    from gradleak.sweep.spec import AUTO_PORTFOLIO

    def update(batch_size, side, **threat):
        return SimpleNamespace(meta=SimpleNamespace(batch_size=batch_size, threat=threat, input_shape=(3, side, side)))

    chosen = {a for k in (1, 2, 8) for side in (28, 32, 224)
              for t in ({}, {"name": "fedavg", "local_steps": 3}, {"name": "aggregate", "clients": 4})
              for a in auto_portfolio(update(k, side, **t))}
    assert chosen == set(AUTO_PORTFOLIO)


def test_the_readme_sweep_example_is_a_valid_spec_of_36_cells():
    """examples/sweep-batch-defense.yaml, the README's sweep example: 2 attacks x 3 batch sizes x
    2 defenses x 3 seeds, each cell a distinct resolved config."""
    from gradleak.sweep.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parents[2] / "examples" / "sweep-batch-defense.yaml")
    assert len(spec.cells) == 36 and len({c.cell_id for c in spec.cells}) == 36
    assert {c.config["attack"] for c in spec.cells} == {"dlg", "idlg"}
    assert {c.config["batch_size"] for c in spec.cells} == {1, 2, 4}
    assert {tuple(c.config["defense"]) for c in spec.cells} == {(), ("gaussian:0.001",)}
    assert all(c.config["model"] == "lenet-dlg" and c.config["iterations"] == 50 for c in spec.cells)
