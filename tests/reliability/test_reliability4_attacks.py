"""Reliability, part 4: the trap-weights attack and the Cocktail Party Attack (CPA) on small or
lying inputs, and under SIGTERM.

* Trap: a layer whose rows all fire is refused (one line, exit 2) before the rows x rows
  comparison is allocated; a file's server record (rows, rate) that its tensors cannot hold is
  refused without drawing or calibrating anything (the shapes are checked on torch's meta device).
* CPA: a batch claim above the rank of the first layer's gradient is refused before the peel and
  the unmixing; the engine's stop request is polled between CPA's phases and the peel's
  candidates, so SIGTERM ends `gradleak attack --attack cpa` with exit 143 and its one line instead
  of being lost; the trap attack polls it between its phases.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from conftest import refused, rewrite_update as _rewrite, run_cli
from gradleak.cli import main
from gradleak.errors import ConfigError, Terminated

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py
FAST = ["--no-progress", "--threads", "1", "--no-paper-metrics"]


def _edit_meta(**changes):
    def meta_fn(md):
        meta = json.loads(md["meta"])
        if "input_shape" in changes:  # the normalisation follows the channels
            c = changes["input_shape"][0]
            meta["mean"], meta["std"] = meta["mean"][:1] * c, meta["std"][:1] * c
        for key, value in changes.items():
            if key == "server":
                meta["model_kwargs"]["server"] = value
            else:
                meta[key] = value
        md["meta"] = json.dumps(meta)
    return meta_fn


def _share(out: Path, *args: str) -> Path:
    assert main(["share", *args, "--out", str(out)]) == 0
    return out


# Fashion-MNIST at 4 px through an mlp of width 16 behind a trap layer: 16 inputs, a small file
TRAP_SHARE = ["--model", "mlp", "--width", "16", "--data", "fashion-mnist", "--image-size", "4", "--batch-size", "2"]


@pytest.fixture(scope="module")
def wide_trap(tmp_path_factory):
    """A trap update whose layer has 12000 rows (above the 11585 that fit the pairwise bound)."""
    d = tmp_path_factory.mktemp("trap")
    return _share(d / "u.safetensors", *TRAP_SHARE, "--server", "trap:rows=12000,shrink=0.5")


# ================================================================== 1. trap: every row active
def test_trap_with_every_row_active_is_one_line(wide_trap, tmp_path, capsys):
    """Every row of the bias gradient non-zero: 12000 active rows, whose pairwise comparison
    (analytic.py's rows x rows distances, 1.07 GiB here; 8 GiB at 32768 rows) is refused before
    it is allocated."""
    def tensors_fn(t):
        t["grad/trap.linear0.bias"] = torch.full_like(t["grad/trap.linear0.bias"], 1e-3)

    bad = _rewrite(wide_trap, tmp_path / "all-active.safetensors", tensors_fn=tensors_fn)
    start = time.perf_counter()
    refused(["attack", "--update", bad, "--attack", "trap", *FAST, "--out", tmp_path / "r"], capsys,
            "12000 of the trap layer's 12000 rows are active", "at most 11585")
    assert time.perf_counter() - start < 60 and not (tmp_path / "r").exists()


def test_trap_active_rows_bound_is_exact():
    from gradleak.attacks.trap import MAX_PAIRWISE_BYTES, check_active_rows

    limit = int((MAX_PAIRWISE_BYTES // 8) ** 0.5)
    assert check_active_rows(torch.ones(limit)) == limit
    assert check_active_rows(torch.cat([torch.ones(limit), torch.zeros(50_000)])) == limit  # inactive rows are free
    with pytest.raises(ConfigError, match="active"):
        check_active_rows(torch.ones(limit + 1))


# ================================================================== 2. trap: a lying server record
@pytest.fixture(scope="module")
def small_trap(tmp_path_factory):
    d = tmp_path_factory.mktemp("small-trap")
    return _share(d / "u.safetensors", *TRAP_SHARE, "--server", "trap:rows=64,shrink=0.5")


@pytest.mark.parametrize("changes", [
    {"server": "trap:rows=65536,shrink=0.5,seed=0,gain=100.0"},             # more rows than the file holds
    {"server": "trap:rows=32,shrink=0.5,seed=0,gain=100.0", "input_shape": [4, 1024, 1024]},  # 2^27 weights
    {"server": "trap:rows=32,rate=0.1,seed=0,gain=100.0", "input_shape": [4, 1024, 1024]},    # calibration at 1024 px
])
def test_trap_server_record_the_tensors_cannot_hold(changes, small_trap, tmp_path, capsys, monkeypatch):
    """The shapes a file's record implies are checked on the meta device before anything is
    built: no trap row is drawn and nothing is calibrated for them (before: a 128 KB file drove
    memory past 3.5 GB), and the tensors that do not match are refused in one line."""
    import gradleak.models.trap as trap_module

    drawn: list[tuple[int, int]] = []

    def trap_rows(rows, d, *args):
        drawn.append((rows, d))
        raise AssertionError(f"{rows} trap rows on {d} inputs drawn for shapes only")

    monkeypatch.setattr(trap_module, "trap_rows", trap_rows)

    def no_crops(*args):
        raise AssertionError(f"calibrated on public crops {args} for shapes only")

    monkeypatch.setattr(trap_module, "public_crops", no_crops)
    bad = _rewrite(small_trap, tmp_path / "lying.safetensors", meta_fn=_edit_meta(**changes))
    assert bad.stat().st_size < 128 * 1024
    refused(["attack", "--update", bad, "--attack", "trap", *FAST, "--out", tmp_path / "r"], capsys)
    assert drawn == [] and not (tmp_path / "r").exists()


def test_trap_record_with_a_rate_that_matches_the_tensors_is_read(small_trap, tmp_path, capsys):
    """A record giving the rate instead of the shrink, with tensors that match it: the real model
    is calibrated (bounded by the tensors' size) and the attack runs."""
    ok = _rewrite(small_trap, tmp_path / "rate.safetensors",
                  meta_fn=_edit_meta(server="trap:rows=64,rate=0.125,seed=0,gain=100.0"))
    code, lines = run_cli(["attack", "--update", ok, "--attack", "trap", *FAST, "--out", tmp_path / "r"], capsys)
    assert code == 0, lines
    assert json.loads((tmp_path / "r" / "metrics.json").read_text())["attack"] == "trap"


# ================================================================== 3. CPA: a batch claim the gradient cannot carry
@pytest.fixture(scope="module")
def cpa_update(tmp_path_factory):
    d = tmp_path_factory.mktemp("cpa")
    return _share(d / "u.safetensors", "--model", "mlp", "--width", "64", "--batch-size", "2")


def test_cpa_batch_claim_above_the_gradients_rank(cpa_update, tmp_path, capsys):
    """A batch of 2 whose metadata claims 64 (as wide as the layer, so the width check passes):
    refused before the peel and the unmixing (before: a claim of 1024 on a wider layer was still
    running after 150 s; a smaller one ran and answered 62 invented slots)."""
    bad = _rewrite(cpa_update, tmp_path / "claims-64.safetensors", meta_fn=_edit_meta(batch_size=64))
    start = time.perf_counter()
    refused(["attack", "--update", bad, "--attack", "cpa", *FAST, "--out", tmp_path / "r"], capsys,
            "claims a batch of 64", "rank 2")
    assert time.perf_counter() - start < 60 and not (tmp_path / "r").exists()
    # the honest file is read as before
    code, lines = run_cli(["attack", "--update", cpa_update, "--attack", "cpa", *FAST, "--out", tmp_path / "ok"], capsys)
    assert code == 0, lines


# ================================================================== 4. stop requests
@pytest.fixture(scope="module")
def photos16():
    from gradleak.data import open_source, sample_batch
    from gradleak.fl import fedsgd
    from gradleak.models import build_model

    torch.set_num_threads(1)
    model = build_model("mlp", num_classes=10, channels=3, image_size=32, seed=0, width=64)
    batch = sample_batch(open_source("cifar10-samples"), 16, 7100, 32, 3, allow_repeats=True)
    return fedsgd(model, batch), model


def test_cpa_and_trap_stop_at_a_poll(photos16, small_trap):
    """A poll that raises stops either attack where it is (the peel's candidates, between CPA's
    phases, between the trap attack's phases)."""
    from gradleak.attacks.cpa import cpa
    from gradleak.attacks.trap import trap_attack
    from gradleak.fl import load_update

    update, model = photos16
    for after in (1, 3):
        calls = []

        def poll():
            calls.append(1)
            if len(calls) >= after:
                raise Terminated(signal.SIGTERM)

        with pytest.raises(Terminated):
            cpa(update, model, poll=poll)
        assert len(calls) == after
    seen = []
    trap_update, trap_model = load_update(small_trap)
    trap_attack(trap_update, trap_model, poll=lambda: seen.append(1))
    assert len(seen) >= 2  # before the closed form and after it (and around its labels)

    def stop():
        raise Terminated(signal.SIGTERM)

    with pytest.raises(Terminated):
        trap_attack(trap_update, trap_model, poll=stop)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for key in ("PYTHONSAFEPATH", "PYTHONPATH", "PYTHONWARNINGS"):
        env.pop(key, None)
    return env


@pytest.mark.timeout(300)
def test_cpa_sigterm_mid_unmixing_exits_143_at_once(tmp_path):
    """`gradleak attack --attack cpa --ica-only` in a child process: SIGTERM arrives as the unmixing
    starts (the child sends it to itself on FastICA's call, which then takes 1 s more), and the
    command exits 143 with its one line within seconds, leaving no run folder and no state.
    Before, the signal only set a flag that CPA never read: the run went on to the end (exit 0)."""
    update = tmp_path / "u.safetensors"
    assert main(["share", "--model", "mlp", "--width", "64", "--batch-size", "16", "--seed", "7100",
                 "--allow-repeats", "--out", str(update)]) == 0
    stamp = tmp_path / "signalled"
    prog = textwrap.dedent(f"""\
        import os, signal, sys, time
        import gradleak.attacks.cpa as cpa
        real = cpa.FastICA.fit
        def fit(self, *a, **k):
            if not os.path.exists({str(stamp)!r}):
                open({str(stamp)!r}, "w").write(repr(time.time()))
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1.0)
            return real(self, *a, **k)
        cpa.FastICA.fit = fit
        from gradleak.cli import main
        sys.exit(main(["attack", "--update", {str(update)!r}, "--attack", "cpa", "--ica-only",
                       "--no-progress", "--threads", "1", "--no-paper-metrics",
                       "--out", {str(tmp_path / "run")!r}]))
        """)
    proc = subprocess.run([sys.executable, "-c", prog], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=280)
    ended = time.time()
    assert stamp.exists(), proc.stderr[-3000:]
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, proc.stderr[-3000:])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["gradleak: interrupted (SIGTERM)"], proc.stderr[-3000:]
    assert ended - float(stamp.read_text()) < 30, ended - float(stamp.read_text())  # the child's exit included
    assert sorted(p.name for p in tmp_path.iterdir()) == ["signalled", "u.safetensors"]
