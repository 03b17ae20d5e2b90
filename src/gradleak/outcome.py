"""What an attacked update says about the client: one verdict, judged by one function
(:func:`judge`) from its :class:`Evidence` (outcome_evidence.py), against the lines named in
outcome_lines.py; no torch, so every surface can use it. Every public name of the three is
importable from here. The rules in full: docs/reference/verdicts.md."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .modalities import recorded_modality
from .outcome_evidence import (Evidence, decoy_evidence, evidence_from_metrics, finite, fmt, number,
                               recognisable_row, recovered_words, truth_start_leak)
from .outcome_lines import (BEAT_MARGIN, COARSE_SSIM_LINE, CONVERGED_BELOW, DECOY_TEST, DEFENDED, FAILED,
                            INCONCLUSIVE, LEAK_PSNR_DB, LEAKED, MIN_DECOY_POOL, MIN_IIP_POOL, PRESUME_RATIO,
                            PRESUMED_LEAKED, RECOGNISABLE_SSIM, SKIPPED, STRONG_MARGIN, TEXT_LEAK_TOKEN_ACCURACY,
                            TEXT_SET_PRECISION, TEXT_SET_RECALL, TRUTH_FIT_SLACK, TRUTH_START_TEST, VERDICTS)


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
                                 f"recognisable (SSIM {fmt(ev.ssim)})", "look at reconstruction.png")
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
        start = f"at most PSNR {fmt(ev.truth_start_psnr)} dB, SSIM {fmt(ev.truth_start_ssim)}"
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
                                     f"modelled noise floor at {fmt(floor)}): the truth's fit is no yardstick here",
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
        return f"{ev.recognisable} image(s) recognisable (mean PSNR {fmt(psnr)} dB){why}"
    return ""


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
                                 f"{fmt(answer)}) is not below {PRESUME_RATIO:g} x the best of {len(refs)} batches "
                                 f"nobody optimised (the attacks' starts, public decoy batches with the restored "
                                 f"labels: {min(refs):.3g}): a random or public batch fits the update about as well",
                   decide)
    beat = f"; {fmt(answer)} <= {PRESUME_RATIO:g} x {min(refs):.3g}, the best of {len(refs)} starts and decoy " \
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
