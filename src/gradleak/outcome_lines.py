"""The verdict labels and every line the judge (outcome.py) holds an answer to, as named
constants: PSNR, SSIM and identification lines, the text lines, the fit slack, the yardstick
tests and each attack's convergence line. No torch; the rules in full: docs/reference/verdicts.md."""

from __future__ import annotations

from .errors import ConfigError
from .modalities import MODALITIES
from .specs import attack_specs

LEAKED, PRESUMED_LEAKED, INCONCLUSIVE, FAILED, SKIPPED, DEFENDED = (
    "leaked", "presumed leaked", "inconclusive", "failed", "skipped", "defended")
#: Worst first: a leak, a presumed leak, what says nothing about the client, then protection.
VERDICTS = (LEAKED, PRESUMED_LEAKED, INCONCLUSIVE, FAILED, SKIPPED, DEFENDED)

#: Mean PSNR (dB) from which images count as rebuilt (MSE 0.01 on [0, 1] pixels; the experiments'
#: success threshold, experiments/common.py THRESHOLD_DB, held equal by a test).
LEAK_PSNR_DB = 20.0
#: An image the IIP search identifies (its nearest photo of the source is the client's) with at
#: least this SSIM is recognisable: a leak whatever its PSNR. A declared line: GradInversion's
#: 19.3 dB batch whose horse, truck and plane are plain to see scores SSIM 0.71; answers that are
#: noise (DP-SGD, heavy noise) score below 0.05. An identified image below it keeps the verdict
#: from "defended" (inconclusive), since identification by chance is 1 in the pool's size.
RECOGNISABLE_SSIM = 0.5
#: Identification is evidence only among at least this many candidate photos (IIP's pool): among 3
#: photos (a user's folder of three) a noise answer is "identified" by chance one time in three.
MIN_IIP_POOL = 10
#: Recognisable whatever the pixel noise: an image whose coarse SSIM (metrics/recognisable.py: SSIM
#: of the images block-averaged 4 x 4, where pixel noise shrinks 4-fold) against the client's is at
#: least this, or that IIP identifies among at least MIN_DECOY_POOL candidates, and that beats
#: both the zero image and the public prior image on coarse SSIM by BEAT_MARGIN. Calibrated by
#: benchmarks/recognisable.py (its JSON: every case, every image): see COARSE_SSIM_LINE's numbers there.
COARSE_SSIM_LINE = 0.5
#: Identification counts toward "recognisable" only among this many candidates (the originals,
#: the client's source and the public decoys): a chance hit is then at most 1 in 50.
MIN_DECOY_POOL = 50
#: How far above the zero image's and the public prior image's coarse SSIM an answer must be.
BEAT_MARGIN = 0.1
#: Without an identification, how far above them a coarse SSIM >= COARSE_SSIM_LINE must be: an
#: answer that IIP does not pick out among MIN_DECOY_POOL candidates is recognisable only by a
#: structure well beyond what the priors show. Measured (benchmarks/recognisable.json): every
#: leaked case is identified with a margin >= 0.5; the highest answers that must not leak sit
#: 0.34-0.35 above (camera under Gaussian 0.1 at coarse 0.35, china under 1e-2 at 0.50, neither
#: identified), and DLG under Gaussian 0.1 on Fashion-MNIST trousers (5.2 dB, a noise image with a
#: lighter middle) 0.12 above the source's own mean image, not identified among 379.
STRONG_MARGIN = 0.3
#: Text: this share of tokens in place (position-wise) is a leak, and so is any exact sentence.
TEXT_LEAK_TOKEN_ACCURACY = 0.5
#: Text: a leaked set of words: token-set precision and recall (distinct content tokens, against
#: the batch's) both at least these. Calibrated by benchmarks/recognisable.py's text cases.
TEXT_SET_PRECISION = 0.8
TEXT_SET_RECALL = 0.4
#: "Explains the defended update at least as well as the true data": the answer's relative
#: gradient distance at most the truth's x (1 + TRUTH_FIT_SLACK) + the noise floor's tolerance
#: (defenses/floor.py: 3 standard deviations of the truth's own distance over the noise's draws;
#: 0.017 for Gaussian 0.1 and 0.041 for DP-SGD noise 1 on the DLG LeNet). Within it the update
#: cannot tell the answer from the truth; beyond it the truth fits better: an optimisation failure.
#: 1 % absorbs rounding between the attack's and the evaluation's computation.
TRUTH_FIT_SLACK = 0.01
#: The decoy test (pipeline/decoys.py): the defended update "tells the true batch from decoy
#: batches" (public photos carrying the truth's labels, scored as the attacks score answers) when
#: the truth's relative distance is below the best decoy's by more than the noise's spread (the
#: floor's tolerance: how far a redraw of the noise alone moves the truth's own distance). Under a
#: defense the floor does not model (DP-SGD's clipping) both are taken after the best scale of the
#: simulated update (1 - cos^2), so that a decoy of smaller gradient norm cannot pass for a match.
#: Not separated: no attack on that objective can single the truth out, whatever its optimiser.
#: Measured (benchmarks/defended_evidence.py, DLG LeNet, 12 photos): Gaussian 0.01-0.1 separated
#: on 12 of 12 (0.1: by 1.5-12 x the spread), Gaussian 1 and DP-SGD noise 1 on none.
DECOY_TEST = "separated: truth < min(decoys) - spread (spread: the noise floor's tolerance)"
#: The truth-start test (pipeline/truth_start.py): with truth, when the answer is no leak under a
#: defense and the decoy test still separates the truth (an identification among candidates, not
#: a reconstruction), the same attack (its config, one start, TRUTH_START_SHARE of its iterations)
#: and a prior-regularised one (truth_start.PRIOR_ATTACK, Inverting Gradients) start from the true
#: batch on the defended update. Each answer is judged image by image by the leak rules (PSNR >=
#: LEAK_PSNR_DB or :func:`recognisable_row`). None a leak: even from the truth these objectives
#: lead to no recognisable image, so no optimiser on them rebuilds one: the defense did it
#: (defended, given the positive control). A leak: an objective still holds a recognisable image
#: near the truth, which a stronger optimiser may reach (inconclusive). Not run under a defense the
#: attacker's simulation does not reproduce (pruning, DP-SGD's clipping): there even the truth is
#: no minimum of the attack's objective, and walking away from it may be that mismatch (the
#: defenses smoke run: DLG and iDLG walk away from the truth under prune 0.9, where text DLG leaks).
TRUTH_START_TEST = "walked away: started from the true batch, the attack ends on no image at >= 20 dB or recognisable"
#: Without truth, "presumed leaked" needs the answer's relative distance at most this share of the
#: best distance that batches nobody optimised score on the same update (the attacks' starts and
#: decoy batches with the restored labels): measured by benchmarks/defended_evidence.py, converged
#: iDLG answers (batch 1, 2) sit at 1.5e-9 and 4.9e-5 of it, GradInversion's and IG's 5-step answers
#: (inside their 0.4 line) at 2.9-5.3 x it, a coarse line between, stated as such.
PRESUME_RATIO = 0.1
#: The relative gradient distance at or below which an attack's answer explains the update
#: (its convergence line; attacks/verdict.py says how each was measured and applies it).
#: Each attack declares its line in its SPEC (gradleak/specs.py). A modality whose attacks are one
#: family (its ``verdict_family``: text's) declares one line in all its SPECs, named by the family.
CONVERGED_BELOW: dict[str, float] = {name: spec.converged_below for name, spec in attack_specs().items()
                                     if spec.converged_below is not None}


def _family_line(modality: str) -> float:
    lines = {spec.converged_below for spec in attack_specs(modality).values() if spec.converged_below is not None}
    if len(lines) != 1:
        raise ConfigError(f"the {modality} attacks' SPECs must declare one convergence line, not {sorted(lines)}")
    return lines.pop()


CONVERGED_BELOW.update({m.verdict_family: _family_line(m.name) for m in MODALITIES.values()
                        if m.verdict_family is not None})
