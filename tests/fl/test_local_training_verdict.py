"""The verdict on a FedAvg client's update stays honest: the client's announced local training
(optimizer, epochs, augmentation policy) is never why an update is "defended", and a failure on a
client the attacker models incompletely is inconclusive with a next step naming what it lacks."""

from __future__ import annotations

from gradleak.outcome import DEFENDED, INCONCLUSIVE, LEAKED, Evidence, evidence_from_metrics, judge

FAILED_ANSWER = dict(has_truth=True, psnr=9.0, ssim=0.05, identified=0, recognisable=0, converged=True,
                     answer_distance=0.01, truth_distance=0.01)


def test_a_failure_on_an_announced_optimizer_is_inconclusive_never_defended():
    o = judge(Evidence(**FAILED_ANSWER, client_model="exact"))  # e.g. Adam, 2 full-batch epochs
    assert o.verdict == INCONCLUSIVE and "carries no defense" in o.reason
    assert "does not know" not in o.next_step


def test_an_incompletely_modelled_client_names_the_missing_piece():
    o = judge(Evidence(**FAILED_ANSWER, client_model="order unknown, augmentation unknown: lower bound"))
    assert o.verdict == INCONCLUSIVE
    assert "mini-batch order across epochs and augmentation draws" in o.next_step and "lower bound" in o.next_step
    # even under a defense whose control leaked: the failure may be the attacker's model, not the defense
    d = judge(Evidence(**FAILED_ANSWER, defenses=("gaussian:0.01",), control=LEAKED,
                       client_model="order unknown: lower bound"))
    assert d.verdict == INCONCLUSIVE and "models the client incompletely" in d.reason


def test_a_leak_stays_a_leak_under_an_incomplete_model():
    o = judge(Evidence(has_truth=True, psnr=31.0, ssim=0.95, identified=2, recognisable=2,
                       client_model="order unknown: lower bound"))
    assert o.verdict == LEAKED


def test_metrics_carry_client_model_into_the_evidence():
    ev = evidence_from_metrics({"psnr_mean": 9.0, "per_image": [], "client_model": "augmentation unknown: lower bound"})
    assert ev.client_model == "augmentation unknown: lower bound"
    assert judge(ev).verdict != DEFENDED
