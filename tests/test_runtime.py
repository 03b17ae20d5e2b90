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
    # glibc's own MALLOC_* variables or a preloaded allocator would decide the outcome instead
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    env[runtime.ENV] = setting
    out = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    state, faults = out.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    return state, int(faults)


@glibc_only
def test_tuned_allocator_halves_page_faults_of_an_attack() -> None:
    system_state, system_faults = _faults("system")
    tuned_state, tuned_faults = _faults("")
    assert system_state == "system" and tuned_state == "glibc tuned"
    # measured here: ~4700-9400 (system) vs ~20-300 (tuned) faults for these 6 IG steps (convnet, batch 2)
    assert tuned_faults < 0.5 * system_faults, (tuned_faults, system_faults)


def test_opt_out_leaves_the_allocator_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "_state", {})
    monkeypatch.setenv(runtime.ENV, "system")
    assert runtime.allocator() == "untouched"
    assert runtime.tune_allocator() == "system"
    assert runtime.allocator() == "system"
    monkeypatch.delenv(runtime.ENV)
    assert runtime.tune_allocator() == "system"  # once per process: the first decision stays


# ---------------------------------------------------------------------- device and float32 precision
def test_resolve_device_names_and_clear_errors() -> None:
    import torch

    from gradleak.errors import ConfigError

    assert runtime.resolve_device("cpu") == torch.device("cpu")
    assert runtime.resolve_device(torch.device("cpu")) == torch.device("cpu")
    assert runtime.resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigError, match="unknown 'gpu0'"):
        runtime.resolve_device("gpu0")
    with pytest.raises(ConfigError, match="not supported"):
        runtime.resolve_device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no GPU is available"):
            runtime.resolve_device("cuda:0")
    else:
        with pytest.raises(ConfigError, match="does not exist"):
            runtime.resolve_device(f"cuda:{torch.cuda.device_count()}")


def test_attack_settings_accept_auto_through_the_api() -> None:
    """AttackSettings(device="auto") used to reach torch.device("auto") inside the attacks."""
    import torch

    from gradleak.attacks import AttackSettings, run_attack
    from gradleak.config import make_config
    from gradleak.runner import prepare

    case = prepare(make_config(attack="idlg", progress=False))
    rec = run_attack("idlg", case.update, case.model, AttackSettings(iterations=1, device="auto"))
    assert rec.iterations == 1 and torch.isfinite(rec.images).all()


def test_ieee_float32_sets_and_restores_cuda_precision_flags() -> None:
    import torch

    conv, matmul = torch.backends.cudnn.conv, torch.backends.cuda.matmul
    before = (conv.fp32_precision, matmul.fp32_precision)
    with runtime.ieee_float32(torch.device("cpu")):
        assert (conv.fp32_precision, matmul.fp32_precision) == before  # nothing on a CPU
    legacy = (torch.backends.cudnn.allow_tf32, matmul.allow_tf32)
    with runtime.ieee_float32(torch.device("cuda")):  # the flags exist without a GPU
        assert (torch.backends.cudnn.allow_tf32, matmul.allow_tf32) == (False, False)  # readable inside
        assert conv.fp32_precision != "tf32" and matmul.fp32_precision == "ieee"
    # back as before (torch may spell an unchanged matmul setting "none" or "ieee": the same precision)
    assert conv.fp32_precision == before[0] and (torch.backends.cudnn.allow_tf32, matmul.allow_tf32) == legacy
    with pytest.raises(RuntimeError, match="boom"), runtime.ieee_float32(torch.device("cuda")):
        raise RuntimeError("boom")
    assert conv.fp32_precision == before[0] and (torch.backends.cudnn.allow_tf32, matmul.allow_tf32) == legacy
    # flags set through the new per-backend API (the legacy view cannot be read): that API is used
    conv.fp32_precision = "tf32"
    torch.backends.cudnn.rnn.fp32_precision = "ieee"
    try:
        with pytest.raises(RuntimeError):
            torch.backends.cudnn.allow_tf32  # noqa: B018 (torch refuses the legacy read here)
        with runtime.ieee_float32(torch.device("cuda")):
            assert conv.fp32_precision == "ieee" and matmul.fp32_precision == "ieee"
        assert conv.fp32_precision == "tf32"
    finally:
        torch.backends.cudnn.allow_tf32 = legacy[0]
        matmul.allow_tf32 = legacy[1]


def test_every_attack_runs_under_ieee_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each attack entry point enters runtime.ieee_float32 on its own device (so direct API
    calls get it too, not only the runner's)."""
    import contextlib

    import torch

    from gradleak.attacks import AttackSettings, run_attack
    from gradleak.attacks.dlg import _run
    from gradleak.attacks.gradinversion import gradinversion
    from gradleak.attacks.ig import inverting_gradients
    from gradleak.config import make_config
    from gradleak.runner import prepare
    from gradleak.text.attacks import dlg_text

    wrapper_code = runtime.attack_precision(lambda *a: None).__code__
    for fn in (_run, gradinversion, inverting_gradients, dlg_text):
        assert fn.__code__ is wrapper_code, fn.__name__
    entered: list[torch.device] = []

    @contextlib.contextmanager
    def record(device: torch.device):  # noqa: ANN202
        entered.append(device)
        yield

    monkeypatch.setattr(runtime, "ieee_float32", record)
    case = prepare(make_config(model="convnet", width=4, batch_size=1, share_bn_statistics=True, progress=False))
    for name in ("dlg", "ig", "gradinversion"):
        run_attack(name, case.update, case.model, AttackSettings(iterations=1, seeds=1 if name != "dlg" else None))
    assert entered == [torch.device("cpu")] * 3
