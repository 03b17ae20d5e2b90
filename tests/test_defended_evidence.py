"""Issue 64: "defended" on evidence that no optimiser's reach affects (the decoy test), "presumed
leaked" only far below what batches nobody optimised score, and "Next:" steps an auditor can take
(outcome.py, pipeline/decoys.py). Real small runs: LeNet, batch 1 or 2, few iterations."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gradleak.cli import main
from gradleak.outcome import (DEFENDED, INCONCLUSIVE, LEAKED, PRESUME_RATIO, PRESUMED_LEAKED, Evidence,
                              decoy_separated, evidence_from_metrics, judge)

FAST = ["--no-progress", "--threads", "1", "--no-paper-metrics"]


def attacked(tmp_path, name, *args):
    out = tmp_path / name
    assert main(["attack", *map(str, args), *FAST, "--out", str(out)]) == 0
    return json.loads((out / "metrics.json").read_text())


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """Update files of the default client (DLG LeNet, cifar10-samples): batch 1 and batch 2."""
    folder = tmp_path_factory.mktemp("shared")
    for k in (1, 2):
        assert main(["share", "--batch-size", str(k), "--out", str(folder / f"u{k}.safetensors")]) == 0
    return folder


# ------------------------------------------------------------------ the decoy test decides "defended"
def test_decoy_test_is_declared_and_strict():
    assert decoy_separated(0.19, [0.23, 0.25], 0.007)          # Gaussian 0.1: the truth stands out
    assert not decoy_separated(0.962, [0.963, 0.966], 0.032)   # Gaussian 1: within the noise's spread
    assert not decoy_separated(1.06, [1.05, 1.04], 0.0)        # the truth above a decoy: never separated
    assert decoy_separated(0.5, [], 0.1)                       # nothing measured: no credit


def test_dpsgd_is_credited_by_the_decoy_test_where_the_truth_fit_was_no_yardstick(tmp_path, capsys):
    """DP-SGD (clip 1, noise 1) on the cifar10-samples photo of seed 3: the attacker's simulation
    does not clip, so the truth sits above the modelled floor (1.058 > 0.9985 + 0.034) and the
    previous rule called it "inconclusive: the truth's fit is no yardstick" (noise 1 read defended
    on some photos, not on others). Measured after the best scale (a norm change is not evidence),
    the truth is no closer to the update than 16 decoy batches: defended, the control leaking."""
    m = attacked(tmp_path, "dp", "--attack", "idlg", "--iterations", 6, "--seed", 3,
                 "--defense", "dpsgd:clip=1,noise=1")
    test = m["decoy_test"]
    assert test["separated"] is False and len(test["decoys"]) == 16 and test["measure"].startswith("1 - cos")
    assert m["control"]["verdict"] == LEAKED
    assert m["verdict"] == DEFENDED, m["verdict_reason"]
    assert "decoy batches" in m["verdict_reason"] and f"{test['best_decoy']:.4g}" in m["verdict_reason"]
    assert "verdict: defended" in " ".join(capsys.readouterr().out.split())


def test_weak_noise_the_truth_stands_out_from_is_never_defended(tmp_path):
    """Gaussian 0.03: the true batch scores far below every decoy batch (by > 40 x the noise's
    spread): even an answer that fit the update like the truth would not be "defended"."""
    m = attacked(tmp_path, "g003", "--attack", "idlg", "--iterations", 3, "--defense", "gaussian:0.03")
    test = m["decoy_test"]
    assert test["separated"] is True and test["truth"] < test["best_decoy"] - 10 * test["spread"]
    assert m["verdict"] != DEFENDED and "control" not in m
    ev = evidence_from_metrics(m)
    fits = judge(replace(ev, answer_distance=ev.truth_distance, control=LEAKED, psnr=8.0, recognisable=0,
                         identified=0))
    assert fits.verdict == INCONCLUSIVE and "tells the true batch from decoy batches" in fits.reason
    assert judge(replace(ev, decoy_distances=(), answer_distance=ev.truth_distance, control=LEAKED, psnr=8.0,
                         recognisable=0, identified=0, converged=False)).verdict == DEFENDED   # the old rule would


# ------------------------------------------------------------------ "presumed leaked" needs more than the line
def test_a_few_steps_from_a_random_start_are_not_presumed_leaked(tmp_path, shared):
    """The issue's repro: GradInversion 5 steps from its random start ends at relative distance
    ~0.16, inside its 0.4 line ("converged"): it fits no better than the starts and public decoy
    batches do, so it is not presumed a leak; 0 steps is not either."""
    u = shared / "u2.safetensors"
    five = attacked(tmp_path, "gi5", "--update", u, "--attack", "gradinversion", "--iterations", 5)
    assert five["converged"] is True   # by the attack's own line
    refs = five["reference_distances"]
    assert len(refs["starts"]) == 5 and len(refs["decoys"]) == 16
    assert five["relative_gradient_distance"] > PRESUME_RATIO * min(refs["starts"] + refs["decoys"])
    assert five["verdict"] == INCONCLUSIVE and "nobody optimised" in five["verdict_reason"]
    zero = attacked(tmp_path, "gi0", "--update", u, "--attack", "gradinversion", "--iterations", 0)
    assert zero["verdict"] == INCONCLUSIVE


def test_a_converged_idlg_run_is_still_presumed_leaked(tmp_path, shared):
    m = attacked(tmp_path, "idlg", "--update", shared / "u1.safetensors", "--attack", "idlg", "--iterations", 30)
    refs = m["reference_distances"]
    assert m["relative_gradient_distance"] < 1e-4 * min(refs["starts"] + refs["decoys"])
    assert m["verdict"] == PRESUMED_LEAKED and "starts and decoy batches" in m["verdict_reason"], m["verdict_reason"]


# ------------------------------------------------------------------ "Next:" is a step an auditor can take
def test_next_steps_follow_what_was_run(tmp_path, shared):
    """A run that already was auto is not told to try auto or "another attack"; a single attack is."""
    auto = attacked(tmp_path, "auto", "--update", shared / "u2.safetensors", "--iterations", 2)
    assert auto["verdict"] == INCONCLUSIVE and "auto" in auto
    assert "--attack auto" not in auto["next_step"] and "another attack" not in auto["next_step"]
    assert "--seed" in auto["next_step"]
    single = judge(replace(evidence_from_metrics({k: v for k, v in auto.items() if k != "auto"})))
    assert "--attack auto" in single.next_step


def test_unmodelled_clipping_never_asks_to_change_the_clients_defense():
    """Without a decoy test (an older run): the advice must not be "attack with a defense the
    floor models" (that changes the client, not the audit)."""
    ev = Evidence(has_truth=True, psnr=5.0, ssim=0.01, identified=0, recognisable=0, converged=True,
                  answer_distance=1.0, truth_distance=64008.0, tolerance=0.0005, noise_floor=0.0156,
                  defenses=("dpsgd:clip=0.1,noise=0.001",), unmodelled=("dpsgd (clipping)",))
    out = judge(ev)
    assert out.verdict == INCONCLUSIVE and "does not reproduce" in out.reason
    assert "defense" not in out.next_step and out.next_step
