"""Interrupt and resume, and divergence recovery (issue 8, items 1-2).

* An attack stopped by SIGTERM after step k and resumed from its saved state ends with exactly
  the same numbers (torch.equal / ==) as the same attack run without interruption, on the CPU:
  GradInversion (G=2, registered group: per-seed generators and registration transforms are
  state), DLG (L-BFGS float64, interrupted inside a later trial: the trial index and the earlier
  trials are state) and Inverting Gradients; and through the CLI, a `gradleak attack` subprocess
  killed with SIGTERM then `--resume`d gives the same run folder as an uninterrupted run.
* A NaN injected once is recovered from (last good state, lr x0.5) and the run finishes; an
  attack that keeps diverging stops after 3 retries, keeps its last good state in a run folder
  marked "diverged", and exits with status 2 and one error line.
* Corrupted, truncated or mismatched state files give one clear error line and exit status 2.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gradleak.attacks import Engine
from gradleak.attacks.configs import resolve_attack
from gradleak.attacks.gradinversion import layer_counts, preset_values
from gradleak.engine import LoopSettings
from gradleak.engine.loop import optimise
from gradleak.engine import Interrupted, Session, StateFileError
from gradleak.engine.checkpoints import load_state, state_dir_for
from gradleak.engine.state import pack, unpack
from gradleak.cli import main
from gradleak.data import open_source, sample_batch
from gradleak.fl import fedsgd
from gradleak.models import build_model


@pytest.fixture(scope="module")
def convnet_case():
    spec = build_model("convnet", num_classes=10, width=16)
    batch = sample_batch(open_source("cifar10-samples"), 2, seed=0, image_size=32, channels=3)
    return spec, fedsgd(spec, batch, share_bn_statistics=True)


@pytest.fixture(scope="module")
def lenet_case():
    spec = build_model("lenet-dlg", num_classes=10)
    batch = sample_batch(open_source("cifar10-samples"), 1, seed=3, image_size=32, channels=3)
    return spec, fedsgd(spec, batch)


def interrupt_then_resume(attack, tmp_path: Path, stop_at: int, every: int):
    """Run ``attack(engine)`` with an engine whose Session has real SIGTERM handling; the observer
    raises SIGTERM after step ``stop_at``; then resume from the saved state in a fresh Session."""
    d = tmp_path / "state"

    def observer(t: int, images: torch.Tensor) -> None:
        if t == stop_at:
            signal.raise_signal(signal.SIGTERM)

    first = Session(directory=d, every=every)
    with first.signals(), pytest.raises(Interrupted) as info:
        attack(Engine(observer=observer, session=first))
    assert info.value.exit_code == 128 + signal.SIGTERM and (d / "state.json").is_file()
    saved = load_state(d)
    again = Session(directory=d, every=every, pending=saved)
    rec = attack(Engine(session=again))
    assert again.pending is None and again.resumed_at
    return rec, saved, again


def assert_same(a, b):
    assert torch.equal(a.images, b.images)
    assert (a.candidates is None) == (b.candidates is None)
    if a.candidates is not None:
        assert torch.equal(a.candidates, b.candidates)
    assert torch.equal(a.labels, b.labels)
    assert a.history == b.history and a.iterations == b.iterations
    skip = {"seconds_per_iteration"}
    assert {k: v for k, v in a.extra.items() if k not in skip} == {k: v for k, v in b.extra.items() if k not in skip}


def run_with(engine, update, spec, values, log_every=1):
    """The attack of typed config ``values`` (flat values, resolved on this update and model), run
    by ``engine`` observing every ``log_every`` steps."""
    cfg = resolve_attack(values, bn_statistics_shared=bool(update.meta.bn_statistics_shared),
                         layers=layer_counts(spec.module))
    engine.log_every = log_every
    return engine.run(cfg, update, spec)


# --------------------------------------------------------------------------- resume == uninterrupted


def test_gradinversion_registered_resume_is_bit_identical(convnet_case, tmp_path):
    spec, update = convnet_case
    gi = {**preset_values("cpu"), "iterations": 18, "warmup": 3, "seeds": 2, "group": "registered",
          "registration_start": 4, "registration_every": 4, "registration_steps": 10}

    def attack(engine):
        return run_with(engine, update, spec, {"attack": "gradinversion", "seed": 5, **gi})

    reference = attack(Engine())
    assert reference.extra["registrations"] >= 4
    resumed, saved, _ = interrupt_then_resume(attack, tmp_path, stop_at=10, every=5)
    # stopped between two registrations, after 2 fits: the transforms are part of the state
    assert saved.step == 10 and saved.phase == "main"
    assert saved.tree["attack"]["group"]["registration"]["fits"] == 2
    assert len(saved.tree["attack"]["generators"]) == 2
    assert_same(reference, resumed)


def test_dlg_resume_inside_a_later_trial_is_bit_identical(lenet_case, tmp_path, monkeypatch):
    """Every trial but the last 'stalls' after 4 steps (patched criterion), so the run goes
    through 4 trials; it is interrupted inside the third one (trial 2)."""
    dlg_module = importlib.import_module("gradleak.attacks.dlg")  # the module

    monkeypatch.setattr(dlg_module, "_stalled", lambda history: len(history) >= 4)
    spec, update = lenet_case
    def attack(engine):
        return run_with(engine, update, spec, {"attack": "dlg", "seed": 1, "iterations": 6})

    reference = attack(Engine())
    assert reference.extra["trials"] == 4 and reference.iterations == 3 * 4 + 6
    resumed, saved, again = interrupt_then_resume(attack, tmp_path, stop_at=2 * 4 + 3, every=2)
    assert saved.phase == "trial-2" and saved.step == 3
    assert again.resumed_at == [{"phase": "trial-2", "iteration": 3}]
    assert_same(reference, resumed)


def test_inverting_gradients_resume_is_bit_identical(convnet_case, tmp_path):
    spec, update = convnet_case
    def attack(engine):
        return run_with(engine, update, spec, {"attack": "ig", "seed": 2, "iterations": 16, "restarts": 2})

    reference = attack(Engine())
    resumed, saved, _ = interrupt_then_resume(attack, tmp_path, stop_at=7, every=4)
    assert saved.step == 7
    assert_same(reference, resumed)


def test_pack_round_trip():
    value = {"a": [1, 2.5, float("inf"), None, True], "t": torch.arange(3), 1: 0,
             "nested": {"$odd": (torch.ones(2), "x")}, 7: float("nan")}
    tensors: dict[str, torch.Tensor] = {}
    tree = pack(value, tensors, "v")
    json.dumps(tree, allow_nan=False)  # strict JSON
    back = unpack(json.loads(json.dumps(tree)), tensors, clone=True)
    assert back["a"][:2] == [1, 2.5] and back["a"][2] == float("inf") and back["a"][3:] == [None, True]
    assert torch.equal(back["t"], value["t"]) and back[7] != back[7]
    assert isinstance(back["nested"]["$odd"], tuple) and torch.equal(back["nested"]["$odd"][0], torch.ones(2))


# --------------------------------------------------------------------------- the CLI, with a real process

GI_ARGS = ["attack", "--attack", "gradinversion", "--model", "convnet", "--width", "16", "--batch-size", "2",
           "--seeds", "2", "--group", "lazy", "--iterations", "24", "--seed", "3", "--no-paper-metrics",
           "--no-progress", "--threads", "1", "--log-every", "5"]


def _finished_equal(a: Path, b: Path) -> None:
    ma, mb = (json.loads((p / "metrics.json").read_text()) for p in (a, b))
    for m in (ma, mb):
        m.pop("wall_seconds")
        m.pop("seconds_per_iteration", None)
        m.pop("resumed_at", None)
    assert ma == mb and ma["status"] == "finished"
    assert (a / "history.csv").read_text() == (b / "history.csv").read_text()
    ta, tb = load_file(str(a / "reconstruction.safetensors")), load_file(str(b / "reconstruction.safetensors"))
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    ca, cb = (json.loads((p / "config.json").read_text()) for p in (a, b))
    for c in (ca, cb):
        c["run"].pop("out"), c["run"].pop("checkpoint_every")
    assert ca == cb


def test_sigterm_then_resume_gives_the_uninterrupted_run_folder(tmp_path, capsys):
    out = tmp_path / "run"
    state = state_dir_for(out)
    exe = Path(sys.executable).parent / "gradleak"
    proc = subprocess.Popen([str(exe), *GI_ARGS, "--checkpoint-every", "3", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (state / "state.json").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(random.Random(8).uniform(0.0, 0.3))  # a "random" later iteration
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "interrupted (SIGTERM) after iteration" in err and f"--resume {out}" in err
    assert not out.exists() and (state / "config.json").is_file()
    step = json.loads((state / "state.json").read_text())["step"]
    assert 3 <= step < 24

    assert main(["attack", "--resume", str(out)]) == 0
    assert not state.exists()
    assert main([*GI_ARGS, "--out", str(tmp_path / "straight")]) == 0
    capsys.readouterr()
    _finished_equal(out, tmp_path / "straight")
    m = json.loads((out / "metrics.json").read_text())
    assert m["status"] == "finished" and m["resumed_at"] == [{"phase": "main", "iteration": step}]
    assert "candidates" in load_file(str(out / "reconstruction.safetensors"))


# --------------------------------------------------------------------------- divergence


def test_loop_recovers_from_one_nan():
    x = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    calls = [0]

    def objective():
        calls[0] += 1
        loss = ((x - 1) ** 2).sum()
        return loss * float("nan") if calls[0] == 17 else loss

    res = optimise([x], objective, LoopSettings(iterations=30, lr=0.05))
    assert res.diverged is None and res.iterations == 30 and len(res.history) == 30
    assert res.recoveries == [{"phase": "main", "iteration": 17, "loss": None, "restored_to": 10, "lr_scale": 0.5}]
    assert torch.isfinite(x).all() and [h["iteration"] for h in res.history] == list(range(1, 31))


def test_loop_gives_up_after_three_retries_and_keeps_the_last_good_state():
    x = torch.zeros(3, requires_grad=True)
    calls = [0]

    def objective():
        calls[0] += 1
        loss = ((x - 1) ** 2).sum()
        return loss + float("inf") if calls[0] > 12 else loss  # diverges for good after step 12

    res = optimise([x], objective, LoopSettings(iterations=30, lr=0.1))
    assert len(res.recoveries) == 3 and [r["lr_scale"] for r in res.recoveries] == [0.5, 0.25, 0.125]
    assert res.diverged is not None and res.diverged["restored_to"] == 10 and "after 3 restart(s)" in res.diverged["message"]
    assert res.iterations == 10 and len(res.history) == 10 and torch.isfinite(x).all()


def test_forced_nan_in_dlg_is_recovered_and_the_run_finishes(tmp_path, capsys, caplog, monkeypatch):
    dlg_module = importlib.import_module("gradleak.attacks.dlg")  # the module

    real = dlg_module.squared_l2
    calls = [0]

    def flaky(a, b):
        calls[0] += 1
        value = real(a, b)
        # NaN for a whole L-BFGS step's evaluations from step ~5 on (20 evals a step): the line
        # search cannot step around it, so the loop's divergence guard must recover
        return value * float("nan") if 90 <= calls[0] < 130 else value

    monkeypatch.setattr(dlg_module, "squared_l2", flaky)
    out = tmp_path / "run"
    code = main(["attack", "--attack", "idlg", "--iterations", "8", "--no-progress", "--no-paper-metrics",
                 "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "restarting from iteration 0 with lr x0.5 (retry 1 of 3)" in caplog.text  # a warning on stderr
    m = json.loads((out / "metrics.json").read_text())
    assert m["status"] == "finished" and m["iterations"] == 8
    assert len(m["recoveries"]) == 1 and m["recoveries"][0]["lr_scale"] == 0.5
    assert m["recoveries"][0]["phase"] == "trial-0" and m["recoveries"][0]["restored_to"] == 0


def test_persistent_divergence_ends_with_exit_2_and_keeps_the_results(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["attack", "--attack", "gradinversion", "--model", "convnet", "--width", "16", "--batch-size", "2",
                 "--seeds", "2", "--iterations", "20", "--lr", "1e30", "--no-progress", "--no-paper-metrics",
                 "--threads", "1", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2
    lines = [line for line in captured.err.splitlines() if line.startswith("gradleak: error:")]
    assert len(lines) == 1 and "diverged" in lines[0] and str(out) in lines[0], captured.err
    assert "Traceback" not in captured.err
    m = json.loads((out / "metrics.json").read_text())
    assert m["status"] == "diverged" and len(m["recoveries"]) == 3 and m["divergence"]["retries"] == 3
    rec = load_file(str(out / "reconstruction.safetensors"))
    assert torch.isfinite(rec["images"]).all() and torch.isfinite(rec["candidates"]).all()
    assert (out / "history.csv").is_file() and not state_dir_for(out).exists()


# --------------------------------------------------------------------------- broken state files


@pytest.fixture(scope="module")
def saved_state(tmp_path_factory):
    """An interrupted idlg run (in-process CLI, SIGTERM raised from the observer after step 4)."""
    import gradleak.pipeline.image as runner

    d = tmp_path_factory.mktemp("saved")
    out = d / "run"
    real = runner.PSNRObserver.__call__

    def call(self, iteration, images):
        real(self, iteration, images)
        if iteration == 4:
            signal.raise_signal(signal.SIGTERM)

    runner.PSNRObserver.__call__ = call
    try:
        code = main(["attack", "--attack", "idlg", "--iterations", "8", "--no-progress", "--no-paper-metrics",
                     "--log-every", "1", "--checkpoint-every", "3", "--out", str(out)])
    finally:
        runner.PSNRObserver.__call__ = real
    assert code == 128 + signal.SIGTERM
    assert not out.exists() and (state_dir_for(out) / "state.json").is_file()
    return out


def _copy_state(saved_state: Path, tmp_path: Path) -> tuple[Path, Path]:
    import shutil

    out = tmp_path / "run"
    shutil.copytree(state_dir_for(saved_state), state_dir_for(out))
    cfg = state_dir_for(out) / "config.json"
    cfg.write_text(cfg.read_text().replace(str(saved_state), str(out)))
    return out, state_dir_for(out)


def expect_one_line_error(args, capsys, *needles):
    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("gradleak: error:"), err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def test_resume_of_the_saved_state_finishes_like_an_uninterrupted_run(saved_state, tmp_path, capsys):
    out, state = _copy_state(saved_state, tmp_path)
    assert main(["attack", "--resume", str(out), "--threads", "1"]) == 0
    assert main(["attack", "--attack", "idlg", "--iterations", "8", "--no-progress", "--no-paper-metrics",
                 "--log-every", "1", "--threads", "1", "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    # it continued from the saved step, not from the start (the comparison below ignores resumed_at)
    assert json.loads((out / "metrics.json").read_text())["resumed_at"] == [{"phase": "trial-0", "iteration": 4}]
    _finished_equal(out, tmp_path / "b")
    # the PSNR observed before the interruption is in the history too
    rows = (out / "history.csv").read_text().splitlines()[1:]
    assert len(rows) == 8 and all(r.split(",")[2] for r in rows)
    expect_one_line_error(["attack", "--resume", out], capsys, "finished run folder")


@pytest.mark.parametrize("damage", ["truncated tensors", "flipped tensor byte", "garbage manifest",
                                    "truncated manifest", "wrong format", "missing tensors", "path in manifest",
                                    "bad placeholder", "wrong shape", "deeply nested", "missing config",
                                    "no state"])
def test_broken_state_gives_one_line_and_exit_2(saved_state, tmp_path, capsys, damage):
    out, state = _copy_state(saved_state, tmp_path)
    manifest = json.loads((state / "state.json").read_text())
    tensors = state / manifest["tensors"]
    if damage == "truncated tensors":
        tensors.write_bytes(tensors.read_bytes()[:100])
    elif damage == "flipped tensor byte":
        data = bytearray(tensors.read_bytes())
        data[-5] ^= 0xFF
        tensors.write_bytes(bytes(data))
    elif damage == "garbage manifest":
        (state / "state.json").write_bytes(os.urandom(64))
    elif damage == "truncated manifest":
        (state / "state.json").write_text((state / "state.json").read_text()[:200])
    elif damage == "wrong format":
        manifest["format"] = "something else"
        (state / "state.json").write_text(json.dumps(manifest))
    elif damage == "missing tensors":
        tensors.unlink()
    elif damage == "path in manifest":
        manifest["tensors"] = "../../etc/passwd"
        (state / "state.json").write_text(json.dumps(manifest))
    elif damage == "bad placeholder":
        manifest["state"]["loop"]["variables"] = [{"$tensor": "nope"}]
        (state / "state.json").write_text(json.dumps(manifest))
    elif damage == "wrong shape":  # a consistent file whose candidates do not fit the model
        from safetensors.torch import save as st_save

        t = load_file(str(tensors))
        t["loop/variables/0"] = torch.zeros(1, 3, 8, 8, dtype=torch.float64)
        data = st_save(t)
        tensors.write_bytes(data)
        import hashlib

        manifest.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        (state / "state.json").write_text(json.dumps(manifest))
    elif damage == "deeply nested":
        (state / "state.json").write_text(json.dumps(manifest)[:-1] + ', "x": ' + "[" * 200_000 + "]" * 200_000 + "}")
    elif damage == "missing config":
        (state / "config.json").unlink()
    elif damage == "no state":
        import shutil

        shutil.rmtree(state)
    expect_one_line_error(["attack", "--resume", out], capsys)
    assert not out.exists()


def test_resume_rejects_changed_options_and_fresh_runs_do_not_clobber_state(saved_state, tmp_path, capsys):
    out, state = _copy_state(saved_state, tmp_path)
    expect_one_line_error(["attack", "--resume", out, "--lr", "0.5"], capsys, "--lr cannot be given with --resume")
    expect_one_line_error(["attack", "--attack", "idlg", "--iterations", "8", "--out", out], capsys,
                          "--resume", str(state))
    assert (state / "state.json").is_file()


def test_load_state_checks_before_use(saved_state, tmp_path):
    snap = load_state(state_dir_for(saved_state))
    assert snap.phase == "trial-0" and snap.step == 4
    assert set(snap.tree) == {"loop", "attack", "providers", "session"}
    assert all(not k.endswith(".pkl") for k in os.listdir(state_dir_for(saved_state)))
    with pytest.raises(StateFileError):
        load_state(tmp_path)
