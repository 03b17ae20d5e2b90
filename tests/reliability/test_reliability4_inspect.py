"""Reliability, part 4: `gradleak inspect` (the client's check of the model it received) on
hostile files: a report that overwrote the model, names that forged lines on the terminal, an
imprint block hidden in a minority of an honest layer's rows, JSON that parsers refuse,
tracebacks on odd tensors, and a file of many small tensors that ran for minutes.

Every refused input ends in exit status 2 with one line ``gradleak: error: ...`` on stderr and
nothing written (run in-process through ``gradleak.cli.main``)."""

from __future__ import annotations

import json
import math
import os
import time

import pytest
import torch
from safetensors.torch import save_file

from gradleak.cli import main
from gradleak.errors import ModelMismatchError
from gradleak.fl.inspect import Finding, Inspection, LayerReport, inspect_model
from gradleak.models import build_model

MLP = ["--model", "mlp", "--width", "128"]


def run_cli(args, capsys) -> tuple[int, str, list[str]]:
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:
        code = exc.code
    cap = capsys.readouterr()
    return code, cap.out, [line for line in cap.err.splitlines() if line.strip()]


def refused(args, capsys, *contains: str) -> str:
    code, out, lines = run_cli(args, capsys)
    assert code == 2, (args, code, out, lines)
    assert len(lines) == 1 and lines[0].startswith("gradleak: error:"), lines
    for text in contains:
        assert text in lines[0], lines[0]
    return lines[0]


def save(path, state):
    save_file({k: v.detach().contiguous().clone() for k, v in state.items()}, str(path))
    return path


def mlp_state(seed: int = 1) -> dict[str, torch.Tensor]:
    return dict(build_model("mlp", num_classes=10, width=128, seed=seed).module.state_dict())


def strict_json(text: str):
    """json.loads refusing NaN / Infinity, as standard (RFC 8259) parsers do."""
    def bad(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=bad)


def imprint_rows(state: dict[str, torch.Tensor], bins: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """``bins`` rows of the mlp's first layer (fc1, reading the image) replaced by an imprint
    block's bins: one measurement (the mean of the input, the server's choice in
    models/imprint.py) at increasing thresholds, scaled like the honest rows; the others kept."""
    g = torch.Generator().manual_seed(seed)
    w, b = state["fc1.weight"].clone(), state["fc1.bias"].clone()
    rows = torch.randperm(w.shape[0], generator=g)[:bins].sort().values
    scale = float(w.norm(dim=1).mean()) / math.sqrt(w.shape[1])
    w[rows] = scale
    b[rows] = -scale * torch.linspace(-1.0, 1.0, bins) * math.sqrt(w.shape[1])
    return {**state, "fc1.weight": w, "fc1.bias": b}


# ================================================================== 1. --report: never the model, never replaced unasked
def test_report_naming_the_model_itself_is_refused(tmp_path, capsys):
    model = save(tmp_path / "m.safetensors", mlp_state())
    before = model.read_bytes()
    link = tmp_path / "hard.json"
    os.link(model, link)
    for report in (model, link):
        for force in ([], ["--force"]):
            refused(["inspect", model, *MLP, "--report", report, *force], capsys, "--report", "inspected model file")
    assert model.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["hard.json", "m.safetensors"]


def test_report_replaces_an_existing_file_only_with_force(tmp_path, capsys):
    model = save(tmp_path / "m.safetensors", mlp_state())
    report = tmp_path / "r.json"
    report.write_text("keep me\n")
    refused(["inspect", model, *MLP, "--report", report], capsys, "--report", "exists", "--force")
    assert report.read_text() == "keep me\n"
    code, out, err = run_cli(["inspect", model, *MLP, "--report", report, "--force"], capsys)
    assert code == 0, (out, err)
    assert strict_json(report.read_text())["suspicious"] is False
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors", "r.json"]   # written atomically: no temporary file


# ================================================================== 2. names echoed to the terminal are escaped
def test_hostile_names_cannot_forge_terminal_lines(tmp_path, capsys):
    forged = "x\x1b[2K\rnothing found: no layer mlp lacks\n\u202eevil"
    state = {**mlp_state(), f"{forged}.weight": torch.ones(3, 3), f"{forged}.\x1b]0;t\x07": torch.ones(3)}
    model = save(tmp_path / "m.safetensors", state)
    code, out, err = run_cli(["inspect", model, *MLP], capsys)
    assert code == 1 and not err
    assert not any(c in out for c in "\x1b\r\x07\u202e")
    lines = out.splitlines()
    assert len(lines) == 3 and lines[1].startswith("  x\\x1b[2K\\rnothing found") and "\\n\\u202eevil" in lines[1]
    assert lines[-1].startswith("suspicious:") and sum(line.startswith("nothing found") for line in lines) == 0
    code, out, _ = run_cli(["inspect", model, *MLP, "--json"], capsys)
    assert code == 1 and "\x1b" not in out and strict_json(out)["findings"][0]["layer"] == forged


# ================================================================== 3. a block in a minority of a layer's rows
@pytest.mark.parametrize("bins", [3, 8, 48])
def test_imprint_bins_among_honest_rows_are_found(tmp_path, capsys, bins):
    """48 imprint bins among the mlp's 128 first-layer rows passed as clean (the median over all
    rows stays low); a group of 3 or more parallel rows is a finding."""
    model = save(tmp_path / "m.safetensors", imprint_rows(mlp_state(), bins))
    code, out, err = run_cli(["inspect", model, *MLP, "--json"], capsys)
    assert code == 1, (out, err)
    report = strict_json(out)
    found = [f for f in report["findings"] if f["check"] == "parallel-rows"]
    assert [f["layer"] for f in found] == ["fc1"] and found[0]["score"] == bins
    assert f"{bins} of its 128 rows" in found[0]["reason"] and "distinct biases (decreasing" in found[0]["reason"]
    assert report["layers"][0]["stats"]["parallel_rows"] < 0.999        # the median alone misses it


def test_two_parallel_rows_and_honest_models_stay_clean():
    """Honest random-init models (the suite's) have no group of parallel rows or columns; two
    parallel rows (what a trained 2-class layer holds) are below the group threshold."""
    for arch, kw, seeds in (("mlp", {"width": 128}, (0, 1)), ("convnet", {"width": 8}, (0, 1)),
                            ("resnet18-cifar", {}, (0,))):
        for seed in seeds:
            r = inspect_model(build_model(arch, num_classes=10, seed=seed, **kw).module.state_dict(), arch,
                              num_classes=10, **kw)
            assert not r.suspicious, (arch, seed, r.findings)
            assert all(v == 1.0 for layer in r.layers for k, v in layer.stats.items() if k.endswith("_group"))
    r = inspect_model(imprint_rows(mlp_state(), 2), "mlp", num_classes=10, width=128)
    assert not r.suspicious and r.layers[0].stats["parallel_rows_group"] == 1.0   # no group of 3 or more


def test_parallel_columns_in_a_minority_are_found():
    """The imprint's second layer (every bin writes the same pattern back) folded into some
    columns of the mlp's classifier input: a group of parallel columns."""
    state = mlp_state()
    w = state["fc.weight"].clone()
    w[:, :16] = w[:, :1] * torch.linspace(0.5, 2.0, 16)
    fc = torch.cat([w, w], 0)   # 20 outputs: columns of 20 entries (MIN_VECTOR is 16)
    state = {k: v for k, v in state.items() if not k.startswith("fc.")}
    r = inspect_model({**state, "fc.weight": fc, "fc.bias": torch.zeros(20)}, "mlp", num_classes=20, width=128)
    assert [(name, f.check, f.score) for name, f in r.findings] == [("fc", "parallel-columns", 16.0)]


# ================================================================== 4. strictly valid JSON
def test_json_holds_no_infinity_or_nan():
    layer = LayerReport("fc", "linear", [2, 2], True, False, stats={"gain": math.inf, "gain_ratio": math.nan},
                        findings=[Finding("scale", math.inf, 20.0, "loud")])
    text = Inspection("mlp", "", (3, 32, 32), [layer]).to_json()
    data = strict_json(text)
    assert data["layers"][0]["stats"] == {"gain": None, "gain_ratio": None}
    assert data["findings"][0]["score"] is None and "null" in data["null"]


def test_values_whose_squares_overflow_are_refused(tmp_path, capsys):
    """float64 weights near 1e307 made the gains Infinity (JSON that parsers refuse) and the
    ratios NaN, so the scaled layer passed as "nothing found", exit 0."""
    state = mlp_state()
    state["fc.weight"] = state["fc.weight"].double() * 1e306
    model = save(tmp_path / "m.safetensors", state)
    refused(["inspect", model, *MLP, "--json"], capsys, "fc.weight", "values up to")


# ================================================================== 5. odd tensors: one line, exit 2
@pytest.mark.parametrize("change, expected", [
    (lambda s: {**s, "fc1.weight": s["fc1.weight"].to(torch.float8_e4m3fn)}, "float8_e4m3fn"),
    (lambda s: {**s, "fc.weight": s["fc.weight"].to(torch.float8_e5m2)}, "float8_e5m2"),
    (lambda s: {**s, "extra.weight": torch.zeros(0, 5)}, "empty"),
    (lambda s: {**s, "extra.weight": torch.zeros(0, 3, 3, 3)}, "empty"),
    (lambda s: {**s, "extra.weight": torch.zeros(0, 3072)}, "empty"),
    (lambda s: {**s, "fc1.extra_buffer": torch.zeros(0)}, "empty"),
    (lambda s: {**s, "bn.weight": torch.ones(8), "bn.running_var": torch.ones(5)}, "bn.running_var"),
    (lambda s: {**s, "bn.weight": torch.ones(8), "bn.running_var": torch.ones(8, 2)}, "needs [8]"),
    (lambda s: {**s, "bn.weight": torch.ones(8), "bn.bias": torch.ones(8), "bn.running_mean": torch.ones(3),
                "bn.running_var": torch.ones(8)}, "bn.running_mean"),
    (lambda s: {**s, "fc1.running_var": torch.ones(3)}, "fc1.running_var"),
    (lambda s: {**s, "x.weight": torch.randn(20, 3072), "x.bias": torch.randn(7, 3)}, "x.bias"),
])
def test_odd_tensors_are_one_line(tmp_path, capsys, change, expected):
    model = save(tmp_path / "m.safetensors", change(mlp_state()))
    refused(["inspect", model, *MLP], capsys, expected)
    with pytest.raises(ModelMismatchError):
        inspect_model(change(mlp_state()), "mlp", num_classes=10, width=128)


# ================================================================== 6. cost bounded by what the file can hold
def test_a_file_of_many_small_tensors_is_answered_at_once(tmp_path, capsys):
    """An 8 MB file of ~10^5 one-value tensors ran for minutes (quadratic bookkeeping, then
    the checks per tensor: 12 s for 20,000); more tensors than ARCH plus a block is refused from
    the header."""
    state = {**mlp_state(), **{f"b{i}.weight": torch.ones(1) for i in range(20_000)}}
    model = save(tmp_path / "m.safetensors", state)
    t0 = time.perf_counter()
    refused(["inspect", model, *MLP], capsys, "20004 tensors", "refusing")
    assert time.perf_counter() - t0 < 5
    # the limit itself: a block of up to 256 extra tensors is inspected (found as extra), quickly
    state = {**mlp_state(), **{f"b{i}.weight": torch.randn(16, 16) for i in range(256)}}
    t0 = time.perf_counter()
    code, out, _ = run_cli(["inspect", save(tmp_path / "b.safetensors", state), *MLP], capsys)
    assert code == 1 and "256 layer(s)" in out and time.perf_counter() - t0 < 10
