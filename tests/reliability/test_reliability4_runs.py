"""Reliability, part 4: signals at the end of a run, and wrong results that were accepted.

* SIGTERM in the last step, during the metrics or while the run folder is written: exit 143 with
  one line, no traceback, and a run folder that is complete, absent or resumable;
* an optimisation attack that took no step never converged (plain and through ``auto``);
* a text truth longer than the model's positions is refused before the work, as --text is;
* a run with ``--preset imagenet`` on an update file reruns from its own config.json.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import refused
from gradleak.config import flat_config
from gradleak.cli import main

FAST = ["--no-progress", "--threads", "1", "--no-paper-metrics"]
TEXT_FAST = ["--no-progress", "--threads", "1"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for key in ("PYTHONSAFEPATH", "PYTHONPATH", "PYTHONWARNINGS"):
        env.pop(key, None)
    return env


# ------------------------------------------------------------------ 1. SIGTERM at the end of a run
# Where the child sends itself SIGTERM (then sleeps, as a busy process would go on): the module
# and function it wraps, and whether it is the n-th call (the loop's finite check runs once per step).
PHASES = {
    "last-step": ("gradleak.engine.loop", "all_finite", 3),     # the 3rd of 3 steps: the last
    "metrics": ("gradleak.pipeline.run", "run_metrics", 1),     # scoring the finished attack
    "writing": ("gradleak.pipeline.record", "history_csv", 1),  # the run folder half-written
}


def _attack_killed_at(phase: str, out: Path) -> subprocess.CompletedProcess[str]:
    module, name, nth = PHASES[phase]
    prog = textwrap.dedent(f"""\
        import importlib, os, signal, sys, time
        mod = importlib.import_module({module!r})
        real, calls = getattr(mod, {name!r}), [0]
        def wrapped(*a, **k):
            calls[0] += 1
            if calls[0] == {nth}:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)
            return real(*a, **k)
        setattr(mod, {name!r}, wrapped)
        from gradleak.cli import main
        sys.exit(main(["attack", "--attack", "idlg", "--iterations", "3", "--no-progress", "--threads", "1",
                       "--no-paper-metrics", "--out", {str(out)!r}]))
        """)
    return subprocess.run([sys.executable, "-c", prog], cwd=out.parent, env=_env(), capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("phase", sorted(PHASES))
def test_sigterm_at_the_end_of_an_attack_exits_143_with_its_line(tmp_path, phase):
    out = tmp_path / "run"
    proc = _attack_killed_at(phase, out)
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, proc.stderr[-3000:])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gradleak: interrupted (SIGTERM)"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not out.exists()                                               # never a half-written run folder
    assert [p.name for p in tmp_path.iterdir() if ".partial-" in p.name] == []
    state = tmp_path / ".run.state"
    if phase != "last-step":   # no checkpoint was due in 3 steps: nothing to resume, nothing left
        assert not state.exists()
        return
    # the last step's state was saved: the run resumes from it and ends as one run would
    assert "--resume" in lines[0] and (state / "state.json").is_file()
    assert main(["attack", "--resume", str(out), "--no-progress"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["iterations"] == 3 and metrics["resumed_at"][0]["iteration"] == 3
    assert not state.exists()


def test_sigterm_outside_the_loop_is_raised_at_once():
    """In a session's signal block but outside the loop's steps (a closed form, the metrics)
    there is no step to finish: the signal ends the block at once instead of being lost; during
    a step it is only noted (the loop saves its state after the step)."""
    from gradleak.engine import Session
    from gradleak.errors import Terminated

    stepping = Session()
    with stepping.signals(), stepping.stepping_block():
        signal.raise_signal(signal.SIGTERM)
    assert stepping.interrupted == signal.SIGTERM
    with pytest.raises(Terminated) as caught, Session().signals():
        signal.raise_signal(signal.SIGTERM)
        pytest.fail("the signal was lost")
    assert caught.value.exit_code == 143


# ------------------------------------------------------------------ 2. no step, no convergence
@pytest.fixture(scope="module")
def batch_update(tmp_path_factory) -> Path:
    """A FedSGD update of 4 CIFAR images on the DLG LeNet, without its truth: a random start
    already scores ~0.15 there, under GradInversion's 0.4 line."""
    path = tmp_path_factory.mktemp("upd") / "u4.safetensors"
    assert main(["share", "--batch-size", "4", "--out", str(path)]) == 0
    return path


@pytest.mark.parametrize("attack", [["--attack", "gradinversion"], ["--attack", "auto", "--fallback", "gradinversion"]])
def test_an_attack_that_took_no_step_never_converged(tmp_path, batch_update, attack, capsys):
    out = tmp_path / "r"
    assert main(["attack", "--update", str(batch_update), *attack, "--iterations", "0", *FAST, "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["iterations"] == 0
    assert metrics["converged"] is False and metrics["verdict"] == "inconclusive", metrics["verdict_reason"]
    assert metrics["relative_gradient_distance"] is None and 0 < metrics["start_relative_distance"] < 0.4
    assert metrics["stop_reason"] == "took no step"
    if "auto" in attack:
        tried = {t["attack"]: t for t in metrics["auto"]["tried"]}
        assert tried["gradinversion"]["converged"] is False
    assert "presumed leaked" not in capsys.readouterr().out


# ------------------------------------------------------------------ 3. truths that do not fit
@pytest.fixture(scope="module")
def text_update(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("text") / "t.safetensors"
    assert main(["share", "--modality", "text", "--text", "the cat sat", "--out", str(path)]) == 0
    return path


def _text_truth(path: Path, tokens: int) -> Path:
    import torch

    from gradleak.fl import save_truth
    from gradleak.text.data import TextBatch

    ids = torch.full((1, tokens), 1000, dtype=torch.long)
    ids[0, 0], ids[0, -1] = 101, 102
    save_truth(TextBatch(sentences=("x",), input_ids=ids, attention_mask=torch.ones_like(ids),
                              labels=torch.zeros(1, dtype=torch.long)), path)
    return path


@pytest.mark.parametrize("tokens", [65, 200_000])
def test_a_text_truth_longer_than_the_models_positions_is_refused(tmp_path, text_update, tokens, capsys):
    truth = _text_truth(tmp_path / "truth.safetensors", tokens)
    out = tmp_path / "r"
    refused(["attack", "--modality", "text", "--update", text_update, "--truth", truth, *TEXT_FAST, "--out", out], capsys,
            f"truth sentences of {tokens} tokens", "at most 64")
    assert not out.exists() and not (tmp_path / ".r.state").exists()


def test_a_text_update_whose_input_shape_does_not_fit_its_model_is_refused(tmp_path, text_update, capsys):
    from conftest import rewrite_update

    lying = tmp_path / "lying.safetensors"

    def lie(md: dict) -> None:
        md["meta"] = json.dumps({**json.loads(md["meta"]), "input_shape": [128, 1, 1]})

    rewrite_update(text_update, lying, meta_fn=lie)
    refused(["attack", "--modality", "text", "--update", lying, *TEXT_FAST, "--out", tmp_path / "r"], capsys,
            "input_shape", "at most 64 tokens")


# ------------------------------------------------------------------ 4. a preset run reruns from its record
def test_a_preset_run_on_an_update_file_reruns_from_its_config(tmp_path, capsys):
    update = tmp_path / "u.safetensors"
    assert main(["share", "--out", str(update)]) == 0
    first, second = tmp_path / "a", tmp_path / "b"
    assert main(["attack", "--update", str(update), "--preset", "imagenet", "--iterations", "2", *FAST,
                 "--out", str(first)]) == 0
    recorded = flat_config(json.loads((first / "config.json").read_text()))
    assert recorded["preset"] == "imagenet" and recorded["attack"] == "gradinversion"
    assert recorded["data"] != "imagenet-samples" and recorded["model"] == "lenet-dlg"   # the file's, not the preset's
    assert main(["attack", "--config", str(first / "config.json"), "--out", str(second)]) == 0
    again = flat_config(json.loads((second / "config.json").read_text()))
    assert {k: v for k, v in again.items() if k != "out"} == {k: v for k, v in recorded.items() if k != "out"}
    a, b = (json.loads((d / "metrics.json").read_text()) for d in (first, second))
    assert a["relative_gradient_distance"] == b["relative_gradient_distance"]
