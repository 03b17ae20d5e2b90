"""Issue 4's experiment commands and the unrolled FedAvg attack, on real images.

Each experiment runs at its ``--smoke`` setting (its smallest meaningful one) and must write the
declared columns with sane numbers; the asserted comparisons were measured first (single thread,
numbers in the comments) and are checked with a declared margin. What tests/fl/test_threats.py,
test_threat_attacks.py and test_defenses.py already cover (the simulation reproducing the update,
each defense's exact effect, DP epsilon) is not repeated here.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest

from gradleak.cli import main
from gradleak.experiments.base import output_name
from gradleak.experiments.common import PAIRING_COLUMNS
from gradleak.experiments import make_options, run_experiment
from gradleak.metrics.image import PSNR_CAP_DB
from gradleak.sweep.worker import run_cell

RECOVERED_DB = 20.0  # the experiments' success threshold (MSE 0.01 on [0, 1] pixels)
MARGIN_DB = 5.0      # margin on either side of it for the asserted outcomes
SETUP_KEYS = ("data", "model", "samples", "seeds", "success threshold")


def _smoke(name: str, out: Path):
    result, folder = run_experiment(name, make_options(out=str(out), smoke=True, progress=False))
    return result, folder, _check_written(result, folder)


def _check_written(result, folder: Path) -> list[dict[str, str]]:
    """results.csv with the declared columns and one line per row; results.md stating the setup;
    experiment.json; the figures; sane quality numbers in every row."""
    with (folder / "results.csv").open(newline="") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == [output_name(c) for c in result.columns]   # psnr: psnr_oracle_pairing
        lines = list(reader)
    assert len(lines) == len(result.rows) > 0
    md = (folder / "results.md").read_text()
    for key in SETUP_KEYS:
        assert key in result.setup, key
        assert f"**{key}**" in md
    meta = json.loads((folder / "experiment.json").read_text())
    assert meta["name"] == result.name
    assert meta["machine"]["cpu"] and meta["machine"]["cpus"] >= 1  # the CPU model: results depend on it
    assert result.figures
    for fig in result.figures:
        assert (folder / fig).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for r in result.rows:
        if r.get("psnr") is None and r.get("token_accuracy") is not None:  # a text row (defenses: text-dlg)
            assert 0 <= r["token_accuracy"] <= 1 and 0 <= r["rougeL"] <= 1 and r["exact_sentences"] in (0, 1)
            continue
        assert math.isfinite(r["psnr"]) and 0 < r["psnr"] < 200
        assert -1 <= r["ssim"] <= 1
        if "mse" in r:
            assert 0 <= r["mse"] <= 1
            # psnr is the mean of the images' PSNRs, so by Jensen at least the PSNR of the mean MSE
            # (a PSNR above the cap, PSNR_CAP_DB, is the cap)
            # (an exact answer, MSE 0, as the trap attack's under pruning: every image at the cap)
            assert r["psnr"] >= (min(PSNR_CAP_DB, -10 * math.log10(r["mse"])) if r["mse"] > 0 else PSNR_CAP_DB) - 1e-6
        if r.get("label_accuracy") is not None:
            assert 0 <= r["label_accuracy"] <= 1
    return lines


def _declared_threshold(folder: Path) -> tuple[str, float]:
    """The success threshold results.md declares to its reader: ("<" or ">=", dB)."""
    line = next(ln for ln in (folder / "results.md").read_text().splitlines() if "**success threshold**" in ln)
    match = re.search(r"PSNR (<|>=) ([0-9.]+) dB", line)
    assert match, line
    return match.group(1), float(match.group(2))


# --------------------------------------------------------------------------- the FedAvg attack
def test_unrolled_fedavg_attack_recovers_a_real_photo_from_a_two_step_update_without_labels():
    """One CIFAR-10 photo, two local SGD steps (lr 0.1) on the DLG LeNet; the client shares only
    W_2 - W_0. iDLG restores the label from that difference (no label is given to the attacker)
    and unrolls both steps. Measured: 30.6 dB at 30 iterations (33.9 at 40; seeds 1, 2 at 40: 40.0, 36.6 dB)."""
    res = run_cell(dict(attack="idlg", model="lenet-dlg", data="cifar10-samples", batch_size=1, seed=0,
                        threat="fedavg", local_steps=2, local_lr=0.1, iterations=30, dtype="float64", init="zeros",
                        log_every=30, threads=1))  # one cell, as the experiments run it
    assert res["status"] == "ok", res["error"]
    metrics = res["metrics"]
    assert metrics["update"]["threat"] == {"name": "fedavg", "local_steps": 2, "local_batch_size": 1, "local_lr": 0.1}
    assert metrics["label_method"] == "idlg"  # restored from the update, not handed over
    assert metrics["label_accuracy"] == 1.0
    assert metrics["psnr_mean"] >= RECOVERED_DB + MARGIN_DB


# --------------------------------------------------------------------------- experiments
def _docs_state_the_defenses_smoke(rows) -> None:
    """The docs' sentence on the defenses smoke run (docs/reference/experiments.md) says what this
    run measured (issue 43: it said four settings "defend" while a fresh smoke run had none
    defended; issue 37: "defended" needs positive evidence, which DP-SGD's cell has)."""
    readme = " ".join((Path(__file__).parents[2] / "docs" / "reference" / "experiments.md").read_text().split())
    cell = {(r["attack"], r["spec"]): r for r in rows}
    def stated(before: str, after: str, attack: str, *specs: str) -> None:
        """The page states these settings' PSNRs between ``before`` and ``after``: within 0.25 dB,
        or within 6 dB where the run measured 35 dB or more. Both follow the CPU's floating-point
        paths, as the page says: a near-perfect rebuild's last digits (49.8 against 53.3 dB on two
        machines of this project's kind, both far above any leak threshold) and a failed one's
        end point (DLG under prune 0.9: 4.07 against 4.2 dB)."""
        m = re.search(re.escape(before) + r"((?:[0-9.]+, )*[0-9.]+)" + re.escape(after), readme)
        assert m, f"docs/reference/experiments.md does not say {before!r} ... {after!r}"
        said = [float(v) for v in m.group(1).split(", ")]
        got = [cell[attack, s]["psnr"] for s in specs]
        assert len(said) == len(got) and all(abs(a - b) <= (6.0 if b >= 35 else 0.25) for a, b in zip(said, got, strict=True)), \
            (before, said, got)
    strong = ("gaussian:0.1", "laplace:0.1", "prune:0.9", "dpsgd:clip=1,noise=1")
    # the decoy test (outcome.py): Laplace 0.1 and DP-SGD leave the truth among the decoys, Gaussian
    # 0.1 and prune 0.9 do not (an attack on the objective could single the truth out)
    assert {(r["attack"], r["spec"]) for r in rows if r["attack"] in ("dlg", "idlg", "imprint") and r["defended"]} == \
        {("dlg", "laplace:0.1"), ("dlg", strong[3]), ("idlg", "laplace:0.1"), ("idlg", strong[3]), ("imprint", strong[3])}
    assert "DLG and iDLG earn `defended` under Laplace 0.1 and DP-SGD only, imprint under DP-SGD only" in readme
    assert [cell["idlg", s]["verdict"] for s in strong] == ["inconclusive", "defended", "inconclusive", "defended"]
    stated("Laplace 0.1 iDLG rebuilds nothing (", " dB)", 'idlg', *strong[:2])
    stated("it rebuilds nothing either (", " dB)", 'idlg', *strong[2:])
    assert f"DP-SGD (noise 1, epsilon {cell['idlg', strong[3]]['epsilon']:.2f})" in readme
    assert [cell["imprint", s]["verdict"] for s in strong] == ["leaked", "leaked", "inconclusive", "defended"]
    stated("Gaussian 0.1 and Laplace 0.1 (", " dB)", 'imprint', *strong[:2])
    stated("prune 0.9 and DP-SGD (", " dB, inconclusive and defended)", 'imprint', *strong[2:])
    weak = ("gaussian:0.0001", "fp16", "int8")
    assert all(cell[a, s]["verdict"] == "leaked" for a in ("idlg", "imprint") for s in weak)
    stated("leak to both attacks (iDLG ", " dB", 'idlg', *weak)
    assert all(cell["dlg", s]["verdict"] == "leaked" for s in weak)
    assert [cell["dlg", s]["verdict"] for s in strong] == ["inconclusive", "defended", "inconclusive", "defended"]
    stated("it leaks under Gaussian 1e-4, fp16 and int8 (", " dB)", 'dlg', *weak)
    stated("Laplace 0.1, prune 0.9 and DP-SGD (", " dB)", 'dlg', *strong)
    # the trap weights (closed form: stable numbers) and CPA's verdicts (its numbers are ICA's)
    stated("rebuild it under Gaussian 0.1, Laplace 0.1 and prune 0.9 (", " dB)", 'trap', *strong[:3])
    stated("stop only under DP-SGD (", " dB, defended)", 'trap', strong[3])
    assert ("CPA (mlp, 16 images) earns `defended` under Gaussian 0.1, Laplace 0.1 and DP-SGD, is borderline under "
            "prune 0.9") in readme
    # prune 0.9: two of CPA's 16 answers sit at the recognisability line (coarse SSIM ~0.6), and ICA's
    # two runs of 2026-12-02 differed (leaked, inconclusive; why was not analysed); never defended
    verdicts = [cell["cpa", s]["verdict"] for s in strong]
    assert verdicts[:2] == ["defended", "defended"] and verdicts[3] == "defended" and verdicts[2] in ("leaked", "inconclusive")


def test_defenses_smoke_strongest_gaussian_defends_and_weakest_does_not(tmp_path):
    """Measured at --smoke (iDLG, float64, 20 iterations, the same held-out Fashion-MNIST image for
    every row): undefended 53.0 dB; gaussian 1e-4 53.3, fp16 51.2, int8 39.6 dB (no defense);
    gaussian 0.1 5.3, laplace 0.1 4.7, prune 0.9 4.2, DP-SGD (noise 1) 3.5 dB. Accuracy after the
    short training: 0.58 undefended, 0.37 under prune 0.9, 0.16 under DP-SGD."""
    result, folder, all_lines = _smoke("defenses", tmp_path / "defenses")
    assert "reconstructions.png" in result.figures   # the held-out image under every defense and attack
    assert [c for c in result.columns if c not in PAIRING_COLUMNS][:7] == ["attack", "defense", "strength", "accuracy",
                                                                          "psnr", "ssim", "defended"]
    # DLG: the rebuttal's attack; trap and cpa (issue 41): which defenses stop them
    assert {r["attack"] for r in result.rows} == {"dlg", "idlg", "imprint", "trap", "cpa", "text-dlg"}
    assert "cpa_reconstructions.png" in result.figures   # cpa's first batch under every defense
    # issue 42: the text row (text DLG, tiny transformer, one held-out sentence of CPython's docs).
    # Measured: exact undefended and under Gaussian 1e-4, fp16, int8; under Gaussian 0.1, Laplace 0.1
    # and DP-SGD no token in place, the answer fits the defended update as well as the true sentence
    # (relative distance 0.91-1.0) and the undefended control leaked: defended; prune 0.9 (not in
    # the attacker's simulation): leaked, a set of words (measured 2026-12-02: "counter, may, to, this,
    # humans" of "This may be counter-intuitive to humans.", token-set precision 1.0, recall 0.56)
    text = {r["spec"]: r for r in result.rows if r["attack"] == "text-dlg"}
    for spec in ("", "gaussian:0.0001", "fp16", "int8"):
        assert text[spec]["verdict"] == "leaked" and text[spec]["exact_sentences"] == 1, text[spec]
    for spec in ("gaussian:0.1", "laplace:0.1", "dpsgd:clip=1,noise=1"):
        assert text[spec]["verdict"] == "defended" and text[spec]["defended"] is True, text[spec]
        assert text[spec]["token_accuracy"] < 0.5 and text[spec]["accuracy"] is None
    assert text["prune:0.9"]["verdict"] == "leaked" and text["prune:0.9"]["exact_sentences"] == 0
    # DLG on the same image (measured: none 52.4, gaussian 1e-4 54.0, fp16 52.2, int8 39.7 dB, leaked;
    # gaussian 0.1 5.2, laplace 0.1 4.7, prune 0.9 4.2, DP-SGD 3.8 dB: defended only by the decoy test)
    dlg = {r["spec"]: r for r in result.rows if r["attack"] == "dlg"}
    for spec in ("", "gaussian:0.0001", "fp16"):
        assert dlg[spec]["verdict"] == "leaked" and dlg[spec]["psnr"] > RECOVERED_DB + MARGIN_DB, dlg[spec]
    for spec in ("gaussian:0.1", "laplace:0.1", "prune:0.9", "dpsgd:clip=1,noise=1"):
        assert dlg[spec]["psnr"] < RECOVERED_DB - MARGIN_DB and dlg[spec]["verdict"] in ("defended", "inconclusive")
    rows = [r for r in result.rows if r["attack"] == "idlg"]
    lines = [ln for ln in all_lines if ln["attack"] == "idlg"]
    assert {r["defense"] for r in rows} >= {"none", "gaussian", "laplace", "prune", "fp16", "int8", "dpsgd"}
    for r in rows:
        assert 0 <= r["accuracy"] <= 1
    none = next(r for r in rows if r["defense"] == "none")
    gauss = sorted((r for r in rows if r["defense"] == "gaussian"), key=lambda r: r["strength"])
    assert len(gauss) >= 2
    weakest, strongest = gauss[0], gauss[-1]
    # every row attacks the same image (seed 0): the defense alone moves the PSNR. The strongest
    # setting of each noise/pruning defense destroys the leak the undefended update gives...
    strong = [r for r in rows if r["spec"] in ("laplace:0.1", "prune:0.9", "dpsgd:clip=1,noise=1")]
    assert len(strong) == 3
    for r in [strongest, *strong]:
        assert r["psnr"] < RECOVERED_DB - MARGIN_DB and r["psnr"] < none["psnr"] - 4 * MARGIN_DB, r
        # defended only with positive evidence (outcome.py, issue 37): a failed attack is
        # inconclusive, never defended
        assert r["verdict"] in ("defended", "inconclusive")
        assert r["defended"] is (r["verdict"] == "defended"), r
    # ...while the weakest noise and fp16 leave it where it was (a tiny perturbation of the update)
    for r in [weakest, next(r for r in rows if r["defense"] == "fp16")]:
        assert abs(r["psnr"] - none["psnr"]) < MARGIN_DB and r["defended"] is False, r
    assert none["psnr"] > RECOVERED_DB + MARGIN_DB and not none["defended"]
    # the verdicts a reader gets in results.csv follow the threshold results.md declares
    op, threshold = _declared_threshold(folder)
    assert (op, threshold) == (">=", RECOVERED_DB)
    for ln in lines:
        assert ln["defended"] == str(ln["verdict"] == "defended"), ln
        if float(ln["psnr_oracle_pairing"]) >= threshold:
            assert ln["verdict"] == "leaked", ln
        else:
            assert ln["verdict"] in ("defended", "inconclusive", "leaked"), ln
    # the trade-off: the model trained well above chance (0.1) without a defense, and DP-SGD's
    # noise costs accuracy (measured 0.58 vs 0.16)
    assert none["accuracy"] > 0.3
    dp = next(r for r in rows if r["defense"] == "dpsgd")
    assert dp["accuracy"] < none["accuracy"] - 0.2
    assert dp["epsilon"] is not None and 0 < dp["epsilon"] < math.inf
    # the malicious server's imprint module on the same image: exact undefended, and it still
    # rebuilds the image under the strongest Gaussian and Laplace noise that stop iDLG (measured
    # 63.2 and 58.3 dB: its gradients are loud, IMPRINT_GAIN); pruning 0.9 and DP-SGD stop both
    imprint = {r["spec"]: r for r in result.rows if r["attack"] == "imprint"}
    assert imprint[""]["psnr"] >= 60 and imprint[""]["converged"] is True
    _docs_state_the_defenses_smoke(result.rows)
    for spec in ("gaussian:0.1", "laplace:0.1"):
        assert imprint[spec]["verdict"] == "leaked" and imprint[spec]["psnr"] >= 40, imprint[spec]
    for spec in ("prune:0.9", "dpsgd:clip=1,noise=1"):
        assert imprint[spec]["verdict"] != "leaked", imprint[spec]
    md = (folder / "results.md").read_text()
    assert "gaussian:0.1: stops dlg (" in md and "idlg (" in md and "but NOT imprint" in md
    _trap_and_cpa_smoke(result, md)


def _trap_and_cpa_smoke(result, md: str) -> None:
    """Issue 41: the trap weights in front of the same LeNet, on the same image (reconstructions.png
    draws them beside the others: the same truth), and CPA on the mlp's batch of 16. Measured:
    trap undefended 100 dB; gaussian 1e-4 100, gaussian 0.1 52.8, laplace 0.1 46.8, prune 0.9 100,
    fp16 98.2, int8 66.1 dB (leaked); DP-SGD 6.1 dB (inconclusive: clipping is not in the
    attacker's simulation). CPA undefended 100 dB (16 of 16 images); gaussian 1e-4, fp16, int8
    11.1-11.4 dB with 1-3 of 16 images recognisable (leaked: its exact unmixing breaks, ICA's blends
    remain); gaussian 0.1, laplace 0.1, DP-SGD 4.7-4.8 dB, defended (the answer fits the noised
    update as well as the truth, the control leaked); prune 0.9 7.9 dB, inconclusive."""
    trap = {r["spec"]: r for r in result.rows if r["attack"] == "trap"}
    assert trap[""]["psnr"] >= 60 and trap[""]["converged"] is True and trap[""]["verdict"] == "leaked"
    for spec in ("gaussian:0.0001", "gaussian:0.1", "laplace:0.1", "prune:0.9", "fp16", "int8"):
        assert trap[spec]["verdict"] == "leaked" and trap[spec]["psnr"] >= 40, trap[spec]
    assert trap["dpsgd:clip=1,noise=1"]["verdict"] != "leaked"
    assert all(r["model"] == "lenet-dlg" and r["images"] == 1 for r in trap.values())
    lenet = {r["spec"]: r["accuracy"] for r in result.rows if r["attack"] == "idlg"}
    assert all(r["accuracy"] == lenet[s] for s, r in trap.items())   # the LeNet's training
    cpa = {r["spec"]: r for r in result.rows if r["attack"] == "cpa"}
    assert all(r["model"] == "mlp" and r["images"] == 16 for r in cpa.values())
    # the accuracy column of the cpa rows is the mlp's, trained under the same defense (measured 0.768
    # undefended vs the LeNet's 0.581)
    assert cpa[""]["accuracy"] != lenet[""] and 0.3 < cpa[""]["accuracy"] <= 1
    assert cpa[""]["psnr"] >= 60 and cpa[""]["images_leaked"] == 16 and cpa[""]["verdict"] == "leaked"
    for spec in ("gaussian:0.0001", "fp16", "int8"):
        assert cpa[spec]["verdict"] == "leaked" and cpa[spec]["images_leaked"] >= 1, cpa[spec]
    for spec in ("gaussian:0.1", "laplace:0.1", "dpsgd:clip=1,noise=1"):
        r = cpa[spec]
        assert r["psnr"] < RECOVERED_DB - MARGIN_DB and r["images_leaked"] == 0, r
        assert r["verdict"] == "defended" and r["defended"] is True, r   # outcome.py's evidence, control leaked
    # pruning 0.9: CPA's unmixing of the 10 % left sits at the recognisability line, and which side an
    # image falls on depends on the CPU's float rounding (AMD EPYC: inconclusive, 0 of 16 images; Intel
    # Xeon: leaked, at 1e387b0 as today). Either way never "defended": pruning is no evidence of a defense.
    prune = cpa["prune:0.9"]
    assert (prune["verdict"], prune["images_leaked"] == 0) in (("inconclusive", True), ("leaked", False)), prune
    assert "The cpa rows attack another model than the other rows: mlp" in md


def test_local_iterations_smoke(tmp_path):
    """Measured at --smoke (DLG, 40 iterations): K=1 after 1 and 2 local steps 32.2 and 32.7 dB;
    K=2 in one epoch with B=1 and B=2: 18.4 and 19.0 dB."""
    result, _, _ = _smoke("local-iterations", tmp_path / "li")
    assert "reconstructions.png" in result.figures   # each sweep's first photo(s) per number of steps
    steps = [r for r in result.rows if r["sweep"] == "local_steps"]
    batch = [r for r in result.rows if r["sweep"] == "local_batch_size"]
    assert sorted({r["local_steps"] for r in steps}) == [1, 2]
    assert sorted({r["local_batch_size"] for r in batch}) == [1, 2]
    for r in steps:  # K = 1: the leak survives a multi-step update; psnr is exactly that of the mse
        assert r["psnr"] >= RECOVERED_DB + MARGIN_DB and r["recovered"]
        assert r["psnr"] == pytest.approx(-10 * math.log10(r["mse"]), abs=1e-6)
    for r in batch:
        assert r["batch_size"] == 2 and r["local_steps"] * r["local_batch_size"] == 2  # one epoch
        assert r["psnr"] > 12.0  # well above a failed run (5-8 dB), partly recovered


def test_training_stage_smoke(tmp_path):
    """Measured at --smoke: test accuracy 0.09 / 0.28 / 0.58 / 0.66 and DLG 64 / 60 / 54 / 47 dB."""
    result, folder, _ = _smoke("training-stage", tmp_path / "ts")
    rows = sorted(result.rows, key=lambda r: r["fraction"])
    assert [r["fraction"] for r in rows] == [0.0, 0.3, 0.7, 1.0]
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 0.3  # the model did train
    for r in rows:
        assert r["image"].startswith("test[")  # held-out images
        assert r["recovered"] and r["psnr"] >= 30.0
    # the trained model: DIR/training/<name>-<digest of its training config>/
    assert len(list((folder / "training").glob("*/checkpoint-*.safetensors"))) == 4
    assert "reconstructions.png" in result.figures   # the image and its reconstruction at every stage


def test_training_stage_closed_form_smoke(tmp_path):
    """R-GAP on the same checkpoints and held-out images: the trained checkpoints' updates still hold
    the image (full run: 15 of 16 converged, 39-100 dB, reproduction/training-stage). Asserted at
    --smoke: every stage rebuilt by a converged closed form, >= 30 dB."""
    result, folder = run_experiment("training-stage", make_options(out=str(tmp_path / "ts"), smoke=True,
                                                                   progress=False, attacks=["rgap"]))
    _check_written(result, folder)
    rows = sorted(result.rows, key=lambda r: r["fraction"])
    assert [r["fraction"] for r in rows] == [0.0, 0.3, 0.7, 1.0]
    for r in rows:
        assert r["recovered"] and r["converged"] and r["psnr"] >= 30.0, r
    assert "rgap (closed form" in result.setup["attack"]


def test_batch_size_smoke(tmp_path):
    """Measured at --smoke, K=1 vs K=2 (2026-11-26, Intel Xeon): dlg 20.5 / 28.6 (issue 17's
    multi-image warm-up lifted K=2 from 19.9; at this 60-step budget K=1 ends on a later start of the
    portfolio), idlg 30.7 / 24.1, gradinversion 18.1 / 17.3, ig 18.0 / 15.5 dB (300 smoke iterations);
    every attack restored both labels. Asserted: iDLG
    loses at least MARGIN_DB from K=1 to K=2, GradInversion (BN statistics, batch-aware) at least
    MARGIN_DB less; DLG rebuilds both (>= 20 dB) and results.md flags that it contradicts the trend."""
    result, folder, lines = _smoke("batch-size", tmp_path / "bs")
    attacks = result.setup["attacks"]
    assert "reconstructions.png" in result.figures   # each K's first batch under every attack
    assert set(attacks) >= {"dlg", "idlg", "gradinversion", "ig"}
    psnr = {(r["attack"], r["batch_size"]): r["psnr"] for r in result.rows}
    assert set(psnr) == {(a, k) for a in attacks for k in (1, 2)}
    drop = {a: psnr[(a, 1)] - psnr[(a, 2)] for a in attacks}
    assert drop["idlg"] >= MARGIN_DB
    assert drop["gradinversion"] <= drop["idlg"] - MARGIN_DB
    assert min(psnr[("dlg", 1)], psnr[("dlg", 2)]) >= 20.0
    notes = (folder / "results.md").read_text()
    # flagged exactly when DLG's PSNR rises with the batch (one sample per cell in smoke)
    flagged = "CONTRADICTS the stated trend (leakage falls as the batch size grows) for attack dlg" in notes
    assert flagged == (drop["dlg"] < 0), (drop["dlg"], flagged)
    # labels come from the update (iDLG, Eq. 8) before any optimisation: exact for distinct labels
    for r in result.rows:
        if r["attack"] in ("idlg", "gradinversion", "ig"):
            assert r["label_accuracy"] == 1.0, r
    # the recovered column a reader gets follows the threshold results.md declares
    op, threshold = _declared_threshold(folder)
    assert (op, threshold) == (">=", RECOVERED_DB)
    for ln in lines:
        assert ln["recovered"] == str(float(ln["psnr_oracle_pairing"]) >= threshold), ln


def test_model_size_smoke_through_the_cli(tmp_path, capsys):
    """Measured at --smoke (Inverting Gradients, 300 iterations): width 4 13.0 dB, width 16 18.2 dB."""
    out = tmp_path / "ms"
    assert main(["experiment", "model-size", "--smoke", "--no-progress", "--out", str(out)]) == 0
    assert "results.csv" in capsys.readouterr().out
    data = json.loads((out / "experiment.json").read_text())
    rows = data["rows"]
    with (out / "results.csv").open(newline="") as fh:
        assert next(csv.reader(fh))[:8] == ["attack", "model", "width", "parameters", "sample", "seed", "psnr_by_label",
                                            "psnr_oracle_pairing"]
    by_width = {r["width"]: r for r in rows}
    assert sorted(by_width) == [4, 16]
    assert by_width[16]["parameters"] > 4 * by_width[4]["parameters"]
    assert by_width[16]["psnr_oracle_pairing"] >= by_width[4]["psnr_oracle_pairing"] + 2.0
    for r in rows:
        assert math.isfinite(r["psnr_oracle_pairing"]) and 0 <= r["mse"] <= 1 and -1 <= r["ssim"] <= 1
