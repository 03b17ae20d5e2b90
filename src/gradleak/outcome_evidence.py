"""What an attacked update offers for its verdict: :class:`Evidence`, gathered from a run's
metrics.json (its scores, the attack's convergence, the decoy and truth-start tests, ``auto``'s
other attacks), and the per-image leak reading (:func:`recognisable_row`). Judged by outcome.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .modalities import recorded_modality
from .outcome_lines import (BEAT_MARGIN, COARSE_SSIM_LINE, CONVERGED_BELOW, LEAK_PSNR_DB, LEAKED, MIN_DECOY_POOL,
                            MIN_IIP_POOL, RECOGNISABLE_SSIM, STRONG_MARGIN)


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


def number(v: Any) -> float | None:
    """A number that can be judged (not NaN, not a bool), from a number or a numeric string."""
    if v is None or isinstance(v, bool) or v == "":
        return None
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return None if f != f else f


def finite(v: Any) -> float | None:
    """A finite number (not NaN, not +-inf), else None: an infinite distance fits nothing."""
    f = number(v)
    return f if f is not None and f not in (float("inf"), float("-inf")) else None


def fmt(v: Any) -> str:
    """A number as the verdicts print it (3 significant digits; "n/a" for none)."""
    f = number(v)
    return "n/a" if f is None else f"{f:.3g}" if abs(f) < 1000 else f"{f:.0f}"


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
    return (f"{name}: {', '.join(how)}, above the zero image's {fmt(row.get('zero_coarse_ssim'))} and the "
            f"prior images' {fmt(row.get('prior_coarse_ssim'))}")


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
