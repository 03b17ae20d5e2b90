"""What an attacked update says about the client: one verdict, judged by one function
(:func:`judge`), with every threshold as a named constant here; no torch, so every surface can
use it. The rules in full: docs/reference/verdicts.md."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import ConfigError
from .modalities import MODALITIES, recorded_modality
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


@dataclass(frozen=True)
class Evidence:
    """What one attacked update offers for its verdict (all optional but ``status``).

    status:          "ok" (attacked), "skipped", anything else: failed.
    modality:        "image" | "text"; its declaration (modalities.py) says what the answer is
                     measured in (images or tokens) and how a verdict words "nothing leaked".
    has_truth:       the metrics were scored against the client's true data.
    psnr, ssim:      mean over the batch (images).
    identified:      images the IIP search identified; None: not measured.
    recognisable:    images :func:`recognisable_row` calls recognisable; None: not measured.
    recognised:      for each of them, why (name, coarse SSIM against the zero and prior images').
    token_accuracy:  text, position-wise; exact_sentences: sentences rebuilt exactly.
    token_set_precision, token_set_recall: text, distinct content tokens; words: the recovered
                     words that are in the client's sentences.
    converged:       the attack's own verdict (attacks/verdict.py); None: none recorded.
    answer_distance: the answer's relative gradient distance to the shared update.
    truth_distance:  the true data's relative distance to the same (defended) update.
    tolerance:       the noise floor's tolerance (attacks/verdict.py), added to the truth's.
    defenses:        the update's defenses (canonical specs).
    attack_line:     the attack's convergence line (no-truth judgement); noise_floor, unmodelled:
                     the defenses' modelled floor and the defenses it does not model.
    control:         the verdict of the same attack without the defenses (None: not run).
    others_leaked:   ``auto``'s other attacks on the same update whose answers leaked, as
                     "attack: why" (the verdict is the worst case over every attack that ran).
    decoy_truth, decoy_distances: with truth, the true batch's and decoy batches' (public photos
                     with the truth's labels) distances to the defended update, as the decoy test
                     measured them (pipeline/decoys.py); decoy_spread: the noise's spread it allows.
    references:      without truth, the distances of the attacks' starts and of decoy batches
                     with the restored labels (pipeline/decoys.py); () where not measured.
    truth_start_leak: the truth-start test (TRUTH_START_TEST): why its answers are a leak, "" when
                     they walked away to no leak, None when not run; truth_start_psnr, _ssim: the
                     highest means of its answers; truth_start_attacks: the attacks it started,
                     truth_start_kept: those whose answer stayed a leak.
    auto:            the run was ``auto`` (it already tried several attacks: the advice differs).
    client_model:    how completely the attacker modelled the announced FedAvg client ("exact", or
                     what it could not know, e.g. "order unknown: lower bound"; fl.threats).
    """

    status: str = "ok"
    modality: str = "image"
    has_truth: bool = False
    psnr: float | None = None
    ssim: float | None = None
    identified: int | None = None
    recognisable: int | None = None
    recognised: tuple[str, ...] = ()
    token_accuracy: float | None = None
    exact_sentences: int | None = None
    token_set_precision: float | None = None
    token_set_recall: float | None = None
    words: tuple[str, ...] = ()
    converged: bool | None = None
    answer_distance: float | None = None
    truth_distance: float | None = None
    tolerance: float = 0.0
    defenses: tuple[str, ...] = ()
    attack_line: float | None = None
    noise_floor: float | None = 0.0
    unmodelled: tuple[str, ...] = ()
    control: str | None = None
    others_leaked: tuple[str, ...] = ()
    decoy_truth: float | None = None
    decoy_distances: tuple[float, ...] = ()
    decoy_spread: float | None = None
    references: tuple[float, ...] = ()
    truth_start_leak: str | None = None
    truth_start_psnr: float | None = None
    truth_start_ssim: float | None = None
    truth_start_attacks: tuple[str, ...] = ()
    truth_start_kept: tuple[str, ...] = ()
    auto: bool = False
    client_model: str = ""


@dataclass(frozen=True)
class Outcome:
    verdict: str
    reason: str
    next_step: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def truth(self) -> bool:
        return bool(self.evidence.get("has_truth"))

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "verdict_reason": self.reason, "next_step": self.next_step,
                "evidence": self.evidence}


def number(v: Any) -> float | None:
    """A number that can be judged (not NaN, not a bool), from a number or a numeric string."""
    if v is None or isinstance(v, bool) or v == "":
        return None
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return None if f != f else f


def _no_defense_to_credit(ev: Evidence, out: Any, nothing: str, retry: str) -> "Outcome | None":
    """Inconclusive when a failed attack has no defense to credit: the update carries none, or
    the attacker models the client incompletely (announced local training is never why
    "defended"); None otherwise."""
    if not ev.defenses:
        how = "" if ev.converged is True else " (it did not converge)" if ev.converged is False else ""
        return out(INCONCLUSIVE, f"the attack {nothing}{how}, and the update carries no defense: the attack failed "
                                 "here, which protects nobody", retry)
    if ev.client_model not in ("", "exact"):
        return out(INCONCLUSIVE, f"the attack {nothing}, but it models the client incompletely ({ev.client_model})",
                   retry)
    return None


def judge(ev: Evidence) -> Outcome:
    """The verdict of one attacked update (see the module docstring for the rules)."""
    facts = {k: v for k, v in asdict(ev).items() if v not in (None, (), "")}

    def out(verdict: str, reason: str, next_step: str = "") -> Outcome:
        return Outcome(verdict, reason, next_step, facts)

    if ev.status == "skipped":
        return out(SKIPPED, "not attacked")
    if ev.status != "ok":
        return out(FAILED, "the attack failed", "see the error; fix the input or run another attack")
    if not ev.has_truth:
        return _without_truth(ev, out)
    leak = _leak(ev)
    if leak:
        return out(LEAKED, leak)
    if ev.others_leaked:   # the kept answer did not leak, but another attack on the same update did
        return out(LEAKED, f"another attack auto ran on this update leaked ({'; '.join(ev.others_leaked)}); the "
                           "answer shown is the one that explains the update best")
    modality = recorded_modality(ev.modality)
    nothing, images = modality.nothing, modality.measures == "images"
    retry = _retry(ev)
    undefended = _no_defense_to_credit(ev, out, nothing, retry)
    if undefended is not None:
        return undefended
    fit = _truth_fit(ev, out, nothing, retry)
    if isinstance(fit, Outcome):
        return fit
    if images and number(ev.psnr) is None:
        return out(INCONCLUSIVE, "no finite PSNR was recorded for the answer", "rerun the attack")
    if images and (ev.identified or 0) > 0:
        return out(INCONCLUSIVE, f"{ev.identified} image(s) identified among the source's photos although not "
                                 f"recognisable (SSIM {_fmt(ev.ssim)})", "look at reconstruction.png")
    if _without_truth(ev, out).verdict == PRESUMED_LEAKED:
        # Without the truth this very answer would be presumed a leak (it explains the update as
        # closely as on an undefended one): the two judgements must not part into "defended"
        return out(INCONCLUSIVE, f"the answer explains the update as closely as on an undefended update (the "
                                 f"defenses' noise floor is at most the attack's line) yet {nothing}: the update does "
                                 "not pin the data down here, which is no evidence that the defense did it",
                   "look at reconstruction.png: the verdict cannot decide this answer")
    if ev.control is None:
        return out(INCONCLUSIVE, f"the attack {nothing} under {', '.join(ev.defenses)} and {fit}, but no positive "
                                 "control (the same attack without the defense) was run",
                   "run the same attack without --defense as a control")
    if ev.control == FAILED:
        return out(INCONCLUSIVE, "the positive control (the same attack without the defense) could not run, so "
                                 "nothing shows that this attack rebuilds the undefended update",
                   "run the same attack without --defense")
    if ev.control != LEAKED:
        return out(INCONCLUSIVE, f"the same attack without the defense did not leak either ({ev.control}): this "
                                 "attack cannot rebuild this setting, so its failure says nothing about the defense",
                   "try an attack that rebuilds the undefended update" + ("" if ev.auto else " (--attack auto)"))
    return out(DEFENDED, f"{', '.join(ev.defenses)} stopped an attack that rebuilds the undefended update: {fit}, and "
                         f"it {nothing}")


def _retry(ev: Evidence) -> str:
    """What an auditor can try after an optimisation failure, given what was run (``auto``
    already tried every attack that applies: another seed or a larger budget, not auto again)."""
    missing = ""
    if ev.client_model not in ("", "exact"):
        names = {"order unknown": "mini-batch order across epochs", "augmentation unknown": "augmentation draws"}
        unknown = " and ".join(names.get(p.strip(), p.strip()) for p in ev.client_model.split(":")[0].split(","))
        missing = f"the attacker does not know the client's {unknown} (private: the answer is a lower bound); " \
                  "audit where they are known, or "
    if ev.auto:
        return missing + "rerun with another --seed (new starts for every attack auto tries)"
    return missing + "run --attack auto (it tries several attacks), or another --seed"


def decoy_separated(truth: float, decoys: Iterable[float], spread: float | None) -> bool:
    """The decoy test (DECOY_TEST): is the true batch's distance below the best decoy batch's by
    more than the noise's spread? True also when no finite decoy distance is given (untested)."""
    finite_decoys = [d for d in (finite(v) for v in decoys) if d is not None]
    return not finite_decoys or truth < min(finite_decoys) - (finite(spread) or 0.0)


def _decoy_fit(ev: Evidence, out: Any, own: float | None, truth: float | None, answer: float | None,
               retry: str) -> "Outcome | str":
    """The decoy test decides the fit: separated, the update still singles the truth out (an
    attack could in principle find it; inconclusive); not, no attack on that objective can."""
    decoys = [d for d in (finite(v) for v in ev.decoy_distances) if d is not None]
    spread = finite(ev.decoy_spread) or 0.0
    if own is None or not decoys:
        return out(INCONCLUSIVE, "the decoy test recorded no finite distances", "rerun the attack")
    seen = (f"the true batch at distance {own:.4g}, the best of {len(decoys)} decoy batches (public photos "
            f"with its labels) at {min(decoys):.4g}, noise spread {spread:.2g}")
    if decoy_separated(own, decoys, spread):
        started = ", ".join(ev.truth_start_attacks) or "the attack"
        start = f"at most PSNR {_fmt(ev.truth_start_psnr)} dB, SSIM {_fmt(ev.truth_start_ssim)}"
        if ev.truth_start_leak == "" and not ev.unmodelled:   # the truth-start test: even from the truth they walk away
            return (f"started from the true batch, {started} walked away to answers that are no leak (truth-start test: "
                    f"{start}, no image recognisable): the defended objectives show no recognisable image near the "
                    f"truth, so no optimiser on them rebuilds one; the update still picks the true batch out of "
                    f"{len(decoys)} public decoys ({seen}): an identification, not a reconstruction")
        fits = answer is not None and truth is not None and \
            answer <= truth * (1 + TRUTH_FIT_SLACK) + (finite(ev.tolerance) or 0.0)
        worse = f"the true data explain the defended update better than the attack's answer ({truth:.3g} vs " \
                f"{answer:.3g}): an optimisation failure, not evidence of protection; and " \
            if answer is not None and truth is not None and not fits else ""
        if ev.truth_start_leak:
            kept = ", ".join(ev.truth_start_kept) or "the attack"
            stays = "stays" if len(ev.truth_start_kept) <= 1 else "stay"
            return out(INCONCLUSIVE, f"{worse}started from the true batch, {kept} {stays} a leak (truth-start test: "
                                     f"{ev.truth_start_leak}): the defended objective still holds a recognisable "
                                     f"image near the truth, which a stronger optimiser may reach; the update tells "
                                     f"the true batch from decoy batches ({seen})",
                       f"run --attack {ev.truth_start_kept[0] if ev.truth_start_kept else 'auto'} with more steps "
                       "per start (--iterations) or more starts (another --seed)")
        return out(INCONCLUSIVE, f"{worse}the defended update still tells the true batch from decoy batches ({seen}): "
                                 "an attack on this objective can single the truth out", retry)
    return (f"the defended update does not tell the true batch from decoy batches ({seen}; decoys up to "
            f"{max(decoys):.4g}): no attack on this objective can single the truth out")


def _truth_fit(ev: Evidence, out: Any, nothing: str, retry: str) -> "Outcome | str":
    """Does the defended update leave the truth indistinguishable? With decoy distances recorded,
    the decoy test decides (it does not depend on the optimiser's reach); else, with the truth's
    own distance, whether the answer explains the update as well as the truth does (the attack's
    convergence line only models the noise; the truth measures it); without either, the attack's
    own verdict. Returns the inconclusive Outcome when not, else the sentence that says so."""
    answer, truth, tol = finite(ev.answer_distance), finite(ev.truth_distance), finite(ev.tolerance)
    floor = finite(ev.noise_floor)
    if ev.decoy_distances:
        return _decoy_fit(ev, out, finite(ev.decoy_truth), truth, answer, retry)
    if answer is not None and truth is not None and tol is not None:
        if ev.unmodelled and (floor is None or truth > floor * (1 + TRUTH_FIT_SLACK) + tol):
            # The attacker's simulation does not apply what the floor does not model (DP-SGD's
            # per-sample clipping, pruning): the truth's distance then measures that mismatch, not
            # how much the update says, and no answer can be held to it
            return out(INCONCLUSIVE, f"under {', '.join(ev.unmodelled)} the attacker's simulation does not reproduce "
                                     f"the client's update (the true data sit at relative distance {truth:.3g}, the "
                                     f"modelled noise floor at {_fmt(floor)}): the truth's fit is no yardstick here",
                       "rerun with this version of gradleak, which tests the truth against decoy batches"
                       if recorded_modality(ev.modality).measures == "images" else
                       "judge by what the answer shows: no attack's fit can be held to the truth's here")
        if answer > truth * (1 + TRUTH_FIT_SLACK) + tol:
            return out(INCONCLUSIVE, f"the true data explain the defended update better than the attack's answer "
                                     f"(relative distance {truth:.3g} vs {answer:.3g}): an optimisation failure, not "
                                     "evidence of protection", retry)
        fit = f"its answer explains the defended update as well as the true data do (relative distance {answer:.3g} " \
              f"vs {truth:.3g})"
    elif ev.converged is not True:
        why = "did not converge" if ev.converged is False else "recorded no convergence verdict"
        return out(INCONCLUSIVE, f"the attack {nothing} but {why}: a failed attack, not evidence of protection", retry)
    else:
        return out(INCONCLUSIVE, f"the attack {nothing} under {', '.join(ev.defenses)}, but how well the true data "
                                 "explain the defended update was not recorded", "rerun with this version of gradleak")
    return fit


def needs_truth_start(metrics: Mapping[str, Any]) -> bool:
    """Whether a scored, defended run's answer calls for the truth-start test (TRUTH_START_TEST):
    the answer is no leak (no image at >= LEAK_PSNR_DB, none recognisable) and the decoy test
    separated the truth. Run by the image case before the verdict (pipeline/image.py)."""
    test = metrics.get("decoy_test") if isinstance(metrics.get("decoy_test"), Mapping) else {}
    rows = [r for r in metrics.get("per_image") or [] if isinstance(r, Mapping)]
    if not metrics.get("defenses") or test.get("separated") is not True or not rows:
        return False
    return not truth_start_leak({"per_image": rows})


def needs_control(ev: Evidence) -> bool:
    """True when only the positive control is missing for "defended" (the pipeline then runs it)."""
    from dataclasses import replace

    return ev.control is None and judge(replace(ev, control=LEAKED)).verdict == DEFENDED


def _leak(ev: Evidence) -> str:
    """Why the answer is a leak ("" when it is not), from the scores against the truth in what
    the modality measures: sentences, tokens and sets of words, or PSNR and recognisable images."""
    if recorded_modality(ev.modality).measures == "tokens":
        if (ev.exact_sentences or 0) > 0:
            return f"{ev.exact_sentences} sentence(s) recovered exactly"
        acc = number(ev.token_accuracy)
        if acc is not None and acc >= TEXT_LEAK_TOKEN_ACCURACY:
            return f"{acc:.0%} of the tokens recovered in place (>= {TEXT_LEAK_TOKEN_ACCURACY:.0%})"
        precision, recall = number(ev.token_set_precision), number(ev.token_set_recall)
        if precision is not None and recall is not None and precision >= TEXT_SET_PRECISION \
                and recall >= TEXT_SET_RECALL:
            shown = ", ".join(ev.words[:20]) + (", ..." if len(ev.words) > 20 else "")
            return (f"the client's words came back (token-set precision {precision:.2f} >= {TEXT_SET_PRECISION:g}, "
                    f"recall {recall:.2f} >= {TEXT_SET_RECALL:g}): {shown or 'n/a'}")
        return ""
    psnr = number(ev.psnr)
    if psnr is not None and psnr >= LEAK_PSNR_DB:
        return f"rebuilt: PSNR {psnr:.1f} dB >= {LEAK_PSNR_DB:g} dB"
    if (ev.recognisable or 0) > 0:
        why = f": {'; '.join(ev.recognised)}" if ev.recognised else ""
        return f"{ev.recognisable} image(s) recognisable (mean PSNR {_fmt(psnr)} dB){why}"
    return ""


def recognisable_row(row: Mapping[str, Any]) -> str:
    """Why one image's answer is recognisable ("" when it is not), from its per-image row: full
    SSIM >= RECOGNISABLE_SSIM; or an identification among >= MIN_DECOY_POOL candidates with a
    coarse SSIM BEAT_MARGIN above the zero and prior images'; or a coarse SSIM >= COARSE_SSIM_LINE
    STRONG_MARGIN above them (a flat or noise answer does neither). Rows without coarse SSIM
    (older runs): SSIM."""
    full, own = number(row.get("ssim")), number(row.get("coarse_ssim"))
    name = str(row.get("name") or row.get("index", "?"))
    if full is not None and full >= RECOGNISABLE_SSIM:
        return f"{name}: SSIM {full:.2f} >= {RECOGNISABLE_SSIM:g}"
    if own is None:
        return ""
    prior = max(number(row.get("zero_coarse_ssim")) or 0.0, number(row.get("prior_coarse_ssim")) or 0.0)
    among = number(row.get("identified_among")) or 0
    identified = row.get("identified") is True and among >= MIN_DECOY_POOL
    if not ((identified and own >= prior + BEAT_MARGIN)
            or (own >= COARSE_SSIM_LINE and own >= prior + STRONG_MARGIN)):
        return ""
    how = [f"coarse SSIM {own:.2f}" + (f" >= {COARSE_SSIM_LINE:g}" if own >= COARSE_SSIM_LINE else "")]
    if identified:
        how.append(f"identified among {among:.0f}")
    return (f"{name}: {', '.join(how)}, above the zero image's {_fmt(row.get('zero_coarse_ssim'))} and the "
            f"prior images' {_fmt(row.get('prior_coarse_ssim'))}")


def truth_start_leak(record: Mapping[str, Any]) -> str | None:
    """Why the truth-start test's answers (metrics.json ``truth_start_test``: its ``runs``, one
    per attack, or one answer's ``per_image``) are a leak, image by image (PSNR >= LEAK_PSNR_DB,
    or :func:`recognisable_row`); "" when none is; None when no scored image is recorded."""
    if isinstance(record.get("runs"), list):
        runs = [r for r in record["runs"] if isinstance(r, Mapping)]
        found = [(r.get("attack"), truth_start_leak(r)) for r in runs]
        if all(why is None for _, why in found):
            return None
        return "; ".join(f"{name}: {why}" for name, why in found if why)
    rows = [r for r in record.get("per_image") or [] if isinstance(r, Mapping)] \
        if isinstance(record.get("per_image"), list) else []
    if not rows:
        return None
    why = []
    for r in rows:
        p = number(r.get("psnr"))
        if p is not None and p >= LEAK_PSNR_DB:
            why.append(f"{r.get('name') or r.get('index', '?')}: PSNR {p:.1f} dB >= {LEAK_PSNR_DB:g} dB")
        elif recognisable_row(r):
            why.append(recognisable_row(r))
    return "; ".join(why)


def _without_truth(ev: Evidence, out: Any) -> Outcome:
    """No ground truth (a real federation's audit, an update file without --truth): nothing can be
    called rebuilt or defended from the data; the attack's own evidence can presume a leak."""
    decide = "attack with --truth (the client's true batch) to score it"
    if ev.converged is not True:
        why = "did not converge" if ev.converged is False else "recorded no convergence verdict"
        return out(INCONCLUSIVE, f"no ground truth, and the attack {why}", _retry(ev))
    if ev.unmodelled:
        return out(INCONCLUSIVE, f"no ground truth: converged, but under {', '.join(ev.unmodelled)}, which the "
                                 "convergence line does not model", decide)
    line, floor = number(ev.attack_line), number(ev.noise_floor)
    if line is None:
        return out(INCONCLUSIVE, "no ground truth: converged, but the attack has no declared convergence line", decide)
    if floor is None:
        return out(INCONCLUSIVE, "no ground truth: converged on a defended update whose noise floor was not recorded",
                   decide)
    if floor > line:
        return out(INCONCLUSIVE, f"no ground truth: converged, but the defenses' noise floor {floor:.2g} exceeds the "
                                 f"attack's line {line:g}: any answer may fit", decide)
    refs = [r for r in (finite(v) for v in ev.references) if r is not None]
    answer = finite(ev.answer_distance)
    if refs and answer is not None and answer > PRESUME_RATIO * min(refs):
        # a prior-regularised attack's line can hold its own random start: the answer must fit
        # the update far better than batches nobody optimised (starts, public decoys) do
        return out(INCONCLUSIVE, f"no ground truth: converged by the attack's line, but its answer (relative distance "
                                 f"{_fmt(answer)}) is not below {PRESUME_RATIO:g} x the best of {len(refs)} batches "
                                 f"nobody optimised (the attacks' starts, public decoy batches with the restored "
                                 f"labels: {min(refs):.3g}): a random or public batch fits the update about as well",
                   decide)
    beat = f"; {_fmt(answer)} <= {PRESUME_RATIO:g} x {min(refs):.3g}, the best of {len(refs)} starts and decoy " \
           "batches" if refs and answer is not None else ""
    return out(PRESUMED_LEAKED, f"no ground truth: presumed rebuilt (the attack's answer explains the update; noise "
                                f"floor {floor:.2g} <= its line {line:g}{beat})", decide)


def tried_summary(auto: Mapping[str, Any]) -> str:
    """``auto``'s attacks as one line: whether each applied, converged, its relative distance and
    seconds, and, scored against the truth (pipeline.run.score_portfolio), its PSNR and verdict."""
    parts = []
    for t in auto.get("tried", []) if isinstance(auto.get("tried"), list) else []:
        if not isinstance(t, Mapping):
            continue
        if not t.get("applies"):
            parts.append(f"{t.get('attack')} (does not apply)")
            continue
        bits = ["fits only as well as the truth would (noise floor)" if t.get("converged") and t.get("floor_only")
                else "converged" if t.get("converged") else "not converged"]
        rel, secs, psnr = number(t.get("relative_gradient_distance")), number(t.get("seconds")), number(t.get("psnr_mean"))
        if rel is not None:
            bits.append(f"distance {rel:.2e}")
        if secs is not None:
            bits.append(f"{secs:.3g} s")
        if psnr is not None:
            bits.append(f"{psnr:.1f} dB")
        if isinstance(t.get("verdict"), str):
            bits.append(t["verdict"])
        parts.append(f"{t.get('attack')} ({', '.join(bits)})")
    return ", ".join(parts)


def finite(v: Any) -> float | None:
    """A finite number (not NaN, not +-inf), else None: an infinite distance fits nothing."""
    f = number(v)
    return f if f is not None and f not in (float("inf"), float("-inf")) else None


def _fmt(v: Any) -> str:
    f = number(v)
    return "n/a" if f is None else f"{f:.3g}" if abs(f) < 1000 else f"{f:.0f}"


def evidence_from_metrics(metrics: Mapping[str, Any], *, status: str = "ok", control: str | None = None) -> Evidence:
    """The evidence a run's metrics.json (or a sweep cell's stored metrics) holds."""
    conv = metrics.get("convergence") if isinstance(metrics.get("convergence"), Mapping) else {}
    converged = metrics.get("converged", conv.get("converged"))
    modality = recorded_modality(metrics.get("modality"))
    per = metrics.get("per_image") if isinstance(metrics.get("per_image"), list) else []
    sentences = metrics.get("per_sentence") if isinstance(metrics.get("per_sentence"), list) else []
    has_truth = (number(metrics.get("psnr_mean")) is not None or bool(per)) if modality.measures == "images" \
        else number(metrics.get("token_accuracy")) is not None
    identified = recognisable = None
    pool = number(metrics.get("iip_pool_size"))
    rows = [r for r in per if isinstance(r, Mapping)]
    recognised = tuple(why for why in (recognisable_row(r) for r in rows) if why)
    if rows:   # recognisable whatever the pixel noise, and more than a flat or public answer shows
        recognisable = len(recognised)
    if any("identified" in r for r in rows) and (pool is None or pool >= MIN_IIP_POOL):
        identified = sum(1 for r in rows if r.get("identified") is True)
    exact = sum(1 for s in sentences if isinstance(s, Mapping) and number(s.get("token_accuracy")) == 1.0) \
        if sentences else None
    defenses = metrics.get("defenses") or []
    if control is None and isinstance(metrics.get("control"), Mapping):   # run by the pipeline (with_control)
        c = metrics["control"]
        same = c.get("attack") in (None, metrics.get("attack"))   # a control of another attack is none
        control = c.get("verdict") if isinstance(c.get("verdict"), str) and same else None
    if metrics.get("status") == "diverged":
        status = "failed"
    attack = str(metrics.get("attack_used") or metrics.get("attack") or "")
    portfolio = metrics.get("auto") if isinstance(metrics.get("auto"), Mapping) else {}
    tried = portfolio.get("tried") if isinstance(portfolio.get("tried"), list) else []
    others = tuple(f"{t.get('attack')}: {t.get('verdict_reason')}" for t in tried
                   if isinstance(t, Mapping) and t.get("verdict") == LEAKED and t.get("attack") != attack)
    floor = conv.get("noise_floor", 0.0) if conv else metrics.get("noise_floor", 0.0)
    return Evidence(
        status=status, modality=modality.name, has_truth=has_truth,
        psnr=number(metrics.get("psnr_mean")), ssim=number(metrics.get("ssim_mean")), identified=identified,
        recognisable=recognisable, recognised=recognised, token_accuracy=number(metrics.get("token_accuracy")),
        exact_sentences=exact, token_set_precision=number(metrics.get("token_set_precision")),
        token_set_recall=number(metrics.get("token_set_recall")), words=recovered_words(metrics),
        converged=converged if isinstance(converged, bool) else None,
        answer_distance=number(metrics.get("relative_gradient_distance", conv.get("relative_gradient_distance"))),
        truth_distance=number(metrics.get("truth_relative_distance")),
        tolerance=number(conv.get("floor_tolerance")) or 0.0,
        defenses=tuple(str(d) for d in defenses) if isinstance(defenses, (list, tuple)) else (),
        attack_line=CONVERGED_BELOW.get(modality.verdict_family or attack),
        noise_floor=number(floor) if floor is not None else None,
        unmodelled=tuple(str(u) for u in conv.get("unmodelled_defenses", ()) or ()),
        control=control, others_leaked=others if has_truth else (), **decoy_evidence(metrics, has_truth),
        client_model=str(metrics.get("client_model") or ""))


def decoy_evidence(metrics: Mapping[str, Any], has_truth: bool) -> dict[str, Any]:
    """The Evidence fields the decoy yardsticks give (pipeline/decoys.py): with truth the decoy
    test's distances and spread (``decoy_test``) and the truth-start test (``truth_start_test``),
    without it the starts' and decoys' distances with the restored labels (``reference_distances``);
    and whether the run was ``auto``."""
    test = metrics.get("decoy_test") if isinstance(metrics.get("decoy_test"), Mapping) else {}
    refs = metrics.get("reference_distances") if isinstance(metrics.get("reference_distances"), Mapping) else {}

    def numbers(values: Any) -> tuple[float, ...]:
        return tuple(f for f in (number(v) for v in values) if f is not None) if isinstance(values, list) else ()

    same = has_truth and number(test.get("truth")) is not None   # a decoy test needs the truth's own distance
    start = metrics.get("truth_start_test") if has_truth and isinstance(metrics.get("truth_start_test"), Mapping) \
        else {}
    runs = [r for r in start.get("runs") or [] if isinstance(r, Mapping)] if isinstance(start.get("runs"), list) \
        else ([start] if start else [])

    def best(key: str) -> float | None:
        values = [v for v in (number(r.get(key)) for r in runs) if v is not None]
        return max(values) if values else None

    return {"truth_start_leak": truth_start_leak(start) if start else None,
            "truth_start_psnr": best("psnr_mean"), "truth_start_ssim": best("ssim_mean"),
            "truth_start_attacks": tuple(str(r.get("attack")) for r in runs if r.get("attack")),
            "truth_start_kept": tuple(str(r.get("attack")) for r in runs if r.get("attack") and truth_start_leak(r)),
            "decoy_truth": number(test.get("truth")) if same else None,
            "decoy_distances": numbers(test.get("decoys")) if same else (),
            "decoy_spread": number(test.get("spread")) if same else None,
            "references": numbers(refs.get("starts")) + numbers(refs.get("decoys")),
            "auto": isinstance(metrics.get("auto"), Mapping)}


def recovered_words(metrics: Mapping[str, Any]) -> tuple[str, ...]:
    """The distinct recovered words (word pieces) that are in the client's sentences, in order:
    from each sentence's recovered tokens, or the bag of words for an attack without order."""
    rows = [r for r in metrics.get("per_sentence") or [] if isinstance(r, Mapping)]
    truth = {str(t) for r in rows for t in (r.get("tokens_true") or [])}
    bag = metrics.get("bag_of_words") if isinstance(metrics.get("bag_of_words"), Mapping) else {}
    if metrics.get("attack") == "bow":
        recovered = [str(t) for t in bag.get("tokens") or []]
    else:
        recovered = [str(t) for r in rows for t in (r.get("tokens_recovered") or [])]
    return tuple(dict.fromkeys(t for t in recovered if t in truth))


def worst(verdicts: Iterable[str]) -> str:
    """The worst of several verdicts on one setting (e.g. one per attack): VERDICTS order, except
    that "defended" needs every attack defended (any other verdict beside it is no protection)."""
    labels = list(verdicts)
    if not labels:
        return INCONCLUSIVE
    known = [v if v in VERDICTS else INCONCLUSIVE for v in labels]   # a label no verdict knows proves nothing
    return min(known, key=VERDICTS.index)


def console_line(outcome: Outcome) -> str:
    """The run's one-line verdict, and what would decide it when it does not decide."""
    line = f"verdict: {outcome.verdict}: {outcome.reason}"
    return line + (f". Next: {outcome.next_step}" if outcome.next_step and outcome.verdict != LEAKED else "")


__all__ = ["CONVERGED_BELOW", "DEFENDED", "Evidence", "FAILED", "INCONCLUSIVE", "LEAKED", "LEAK_PSNR_DB",
           "MIN_IIP_POOL", "MIN_DECOY_POOL", "COARSE_SSIM_LINE", "BEAT_MARGIN", "STRONG_MARGIN", "TEXT_SET_PRECISION",
           "TEXT_SET_RECALL", "Outcome", "PRESUMED_LEAKED", "RECOGNISABLE_SSIM", "SKIPPED", "TEXT_LEAK_TOKEN_ACCURACY", "TRUTH_FIT_SLACK", "VERDICTS", "console_line", "tried_summary",
           "evidence_from_metrics", "judge", "DECOY_TEST", "PRESUME_RATIO", "decoy_evidence", "decoy_separated", "recognisable_row",
           "TRUTH_START_TEST", "truth_start_leak", "needs_truth_start", "recovered_words", "needs_control", "number", "worst"]
