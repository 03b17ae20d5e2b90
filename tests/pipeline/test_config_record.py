"""config.json's two parts (issue 58): "run", the run's own fields, and "attack", the typed attack
config that ran; flat_config turns them back into the flat flags --config and the dashboard read."""

from __future__ import annotations

import json

import pytest

from gradleak.attacks.configs import resolve_attack
from gradleak.cli import main
from gradleak.config import attack_side_fields, flat_config, load_config, make_config, record_json
from gradleak.errors import ConfigError


def test_the_record_splits_run_and_attack_and_flattens_back():
    cfg = make_config(attack="dlg", iterations=7, batch_size=2)
    attack = resolve_attack(cfg.model_dump(), bn_statistics_shared=False)
    record = record_json(cfg, attack.model_dump(mode="json"))
    assert set(record) == {"run", "attack"}
    assert record["attack"] == attack.model_dump(mode="json") and record["attack"]["iterations"] == 7
    assert not attack_side_fields() & set(record["run"]) and record["run"]["batch_size"] == 2
    flat = flat_config(json.loads(json.dumps(record)))
    assert flat["attack"] == "dlg" and flat["iterations"] == 7 and flat["batch_size"] == 2
    # the flat fields resolve to the same typed config
    again = resolve_attack(make_config(**flat).model_dump(), bn_statistics_shared=False)
    assert again == attack


def test_a_portfolio_flattens_to_the_constants_its_members_share():
    one = {"attack": "auto", "seed": 0, "portfolio": [{"attack": "dlg", "seed": 0, "iterations": 5, "lr": 1.0}]}
    flat = flat_config({"run": {"seed": 0}, "attack": one})
    assert flat["attack"] == "auto" and flat["fallback"] == "dlg" and flat["iterations"] == 5 and flat["lr"] == 1.0
    several = {"attack": "auto", "seed": 0, "portfolio": [{"attack": "dlg", "seed": 0, "iterations": 5, "lr": 1.0},
                                                          {"attack": "ig", "seed": 0, "iterations": 5, "lr": 0.1,
                                                           "restarts": 2}]}
    flat = flat_config({"run": {"seed": 0}, "attack": several})
    assert flat == {"seed": 0, "attack": "auto", "iterations": 5, "restarts": 2}   # lr differs: each its own


def test_an_older_flat_record_is_read_as_it_is():
    assert flat_config({"attack": "dlg", "iterations": 3}) == {"attack": "dlg", "iterations": 3}


@pytest.mark.parametrize("record, message", [
    ({"run": [], "attack": {}}, "must hold JSON objects"),
    ({"run": {"iterations": 3}, "attack": {"attack": "dlg"}}, "belongs under \"attack\""),
    ({"run": {}, "attack": {"attack": "auto", "portfolio": "dlg"}}, "must be a list of attack configs"),
    ({"run": {}, "attack": {"attack": "auto", "portfolio": []}}, "must be a list of attack configs"),
])
def test_a_malformed_record_is_one_config_error(record, message, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(record))
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_a_run_folder_records_both_parts_and_reruns_from_them(tmp_path, capsys):
    args = ["attack", "--attack", "idlg", "--iterations", "4", "--no-progress", "--threads", "1"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    record = json.loads((tmp_path / "a" / "config.json").read_text())
    assert record["attack"]["attack"] == "idlg" and record["attack"]["iterations"] == 4
    assert record["run"]["model"] == "lenet-dlg" and "iterations" not in record["run"]
    assert main(["attack", "--config", str(tmp_path / "a" / "config.json"), "--out", str(tmp_path / "b")]) == 0
    again = json.loads((tmp_path / "b" / "config.json").read_text())
    assert again["attack"] == record["attack"]
    assert {k: v for k, v in again["run"].items() if k != "out"} == {k: v for k, v in record["run"].items()
                                                                       if k != "out"}
    a, b = (json.loads((tmp_path / r / "metrics.json").read_text()) for r in "ab")
    assert a["psnr_mean"] == b["psnr_mean"]
    capsys.readouterr()
