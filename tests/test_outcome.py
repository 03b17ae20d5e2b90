"""The one verdict (gradleak/outcome.py, issue 37): each rule pinned, on real small runs where
they are cheap and on recorded evidence where a run would be slow."""

from __future__ import annotations

import itertools
import json

import pytest

from gradleak.cli import main
from gradleak.outcome import (DEFENDED, FAILED, INCONCLUSIVE, LEAKED, PRESUMED_LEAKED, SKIPPED, Evidence,
                              evidence_from_metrics, judge, needs_control, worst)

FAST = ["--no-progress", "--threads", "1"]
# A defended update on which the truth and the answer fit alike, nothing identified, control leaked.
DEFENDED_EVIDENCE = Evidence(has_truth=True, psnr=5.5, ssim=0.01, identified=0, recognisable=0, converged=True,
                             answer_distance=0.95, truth_distance=0.96, defenses=("gaussian:1",), control=LEAKED)


def _run(tmp_path, name, *args):
    out = tmp_path / name
    assert main(["attack", *args, *FAST, "--out", str(out)]) == 0
    return json.loads((out / "metrics.json").read_text())


# ------------------------------------------------------------------ the rules, one by one
def test_defended_needs_every_piece_of_evidence():
    from dataclasses import replace

    assert judge(DEFENDED_EVIDENCE).verdict == DEFENDED
    missing = {
        "no defense": replace(DEFENDED_EVIDENCE, defenses=()),
        "no truth": replace(DEFENDED_EVIDENCE, has_truth=False, psnr=None),
        "answer fits worse than the truth": replace(DEFENDED_EVIDENCE, answer_distance=1.2),
        "truth's fit not recorded": replace(DEFENDED_EVIDENCE, truth_distance=None),
        "an image identified": replace(DEFENDED_EVIDENCE, identified=1),
        "no control": replace(DEFENDED_EVIDENCE, control=None),
        "control did not leak": replace(DEFENDED_EVIDENCE, control=INCONCLUSIVE),
    }
    for what, ev in missing.items():
        assert judge(ev).verdict == INCONCLUSIVE, what
        assert judge(ev).next_step, what   # an inconclusive verdict says what would decide it
    assert needs_control(replace(DEFENDED_EVIDENCE, control=None))
    assert not needs_control(replace(DEFENDED_EVIDENCE, control=None, answer_distance=1.2))


def test_a_recognisable_image_is_a_leak_whatever_its_psnr():
    """Issue 37's GradInversion batch: 19.3 dB, SSIM 0.71, every image identified: leaked."""
    from dataclasses import replace

    ev = replace(DEFENDED_EVIDENCE, psnr=19.3, ssim=0.71, identified=4, recognisable=4)
    out = judge(ev)
    assert out.verdict == LEAKED and "recognisable" in out.reason
    assert judge(replace(ev, psnr=20.0, recognisable=0, identified=0)).verdict == LEAKED
    # identified but not recognisable (a chance hit): not a leak, and not defended either
    assert judge(replace(ev, recognisable=0, identified=1)).verdict == INCONCLUSIVE


def test_text_speaks_text():
    ev = Evidence(modality="text", has_truth=True, token_accuracy=0.2, exact_sentences=1, converged=True)
    assert judge(ev).verdict == LEAKED and "sentence" in judge(ev).reason and "PSNR" not in judge(ev).reason
    assert judge(Evidence(modality="text", has_truth=True, token_accuracy=0.6)).verdict == LEAKED
    low = judge(Evidence(modality="text", has_truth=True, token_accuracy=0.1, exact_sentences=0, converged=False))
    assert low.verdict == INCONCLUSIVE and "PSNR" not in low.reason and "text" in low.reason


def test_with_and_without_truth_agree():
    """The same answer cannot be "presumed leaked" without the truth and "defended" with it: over a
    grid of evidence, every case presumed leaked without truth is never defended with it."""
    grid = itertools.product((True, False), (0.0, 0.3), ((), ("gaussian:0.001",)), (1e-9, 0.2),
                             (LEAKED, INCONCLUSIVE, None), (5.0, 25.0))
    for converged, floor, defenses, answer, control, psnr in grid:
        common = dict(converged=converged, answer_distance=answer, defenses=defenses, attack_line=1e-5,
                      noise_floor=floor, control=control)
        without = judge(Evidence(has_truth=False, **common)).verdict
        for truth_distance in (1e-11, answer, 0.5):
            with_truth = judge(Evidence(has_truth=True, psnr=psnr, truth_distance=truth_distance, identified=0,
                                        recognisable=0, **common)).verdict
            if without == PRESUMED_LEAKED:
                assert with_truth != DEFENDED, (common, truth_distance, psnr)


def test_worst_case_over_attacks():
    assert worst([DEFENDED, LEAKED, INCONCLUSIVE]) == LEAKED
    assert worst([DEFENDED, INCONCLUSIVE]) == INCONCLUSIVE
    assert worst([DEFENDED, DEFENDED]) == DEFENDED
    assert worst([PRESUMED_LEAKED, INCONCLUSIVE]) == PRESUMED_LEAKED
    assert worst([]) == INCONCLUSIVE and worst([SKIPPED, FAILED]) == FAILED


# ------------------------------------------------------------------ real runs
def test_failed_attack_on_an_undefended_update_is_never_defended(tmp_path, capsys):
    """Issue 37's first case: IG with no defense ended low and 'converged'; the dashboard called it
    defended. A run with no defense is inconclusive whatever its attack did."""
    m = _run(tmp_path, "ig", "--attack", "ig", "--iterations", "20")
    assert m["defenses"] == [] and m["psnr_mean"] < 20
    assert m["verdict"] == INCONCLUSIVE and "no defense" in m["verdict_reason"], m["verdict_reason"]
    printed = " ".join(capsys.readouterr().out.split())
    assert "verdict: inconclusive" in printed and "Next:" in printed
    assert "truth_relative_distance" in m and m["truth_relative_distance"] < 1e-6   # the truth explains it


def test_heavy_noise_earns_defended_with_its_evidence(tmp_path, capsys):
    """Gaussian noise of std 1 on the DLG LeNet's gradient: iDLG rebuilds nothing, its answer fits
    the noisy update as well as the true photo does (measured 0.948 vs 0.962), and the control
    (iDLG on the same photo without the noise) rebuilds it (51 dB): defended."""
    m = _run(tmp_path, "g1", "--attack", "idlg", "--defense", "gaussian:1")
    assert m["verdict"] == DEFENDED, m["verdict_reason"]
    assert m["control"]["verdict"] == LEAKED and m["control"]["psnr_mean"] >= 40
    tol = m["convergence"]["floor_tolerance"]
    assert m["relative_gradient_distance"] <= 1.01 * m["truth_relative_distance"] + tol
    ev = m["evidence"]
    assert ev["defenses"] == ["gaussian:1"] and ev["control"] == LEAKED and ev["psnr"] < 20
    printed = " ".join(capsys.readouterr().out.split())
    assert "verdict: defended" in printed and "control (the same attack without the defenses): leaked" in printed
    html = (tmp_path / "g1" / "report.html").read_text()
    assert '<span class="verdict">defended</span>' in html and "Positive control" in html


def test_dpsgd_earns_defended_and_prints_epsilon(tmp_path, capsys):
    """DP-SGD (clip 1, noise 1), another photo (seed 5): iDLG's answer fits like the truth (its
    clipping is not in the attacker's noise floor, so the attack's own line says 'not converged';
    the truth's fit is the test), the control leaks: defended; epsilon printed."""
    m = _run(tmp_path, "dp", "--attack", "idlg", "--defense", "dpsgd:clip=1,noise=1", "--seed", "5")
    assert m["verdict"] == DEFENDED, m["verdict_reason"]
    assert 0 < m["dp_epsilon"] < 100 and m["dp_delta"] == 1e-5
    printed = " ".join(capsys.readouterr().out.split())
    assert "DP-SGD epsilon" in printed and "verdict: defended" in printed


def test_weak_noise_is_never_defended(tmp_path):
    """Gaussian 0.1: iDLG stops with an answer the true photo fits better (0.25 vs 0.20): an
    optimisation failure, inconclusive; no control is run for it."""
    m = _run(tmp_path, "g01", "--attack", "idlg", "--defense", "gaussian:0.1")
    assert m["verdict"] == INCONCLUSIVE and "control" not in m
    assert m["relative_gradient_distance"] > m["truth_relative_distance"]
    assert "better than the attack's answer" in m["verdict_reason"]


def test_text_run_that_recovers_the_sentence_is_a_leak(tmp_path, capsys):
    m = _run(tmp_path, "text", "--modality", "text", "--text", "the code is 1234", "--iterations", "30")
    assert m["verdict"] == LEAKED and "exactly" in m["verdict_reason"] and "PSNR" not in m["verdict_reason"]
    assert "PSNR" not in " ".join(capsys.readouterr().out.split()).split("verdict:")[1]


def test_update_file_without_truth_is_presumed_and_with_truth_is_scored(tmp_path, capsys):
    u, t = tmp_path / "u.safetensors", tmp_path / "t.safetensors"
    assert main(["share", "--out", str(u), "--truth", str(t)]) == 0
    without = _run(tmp_path, "no-truth", "--attack", "rgap", "--update", str(u))
    with_truth = _run(tmp_path, "truth", "--attack", "rgap", "--update", str(u), "--truth", str(t))
    assert without["verdict"] == PRESUMED_LEAKED and with_truth["verdict"] == LEAKED
    capsys.readouterr()


def test_a_defended_update_file_with_its_truth_gets_its_control_from_the_truth(tmp_path, capsys):
    """An update file under heavy noise (the share command's own defense) with its truth file: the
    control is the truth shared without the defense (FedSGD of one client, which the files
    determine), and the verdict is defended, as for the simulated client above. A FedAvg file
    cannot be re-shared from its files (the private shuffling is not in them): inconclusive."""
    u, t = tmp_path / "u.safetensors", tmp_path / "t.safetensors"
    assert main(["share", "--defense", "gaussian:1", "--out", str(u), "--truth", str(t)]) == 0
    m = _run(tmp_path, "file", "--attack", "idlg", "--update", str(u), "--truth", str(t))
    assert m["verdict"] == DEFENDED, m["verdict_reason"]
    assert m["control"]["verdict"] == LEAKED and m["control"]["psnr_mean"] >= 40
    u2, t2 = tmp_path / "u2.safetensors", tmp_path / "t2.safetensors"
    assert main(["share", "--defense", "gaussian:1", "--threat", "fedavg", "--local-steps", "2", "--out", str(u2),
                 "--truth", str(t2)]) == 0
    m = _run(tmp_path, "fedavg", "--attack", "idlg", "--update", str(u2), "--truth", str(t2))
    if "control" in m:   # asked for only when everything else said "defended"
        assert m["control"]["verdict"] == FAILED and "private shuffling" in m["control"]["verdict_reason"]
        assert m["verdict"] == INCONCLUSIVE
    assert m["verdict"] != DEFENDED
    capsys.readouterr()


@pytest.mark.parametrize("status, verdict", [("failed", FAILED), ("skipped", SKIPPED)])
def test_failed_and_skipped(status, verdict):
    assert judge(Evidence(status=status)).verdict == verdict
    assert evidence_from_metrics({}, status=status).status == status


def test_dashboard_summarises_a_folder_of_single_runs(tmp_path, capsys):
    """Issue 37 item 7: `gradleak dashboard runs/` over single `gradleak attack` runs: one row per
    run folder with the run's own verdict, the worst case over its attacks, a link to each report."""
    runs = tmp_path / "runs"
    assert main(["attack", *FAST, "--out", str(runs / "a-rgap")]) == 0                 # auto: R-GAP, leaked
    assert main(["attack", "--attack", "ig", "--iterations", "5", *FAST, "--out", str(runs / "b-ig")]) == 0
    (runs / ".c.partial-host-1-x").mkdir()                                              # a staging folder: ignored
    capsys.readouterr()
    assert main(["dashboard", str(runs)]) == 0
    page = (runs / "dashboard.html").read_text()
    assert "Runs: " in page and "2 gradleak attack run folders" in page
    verdicts = {k: json.loads((runs / k / "metrics.json").read_text())["verdict"] for k in ("a-rgap", "b-ig")}
    assert verdicts == {"a-rgap": LEAKED, "b-ig": INCONCLUSIVE}
    assert 'href="a-rgap/report.html"' in page and 'href="b-ig/report.html"' in page
    assert "Worst case over the attacks, per client setting" in page   # the attack varies across the runs
    section = page.split("Worst case over the attacks", 1)[1].split("<h2>", 1)[0]
    assert 'class="r-leaked"' in section


def test_a_control_that_cannot_run_leaves_the_verdict_inconclusive(tmp_path, monkeypatch, capsys):
    import importlib

    from gradleak.errors import DataError

    pipeline_run = importlib.import_module("gradleak.pipeline.run")   # the package re-exports run()

    real = pipeline_run.build_case

    def build_case(cfg):
        if not cfg.defense:   # the control's case (the same client without the defense)
            raise DataError("no data for the control")
        return real(cfg)

    monkeypatch.setattr(pipeline_run, "build_case", build_case)
    m = _run(tmp_path, "g1", "--attack", "idlg", "--defense", "gaussian:1")
    assert m["control"]["verdict"] == FAILED and "no data for the control" in m["control"]["verdict_reason"]
    assert m["verdict"] == INCONCLUSIVE and "could not run" in m["verdict_reason"]
    capsys.readouterr()


def test_review_findings_never_defended():
    """What a review of the first version found could still read "defended" (each must not):
    infinite distances, a recognisable image in a pool too small to identify it, a truth that
    the attacker's simulation cannot reproduce (DP-SGD's clipping), a diverged run, a missing
    PSNR, a control of another attack, a label no verdict knows."""
    from dataclasses import replace

    base = DEFENDED_EVIDENCE
    assert judge(replace(base, answer_distance=float("inf"), truth_distance=float("inf"))).verdict == INCONCLUSIVE
    assert judge(replace(base, tolerance=float("inf"), answer_distance=5.0)).verdict == INCONCLUSIVE
    assert judge(replace(base, psnr=19.3, ssim=0.71, identified=None, recognisable=1)).verdict == LEAKED
    clipped = replace(base, defenses=("dpsgd:clip=0.1,noise=0.001",), unmodelled=("dpsgd (clipping)",),
                      noise_floor=0.0156, truth_distance=64008.0, answer_distance=1.0)
    assert judge(clipped).verdict == INCONCLUSIVE and "does not reproduce" in judge(clipped).reason
    modelled = replace(clipped, noise_floor=0.997, truth_distance=1.03, answer_distance=1.02, tolerance=0.041)
    assert judge(modelled).verdict == DEFENDED     # clipping inactive: the truth sits on the modelled floor
    assert judge(replace(base, psnr=None)).verdict == INCONCLUSIVE
    m = {"psnr_mean": 5.0, "ssim_mean": 0.01, "converged": True, "defenses": ["gaussian:1"], "attack": "idlg",
         "relative_gradient_distance": 0.95, "truth_relative_distance": 0.96,
         "convergence": {"converged": True, "noise_floor": 0.96, "floor_tolerance": 0.01},
         "per_image": [{"psnr": 5.0, "ssim": 0.01}], "control": {"verdict": "leaked", "attack": "idlg"}}
    assert judge(evidence_from_metrics(m)).verdict == DEFENDED
    assert judge(evidence_from_metrics({**m, "control": {"verdict": "leaked", "attack": "rgap"}})).verdict \
        == INCONCLUSIVE
    assert judge(evidence_from_metrics({**m, "status": "diverged"})).verdict == FAILED
    assert judge(evidence_from_metrics({**m, "per_image": [{"psnr": 5.0, "ssim": 0.8}]})).verdict == LEAKED
    assert worst([DEFENDED, "not rebuilt"]) == INCONCLUSIVE
