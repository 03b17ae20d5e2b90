"""examples/flower_guarded_app.py: the example federation with guarded clients, on Flower's
simulation engine (a local Ray on loopback; one Ray at a time: conftest.ray_lock)."""

import csv
import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from conftest import ray_lock  # noqa: E402

PATH = Path(__file__).resolve().parents[2] / "examples" / "flower_guarded_app.py"


def example():
    spec = importlib.util.spec_from_file_location("gradleak_example_flower_guarded_app", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def guard_rows(out):
    with open(out / "guard.csv", newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("argv", [["--policy", "drop"], ["--budget", "0"], ["--schedule", "1,x"],
                                  ["--schedule", "3,1"], ["--server", "evil"], ["--rounds", "0"]])
def test_bad_flags_are_one_line_and_exit_2(argv, tmp_path, capsys):
    assert example().main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("flower_guarded_app: ") and "\n" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow   # ~60 s: Flower's simulation on Ray
def test_a_trap_server_is_refused_before_training_and_the_server_receives_nothing(tmp_path):
    out = tmp_path / "trap"
    with ray_lock():
        assert example().main(["--policy", "report", "--server", "trap", "--rounds", "1", "--clients", "2",
                               "--out", str(out), "--no-progress"]) == 0
    rows = guard_rows(out)
    assert sorted(r["client"] for r in rows) == ["0", "1"]
    assert all(r["decision"] == "refused model" and r["train_seconds"] == "0.0" for r in rows)
    assert all("fl.inspect flags the received model" in r["reason"] for r in rows)
    record = json.loads((out / "federation.json").read_text())
    assert record["audit"] == []          # no update reached the server
    assert (out / "audit" / "audit.csv").read_text().count("\n") == 1   # the header only


@pytest.mark.slow
def test_noise_remedies_every_leaking_update_and_the_server_side_audit_finds_none_leaked(tmp_path):
    out = tmp_path / "noise"
    with ray_lock():
        assert example().main(["--policy", "noise", "--rounds", "1", "--clients", "2", "--iterations", "50",
                               "--out", str(out), "--no-progress"]) == 0
    rows = guard_rows(out)
    assert len(rows) == 2 and all(r["verdict_before"] == "leaked" for r in rows)
    assert all(r["decision"] in ("remedied", "withheld") for r in rows)
    assert any(r["decision"] == "remedied" and r["verdict_after"] == "defended" for r in rows)
    audit = json.loads((out / "federation.json").read_text())["audit"]
    assert len(audit) == sum(r["decision"] == "remedied" for r in rows)
    assert audit and all(a["verdict"] != "leaked" for a in audit)


def _run(tmp_path, name, policy):
    out = tmp_path / name
    with ray_lock():
        assert example().main(["--policy", policy, "--rounds", "1", "--clients", "2", "--iterations", "50",
                               "--out", str(out), "--no-progress"]) == 0
    return out, json.loads((out / "federation.json").read_text())


@pytest.mark.slow   # ~90 s: Flower's simulation on Ray, one guard check per client
def test_withhold_sends_no_leaking_update(tmp_path):
    out, record = _run(tmp_path, "withhold", "withhold")
    rows = guard_rows(out)
    assert sorted(r["client"] for r in rows) == ["0", "1"]
    assert all(r["verdict_before"] == "leaked" and r["decision"] == "withheld" for r in rows)
    assert all(r["verdict_after"] == "" and r["noise_multiplier"] == "" for r in rows)
    assert record["audit"] == []          # nothing reached the server: nothing leaked to it
    assert (out / "audit" / "audit.csv").read_text().count("\n") == 1
    assert record["accuracy"]["1"] == record["accuracy"]["0"]   # the global model did not move


@pytest.mark.slow   # ~2 min: two federations (unguarded, report)
def test_report_changes_nothing_but_records(tmp_path):
    _, plain = _run(tmp_path, "plain", "none")
    out, report = _run(tmp_path, "report", "report")
    rows = guard_rows(out)
    assert sorted(r["client"] for r in rows) == ["0", "1"]
    assert all(r["verdict_before"] == "leaked" and r["decision"] == "passed" for r in rows)
    assert all(float(r["seconds"]) > 0 and r["noise_sigma"] == "" for r in rows)
    # the server receives what it receives unguarded: the same updates, rebuilt alike, the same model
    assert report["accuracy"] == plain["accuracy"]
    by_client = {a["client"]: a for a in plain["audit"]}
    assert len(report["audit"]) == len(plain["audit"]) == 2
    for a in report["audit"]:
        assert a["verdict"] == by_client[a["client"]]["verdict"] == "leaked" and float(a["psnr_mean"]) > 40
        assert float(a["psnr_mean"]) == pytest.approx(float(by_client[a["client"]]["psnr_mean"]), abs=1e-6)
