"""The guard API on a real small client: LeNet (DLG's), one Fashion-MNIST image, FedSGD. Each
policy is run for real (auto's closed forms and portfolio, judged with the client's truth)."""

import json
import math

import pytest
import torch

from gradleak.data import open_source
from gradleak.errors import ConfigError
from gradleak.fl import fedsgd
from gradleak.guard import PASSED, REFUSED, REMEDIED, WITHHELD, GuardPolicy, guard_update, noised
from gradleak.models import build_model


@pytest.fixture(scope="module")
def client():
    source = open_source("fashion-mnist")
    from gradleak.data import batch_of

    batch = batch_of(source, [7], 28, source.native_channels)
    model = build_model("lenet-dlg", num_classes=source.num_classes, channels=1, image_size=28, seed=0)
    return model, batch, fedsgd(model, batch)


def sigmas(defenses):
    assert all(d.startswith("gaussian:") for d in defenses)
    return [float(d.split(":", 1)[1]) for d in defenses]


def policy(**kw):
    return GuardPolicy(**{"iterations": 50, "progress": False, "budget_seconds": 90.0, **kw})


def test_report_sends_the_update_unchanged_and_records_the_leak(client, tmp_path):
    model, batch, update = client
    result = guard_update(model, update, batch, policy(action="report"), out=tmp_path, name="c0")
    rec = result.record
    assert result.update is update
    assert rec.decision == PASSED and rec.verdict_before == "leaked" and rec.verdict_after == ""
    before = rec.checks[0]
    assert before.psnr is not None and before.psnr > 40   # a closed form rebuilds the image
    folder = tmp_path / before.run
    assert {"report.html", "reconstruction.png", "metrics.json"} <= {p.name for p in folder.iterdir()}
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["verdict"] == "leaked" and metrics["guard"]["stage"] == "before"
    assert rec.seconds > 0 and before.seconds > 0 and "budget" not in rec.reason   # the check finished inside it


def test_withhold_sends_nothing_when_the_update_leaks(client):
    model, batch, update = client
    result = guard_update(model, update, batch, policy(action="withhold"))
    assert result.update is None
    assert result.record.decision == WITHHELD and result.record.verdict_before == "leaked"
    assert "leaks" in result.record.reason


@pytest.mark.slow   # ~80 s: two checks per noise level, the portfolio each time
def test_noise_remedies_with_a_defended_verdict_and_its_control(client, tmp_path):
    model, batch, update = client
    result = guard_update(model, update, batch, policy(action="noise", schedule=(3.0, 10.0)), out=tmp_path, name="c0")
    rec = result.record
    assert rec.decision == REMEDIED and rec.verdict_before == "leaked" and rec.verdict_after == "defended"
    assert rec.noise_multiplier in (3.0, 10.0) and rec.noise_sigma > 0
    sent = result.update
    diff = torch.cat([(sent.gradients[k] - update.gradients[k]).flatten() for k in update.gradients])
    assert abs(float(diff.std()) / rec.noise_sigma - 1) < 0.05       # the noise recorded is the noise sent
    metrics = json.loads((tmp_path / rec.checks[-1].run / "metrics.json").read_text())
    assert metrics["verdict"] == "defended" and metrics["control"]["verdict"] == "leaked"
    assert sigmas(metrics["defenses"]) == pytest.approx([rec.noise_sigma], rel=1e-6)
    assert (metrics.get("psnr_mean") or 0) < 20


def test_noise_withholds_when_the_schedule_ends_before_a_defended_verdict(client):
    model, batch, update = client
    result = guard_update(model, update, batch, policy(action="noise", schedule=(1e-4,)))
    rec = result.record
    assert result.update is None and rec.decision == WITHHELD
    assert rec.verdict_after == "leaked" and rec.noise_multiplier == 1e-4
    assert "no noise level" in rec.reason


def test_the_budget_is_respected_and_a_spent_budget_withholds(client):
    model, batch, update = client
    p = policy(action="report", attack="ig", iterations=100_000, budget_seconds=4.0)
    result = guard_update(model, update, batch, p)
    rec = result.record
    assert result.update is None and rec.decision == WITHHELD and rec.verdict_before == "failed"
    # the budget, not the 100,000 IG steps, ended the check (its timer interrupts the attack in a step)
    check = rec.checks[-1]
    assert "budget" in rec.reason and check.error == "GuardBudgetSpent", check
    sent = guard_update(model, update, batch, policy(action="report", attack="ig", iterations=100_000,
                                                     budget_seconds=4.0, on_error="send"))
    assert sent.update is update and sent.record.decision == PASSED


@pytest.mark.parametrize("server", ["trap", "imprint"])
def test_a_malicious_received_model_is_refused_before_any_attack(server):
    from gradleak.models.server import server_model

    source = open_source("fashion-mnist")
    from gradleak.data import batch_of

    batch = batch_of(source, [7], 28, 1)
    victim = build_model("lenet-dlg", num_classes=10, channels=1, image_size=28, seed=0)
    model = server_model(victim, server)
    update = fedsgd(model, batch)
    result = guard_update(model, update, batch, policy(action="report"), arch="lenet-dlg")
    assert result.update is None and result.record.decision == REFUSED and not result.record.checks
    assert "inspect" in result.record.reason or "not model" in result.record.reason
    honest = guard_update(victim, fedsgd(victim, batch), batch, policy(action="report"),
                          arch="lenet-dlg")
    assert honest.record.decision == PASSED and honest.record.inspection is not None


def test_noised_clips_then_noises_and_checks_what_the_server_can_undo(client):
    model, batch, update = client
    norm = math.sqrt(sum(float(g.pow(2).sum()) for g in update.gradients.values()))
    gen = torch.Generator().manual_seed(0)
    sent, checked, sigma = noised(update, 2.0, norm / 4, gen)
    entries = sum(g.numel() for g in update.gradients.values())
    assert sigma == pytest.approx(2.0 * (norm / 4) / math.sqrt(entries))
    for k in update.gradients:   # sent = a (u + n / a) with a = 1/4: the check attacks u + n / a
        assert torch.allclose(sent.gradients[k], checked.gradients[k] / 4)
    assert sigmas(checked.meta.defenses) == pytest.approx([sigma * 4], rel=1e-6)
    assert sigmas(sent.meta.defenses) == pytest.approx([sigma], rel=1e-6)


@pytest.mark.parametrize("bad", [dict(action="drop"), dict(on_suspicious="ignore"), dict(on_error="retry"),
                                 dict(budget_seconds=0), dict(budget_seconds=float("nan")), dict(iterations=0),
                                 dict(iterations=True), dict(schedule=()), dict(schedule=(1.0, 0.5)),
                                 dict(schedule=(-1.0,)), dict(schedule="1,2"), dict(clip=0.0), dict(seed=-1),
                                 dict(extra={"iterations": 3}), dict(progress="yes"), dict(attack="tag"),
                                 dict(attack="")])
def test_bad_policy_values_are_one_typed_error(bad):
    with pytest.raises(ConfigError, match="guard policy: ") as info:
        GuardPolicy(**bad)
    assert "\n" not in str(info.value)


def test_a_policy_that_is_not_a_guard_policy_is_refused(client):
    model, batch, update = client
    with pytest.raises(ConfigError, match="GuardPolicy"):
        guard_update(model, update, batch, {"action": "noise"})


def test_a_closed_form_attack_runs_without_the_policys_iterations(client):
    """iterations is auto's and the optimisation attacks' budget: a closed-form policy attack
    (R-GAP) does not take it, and its check runs instead of failing on the flag."""
    model, batch, update = client
    assert "iterations" not in policy(attack="rgap").attack_flags()
    assert policy(attack="ig").attack_flags()["iterations"] == 50
    rec = guard_update(model, update, batch, policy(action="report", attack="rgap")).record
    assert rec.verdict_before == "leaked" and rec.checks[0].psnr > 40


def test_each_check_prints_one_progress_line_with_the_budget(client, capsys):
    model, batch, update = client
    p = policy(action="report", attack="ig", iterations=100_000, budget_seconds=3.0, progress=True)
    rec = guard_update(model, update, batch, p, name="c0").record
    lines = capsys.readouterr().err.strip().splitlines()
    assert rec.decision == WITHHELD and rec.checks[-1].error == "GuardBudgetSpent"   # the budget ended it
    assert lines[0].startswith("guard c0: before: ig (") and lines[0].endswith(" s of 3 s)")
    assert lines[-1].startswith("guard c0: withheld (verdict failed)")
    assert len(lines) == 2
    guard_update(model, update, batch, policy(action="report", attack="ig", iterations=5), name="c0")
    assert capsys.readouterr().err == ""   # progress=False: silent
