"""gradleak.runtime: the allocator setting the first attack makes (glibc's mmap/trim thresholds),
devices, and IEEE float32 during attacks (gradleak.engine.precision).

What the allocator setting is for is fewer fresh pages per attack step; how many fewer (minor page
faults of the same attack with and without it) is measured by benchmarks/checks.py, not here: a
count of page faults depends on the machine. The test here checks what the setting does, which is
the same on every glibc: after the first attack, a block below 32 MiB comes from the heap instead
of its own mmap; with GRADLEAK_ALLOCATOR=system it is still mmapped."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from gradleak import runtime
from gradleak.engine import precision

glibc_only = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="mallopt is glibc's")

# A fresh process: one tiny attack (the first attack sets the allocator), then a 24 MiB malloc. glibc's
# default mmap threshold starts at 128 KiB and grows only when an mmapped block is freed, so without
# the setting this block is mmapped (mallinfo2's hblkhd grows by 24 MiB); with it (threshold 32 MiB)
# it comes from the heap.
_CODE = """
import ctypes, torch
torch.set_num_threads(1)
from gradleak import runtime
from gradleak.config import make_config
from gradleak.pipeline import build_case as prepare
from gradleak.attacks import Engine
class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
if not hasattr(libc, "mallinfo2"):
    print("no-mallinfo2 0")
    raise SystemExit
libc.mallinfo2.restype = Mallinfo2
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
before_attack = runtime.allocator()
cfg = make_config(attack="idlg", iterations=1, progress=False)
case = prepare(cfg)
Engine().run(case.attack_config(cfg), case.update, case.model)
mapped = libc.mallinfo2().hblkhd
block = libc.malloc(24 << 20)
mapped = libc.mallinfo2().hblkhd - mapped
libc.free(block)
print(before_attack, runtime.allocator().replace(" ", "_"), mapped >> 20)
"""


def _large_block(setting: str) -> tuple[str, str, int]:
    """(allocator before the first attack, after it, MiB of the 24 MiB block that were mmapped)."""
    # glibc's own MALLOC_* variables or a preloaded allocator would decide the outcome instead
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    env[runtime.ENV] = setting
    out = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    fields = out.stdout.strip().splitlines()[-1].split()
    if fields[0] == "no-mallinfo2":
        pytest.skip("glibc < 2.33 has no mallinfo2")
    before, after, mib = fields
    return before, after.replace("_", " "), int(mib)


@glibc_only
def test_first_attack_serves_large_blocks_from_the_heap() -> None:
    assert _large_block("") == ("untouched", "glibc tuned", 0)
    assert _large_block("system") == ("untouched", "system", 24)


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
    """device="auto" through the API (AttackSettings(device="auto") used to reach
    torch.device("auto") inside the attacks)."""
    import torch

    from gradleak.attacks import Engine, resolve_attack
    from gradleak.config import make_config
    from gradleak.pipeline import attack_update
    from gradleak.pipeline import build_case as prepare

    case = prepare(make_config(attack="idlg", progress=False))
    rec = attack_update(case.update, case.model, "idlg", iterations=1, device="auto")
    assert rec.iterations == 1 and torch.isfinite(rec.images).all()
    cfg = resolve_attack({"attack": "idlg", "seed": 0, "iterations": 1}, bn_statistics_shared=True)
    rec = Engine(device="auto").run(cfg, case.update, case.model)
    assert rec.iterations == 1 and torch.isfinite(rec.images).all()


def test_ieee_float32_sets_and_restores_cuda_precision_flags() -> None:
    import torch

    conv, matmul = torch.backends.cudnn.conv, torch.backends.cuda.matmul
    before = (conv.fp32_precision, matmul.fp32_precision)
    with precision.ieee_float32(torch.device("cpu")):
        assert (conv.fp32_precision, matmul.fp32_precision) == before  # nothing on a CPU
    legacy = (torch.backends.cudnn.allow_tf32, matmul.allow_tf32)
    with precision.ieee_float32(torch.device("cuda")):  # the flags exist without a GPU
        assert (torch.backends.cudnn.allow_tf32, matmul.allow_tf32) == (False, False)  # readable inside
        assert conv.fp32_precision != "tf32" and matmul.fp32_precision == "ieee"
    # back as before (torch may spell an unchanged matmul setting "none" or "ieee": the same precision)
    assert conv.fp32_precision == before[0] and (torch.backends.cudnn.allow_tf32, matmul.allow_tf32) == legacy
    with pytest.raises(RuntimeError, match="boom"), precision.ieee_float32(torch.device("cuda")):
        raise RuntimeError("boom")
    assert conv.fp32_precision == before[0] and (torch.backends.cudnn.allow_tf32, matmul.allow_tf32) == legacy
    # flags set through the new per-backend API (the legacy view cannot be read): that API is used
    conv.fp32_precision = "tf32"
    torch.backends.cudnn.rnn.fp32_precision = "ieee"
    try:
        with pytest.raises(RuntimeError):
            torch.backends.cudnn.allow_tf32  # noqa: B018 (torch refuses the legacy read here)
        with precision.ieee_float32(torch.device("cuda")):
            assert conv.fp32_precision == "ieee" and matmul.fp32_precision == "ieee"
        assert conv.fp32_precision == "tf32"
    finally:
        torch.backends.cudnn.allow_tf32 = legacy[0]
        matmul.allow_tf32 = legacy[1]


def test_every_attack_runs_under_ieee_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each attack entry point (DLG, iDLG, Inverting Gradients, GradInversion through Engine.run,
    text DLG) runs its optimisation inside engine.precision.ieee_float32 on its own device, when called
    through the API as much as through the runner: the context is entered once per attack, and the attack's
    observer, called from inside its loop, sees it open."""
    import contextlib

    import torch

    from gradleak.config import make_config
    from gradleak.pipeline import attack_update
    from gradleak.pipeline import build_case as prepare

    entered: list[torch.device] = []
    depth = [0]
    seen: dict[str, list[bool]] = {}

    @contextlib.contextmanager
    def record(device: torch.device):  # noqa: ANN202
        entered.append(device)
        depth[0] += 1
        try:
            yield
        finally:
            depth[0] -= 1

    def observer(name: str):  # noqa: ANN202
        return lambda *_: seen.setdefault(name, []).append(depth[0] == 1)

    monkeypatch.setattr(precision, "ieee_float32", record)  # what text's attack_precision calls
    import gradleak.engine.core as engine_core  # Engine.run, which runs every image attack, holds its own binding

    monkeypatch.setattr(engine_core, "ieee_float32", record)
    case = prepare(make_config(model="convnet", width=4, batch_size=1, share_bn_statistics=True, progress=False))
    names = ("dlg", "idlg", "ig", "gradinversion")
    for name in names:
        flags = {"ig": {"restarts": 1}, "gradinversion": {"seeds": 1}}.get(name, {})
        attack_update(case.update, case.model, name, iterations=2, log_every=1, observer=observer(name), **flags)
    pytest.importorskip("tokenizers")
    from gradleak.fl.threats import ThreatModel
    from gradleak.text import build_text_model, run_text_attack, text_batch, text_share

    tiny = build_text_model("tiny-transformer", seed=0)
    update = text_share(tiny, text_batch(["a short sentence"], tiny, 1, 0), ThreatModel())
    run_text_attack("dlg", update, tiny, iterations=2, log_every=1, search_evaluations=0,
                    observer=observer("text"))
    assert entered == [torch.device("cpu")] * 5 and depth[0] == 0
    assert set(seen) == {*names, "text"} and all(all(v) for v in seen.values()), seen


# ---------------------------------------------------------------- threads on a busy machine
def test_threads_for_takes_the_idle_cores_at_least_one() -> None:
    from gradleak.runtime import threads_for

    assert threads_for(None, 2, 2) == 2          # unknown load: torch's choice
    assert threads_for(0.1, 2, 2) == 2           # idle machine
    assert threads_for(1.0, 2, 2) == 1           # one core busy elsewhere
    assert threads_for(2.0, 2, 2) == 1           # all busy: still one
    assert threads_for(3.4, 16, 16) == 13        # rounded idle cores
    assert threads_for(0.0, 16, 4) == 4          # never more than torch's default


def test_busy_cores_sees_another_process_spinning() -> None:
    import os
    import subprocess
    import sys

    from gradleak.runtime import busy_cores

    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat")
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = busy_cores(0.5)
    finally:
        spin.kill()
        spin.wait()
    assert busy is not None and 0.7 <= busy <= (os.cpu_count() or 1) + 1e-9


def test_attack_records_the_threads_it_chose_for_a_busy_machine(tmp_path, monkeypatch, capsys) -> None:
    import json

    import torch

    import gradleak.runtime as runtime
    from gradleak.cli import main

    before = torch.get_num_threads()
    monkeypatch.setattr(runtime, "threads_on_busy_machine", lambda: (1, "2.0 of 2 cores busy with other work: 1 "
                                                                     "torch thread instead of 2"))
    try:
        assert main(["attack", "--iterations", "2", "--no-progress", "--out", str(tmp_path / "r")]) == 0
        out = capsys.readouterr()
        assert "note: 2.0 of 2 cores busy" in out.out.splitlines()[-1] and "note" not in out.err  # after the results
        assert json.loads((tmp_path / "r" / "config.json").read_text())["run"]["threads"] == 1
        # given --threads: never measured, never changed
        monkeypatch.setattr(runtime, "threads_on_busy_machine", lambda: pytest.fail("measured although given"))
        assert main(["attack", "--iterations", "2", "--no-progress", "--threads", "1",
                     "--out", str(tmp_path / "g")]) == 0
        assert "note" not in capsys.readouterr().out
        # a bad input is still one error line: nothing said before it
        monkeypatch.setattr(runtime, "threads_on_busy_machine", lambda: (1, "busy"))
        assert main(["attack", "--model", "nope", "--no-progress", "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr()
        assert len(err.err.strip().splitlines()) == 1 and err.err.startswith("gradleak: error:") and not err.out
    finally:
        torch.set_num_threads(before)
