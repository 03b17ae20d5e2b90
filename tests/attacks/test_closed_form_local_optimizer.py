"""The closed forms read a one-step FedAvg update as -lr * g: a client whose one step is not that
(Adam, weight decay, Nesterov) is refused with one line; plain SGD with momentum is not (torch's
first momentum step is g itself) and is rebuilt exactly."""

import json

import pytest

from conftest import refused
from gradleak.cli import main
from gradleak.errors import ConfigError
from gradleak.fl.threats import ThreatModel


@pytest.mark.parametrize("kwargs, refused", [
    ({"local_optimizer": "adam"}, "sign(g)"), ({"local_optimizer": "adamw"}, "sign(g)"),
    ({"local_weight_decay": 5e-4}, "wd * w0"), ({"local_momentum": 0.9, "local_nesterov": True}, "(1 + momentum)"),
    ({"local_momentum": 0.9}, None), ({}, None)])
def test_one_gradient_rule(kwargs, refused):
    threat = ThreatModel(name="fedavg", **kwargs)
    if refused is None:
        threat.check_one_gradient("analytic")
    else:
        with pytest.raises(ConfigError, match="analytic: the closed form") as err:
            threat.check_one_gradient("analytic")
        assert refused in str(err.value)
    ThreatModel(name="fedsgd").check_one_gradient("analytic")   # a gradient is a gradient


def test_analytic_on_adam_and_momentum_clients(tmp_path, capsys):
    for name, flags in (("adam", ["--local-optimizer", "adam"]), ("momentum", ["--local-momentum", "0.9"])):
        assert main(["share", "--model", "mlp", "--width", "64", "--batch-size", "1", "--threat", "fedavg",
                     "--local-steps", "1", *flags, "--out", str(tmp_path / f"{name}.safetensors"),
                     "--truth", str(tmp_path / f"{name}.truth.safetensors")]) == 0
    capsys.readouterr()
    refused(["attack", "--update", tmp_path / "adam.safetensors", "--attack", "analytic", "--no-progress",
             "--out", tmp_path / "r-adam"], capsys, "analytic: the closed form", "sign(g)")
    assert not (tmp_path / "r-adam").exists()
    assert main(["attack", "--update", str(tmp_path / "momentum.safetensors"), "--attack", "analytic",
                 "--truth", str(tmp_path / "momentum.truth.safetensors"), "--no-progress",
                 "--out", str(tmp_path / "r-mom")]) == 0
    metrics = json.loads((tmp_path / "r-mom" / "metrics.json").read_text())
    assert metrics["psnr_mean"] > 60, metrics["psnr_mean"]
