"""The client's local-training flags (issue 59) in every entry point: `share`, `attack` (its
simulated client), sweeps and the Python API refuse each value out of range, or a flag that does
not apply, with one line and exit status 2 (a ConfigError in the API), before any work; a sweep
cell and the API carry the flags into the update's record."""

from __future__ import annotations

import pytest

from conftest import refused

FEDAVG = ["--threat", "fedavg", "--batch-size", "2", "--model", "lenet-dlg", "--data", "cifar10-samples"]

BAD = [
    (["--local-epochs", "0"], "local_epochs"), (["--local-epochs", "1001"], "local_epochs"),
    (["--local-epochs", "2", "--local-steps", "4"], "--local-steps"),
    (["--local-optimizer", "rmsprop"], "local_optimizer"),
    (["--local-momentum", "1"], "local_momentum"), (["--local-momentum", "-0.5"], "local_momentum"),
    (["--local-momentum", "nan"], "local_momentum"),
    (["--local-nesterov"], "local_nesterov needs a local_momentum"),
    (["--local-optimizer", "adam", "--local-momentum", "0.9"], "apply to --local-optimizer sgd"),
    (["--local-weight-decay", "-1"], "local_weight_decay"), (["--local-weight-decay", "1.5"], "local_weight_decay"),
    (["--local-optimizer", "adam", "--local-betas", "0.9,1.0"], "local_betas"),
    (["--local-optimizer", "adam", "--local-betas", "0.9"], "local_betas"),
    (["--local-optimizer", "adam", "--local-eps", "0"], "local_eps"),
    (["--local-augment", "rotate"], "local_augment"), (["--local-crop-padding", "65"], "local_crop_padding"),
    (["--local-crop-padding", "-1"], "local_crop_padding"),
    (["--local-batch-size", "3"], "local_batch_size"),
]


@pytest.mark.parametrize("command", ["share", "attack"])
@pytest.mark.parametrize("flags, named", BAD, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_bad_local_flag_is_one_line_and_exit_2(command, flags, named, tmp_path, capsys):
    out = ["--out", str(tmp_path / ("u.safetensors" if command == "share" else "run"))]
    refused([command, *FEDAVG, *flags, *out], capsys, named)
    assert not list(tmp_path.iterdir())   # nothing written


@pytest.mark.parametrize("flags", [["--local-momentum", "0.9"], ["--local-epochs", "2"], ["--local-augment", "flip"]])
def test_a_local_flag_under_fedsgd_is_refused(flags, tmp_path, capsys):
    refused(["share", "--model", "lenet-dlg", "--data", "cifar10-samples", *flags, "--out", str(tmp_path / "u")],
            capsys, "fedavg")


def test_the_api_and_a_sweep_refuse_and_carry_the_flags():
    from gradleak.config import make_config
    from gradleak.errors import ConfigError
    from gradleak.pipeline import build_case
    from gradleak.sweep.spec import parse_spec

    with pytest.raises(ConfigError, match="local_momentum"):
        make_config(threat="fedavg", local_momentum=1.0)
    with pytest.raises(ConfigError, match="local_momentum"):
        parse_spec({"base": {"attack": "ig", "threat": "fedavg", "batch_size": 2}, "grid": {"local_momentum": [0.5, 2]}})
    cells = parse_spec({"base": {"attack": "ig", "threat": "fedavg", "batch_size": 2, "model": "lenet-dlg",
                                 "data": "cifar10-samples", "local_epochs": 2, "local_batch_size": 1,
                                 "local_weight_decay": 5e-4},
                        "grid": {"local_momentum": [0.0, 0.9]}}).cells
    records = [build_case(make_config(**{k: v for k, v in c.config.items() if v is not None})).update.meta.threat
               for c in cells]
    assert [r.get("local_momentum") for r in records] == [0.0, 0.9]
    assert all(r["local_epochs"] == 2 and r["local_steps"] == 4 and r["local_weight_decay"] == 5e-4 for r in records)
