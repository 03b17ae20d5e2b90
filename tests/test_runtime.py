"""gradleak.runtime: the allocator setting the first attack makes (glibc's mmap/trim thresholds).

What it is for is fewer fresh pages per attack step (the kernel zero-fills each on first touch),
so the test counts minor page faults of the same attack in two fresh processes: one with
GRADLEAK_ALLOCATOR=system (glibc's defaults), one tuned. Numbers, not times."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from gradleak import runtime

glibc_only = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="mallopt is glibc's")

_CODE = """
import resource, torch
torch.set_num_threads(1)
from gradleak import runtime
from gradleak.config import make_config
from gradleak.runner import prepare, attack_settings
from gradleak.attacks import run_attack
assert runtime.allocator() == "untouched"
cfg = make_config(attack="ig", model="convnet", batch_size=2, iterations=6, progress=False)
case = prepare(cfg)
s = attack_settings(cfg, torch.device("cpu"))
run_attack("ig", case.update, case.model, s)   # warm-up; the first attack sets the allocator
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
run_attack("ig", case.update, case.model, s)
print(runtime.allocator(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


def _faults(setting: str) -> tuple[str, int]:
    env = {**os.environ, runtime.ENV: setting}
    out = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    state, faults = out.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    return state, int(faults)


@glibc_only
def test_tuned_allocator_halves_page_faults_of_an_attack() -> None:
    system_state, system_faults = _faults("system")
    tuned_state, tuned_faults = _faults("")
    assert system_state == "system" and tuned_state == "glibc tuned"
    # measured here: ~4700 (system) vs ~20 (tuned) faults for these 6 IG steps (convnet, batch 2)
    assert tuned_faults < 0.5 * system_faults, (tuned_faults, system_faults)


def test_opt_out_leaves_the_allocator_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "_state", {})
    monkeypatch.setenv(runtime.ENV, "system")
    assert runtime.allocator() == "untouched"
    assert runtime.tune_allocator() == "system"
    assert runtime.allocator() == "system"
    monkeypatch.delenv(runtime.ENV)
    assert runtime.tune_allocator() == "system"  # once per process: the first decision stays
