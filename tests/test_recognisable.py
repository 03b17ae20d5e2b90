"""A recognisable image or a leaked set of words is a leak, whatever the pixel noise on it; a flat,
noise, public or random answer never is (outcome.recognisable_row, metrics/recognisable.py).

Image rows are measured for real (the measures the pipeline writes into metrics.json's
per_image) on scikit-image / scikit-learn photos at 32 px; the text rows are the newcomer's LAMP
run's (ROUGE-1 0.875 on the first sentence, token-set precision 1.0)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gradleak.cli import main
from gradleak.metrics import psnr, ssim
from gradleak.metrics.recognisable import candidate_pool, prior_image, public_decoys, recognisability
from gradleak.outcome import (DEFENDED, LEAKED, MIN_DECOY_POOL, evidence_from_metrics, judge,
                              recognisable_row)

PHOTOS = ("camera", "retina", "chelsea", "coffee")


def photo(name: str) -> torch.Tensor:
    """[1, 3, 32, 32] in [0, 1]: the photo's centre square."""
    skdata = pytest.importorskip("skimage.data")
    img = getattr(skdata, name)()
    img = img[..., :3] if img.ndim == 3 else np.stack([img] * 3, -1)
    h, w = img.shape[:2]
    s = min(h, w)
    sq = Image.fromarray(np.ascontiguousarray(img[(h - s) // 2:(h - s) // 2 + s, (w - s) // 2:(w - s) // 2 + s]))
    return torch.from_numpy(np.array(sq.resize((32, 32), Image.BICUBIC))).permute(2, 0, 1)[None].float() / 255


ZERO = torch.full((1, 3, 32, 32), 0.5)   # a flat image (the zero image of a [0.5]-mean normalisation)


def image_metrics(answer: torch.Tensor, truth: torch.Tensor, **extra) -> dict:
    """metrics.json of a batch-1 run with this answer, measured as the pipeline measures it."""
    row = {"index": 0, "name": "photo.png", "psnr": float(psnr(answer, truth)[0]), "ssim": float(ssim(answer, truth)[0])}
    row.update(recognisability(answer, truth, ZERO, candidate_pool(None, truth))[0])
    return {"psnr_mean": row["psnr"], "ssim_mean": row["ssim"], "per_image": [row], **extra}


def noisy(truth: torch.Tensor, std: float, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (truth + std * torch.randn(truth.shape, generator=gen)).clamp(0, 1)


DEFENDED_ELSE = {"defenses": ["gaussian:0.1"], "relative_gradient_distance": 0.5, "truth_relative_distance": 0.5,
                 "converged": False, "control": {"verdict": LEAKED}}


@pytest.mark.parametrize("name", PHOTOS)
def test_a_noisy_but_recognisable_image_is_leaked(name):
    truth = photo(name)
    answer = noisy(truth, 0.3)
    m = image_metrics(answer, truth)
    assert m["ssim_mean"] < 0.5 and m["psnr_mean"] < 20   # the old lines: "inconclusive"
    out = judge(evidence_from_metrics(m))
    assert out.verdict == LEAKED, out.reason
    assert "coarse SSIM" in out.reason and "photo.png" in out.reason
    row = m["per_image"][0]
    assert row["identified"] is True and row["identified_among"] >= MIN_DECOY_POOL
    # ... also under a defense, with everything else "defended" needs
    assert judge(evidence_from_metrics({**m, **DEFENDED_ELSE})).verdict == LEAKED


def test_the_pool_always_holds_public_decoys():
    truth = photo("camera")
    assert public_decoys(32, 3).shape[0] >= MIN_DECOY_POOL
    pool = candidate_pool(torch.cat([photo("coffee"), photo("chelsea")]), truth)
    assert pool.shape[0] >= MIN_DECOY_POOL + 2
    # a public copy of the client's own photo is dropped (it is that photo, not a decoy)
    assert not any(torch.allclose(p, truth[0], atol=0.02) for p in pool)


def answers(truth: torch.Tensor) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return {"zero": ZERO.clone(), "prior": prior_image(public_decoys(32, 3)), "uniform": torch.rand(truth.shape, generator=gen),
            "grey noise": (0.5 + 0.2 * torch.randn(truth.shape, generator=gen)).clamp(0, 1),
            "another photo": photo("coffee") if not torch.equal(truth, photo("coffee")) else photo("chelsea")}


@pytest.mark.parametrize("name", PHOTOS)
def test_flat_noise_public_and_other_answers_are_not_leaked(name):
    truth = photo(name)
    for what, answer in answers(truth).items():
        m = image_metrics(answer, truth)
        assert recognisable_row(m["per_image"][0]) == "", (what, m["per_image"][0])
        assert judge(evidence_from_metrics(m)).verdict != LEAKED, what
        # and they do not stand in the way of "defended" when everything else is there
        assert judge(evidence_from_metrics({**m, **DEFENDED_ELSE})).verdict == DEFENDED, what


def test_without_truth_no_answer_is_leaked():
    ev = evidence_from_metrics({"psnr_mean": None, "per_image": [], "converged": False})
    assert ev.has_truth is False and ev.recognisable is None
    assert judge(ev).verdict != LEAKED


def test_an_identification_among_a_small_pool_or_below_the_prior_is_no_leak():
    base = {"name": "x", "ssim": 0.2, "coarse_ssim": 0.3, "zero_coarse_ssim": 0.0, "prior_coarse_ssim": 0.05,
            "identified": True}
    assert recognisable_row({**base, "identified_among": MIN_DECOY_POOL})
    assert recognisable_row({**base, "identified_among": 17}) == ""        # a 6-photo folder alone
    assert recognisable_row({**base, "identified_among": 138, "prior_coarse_ssim": 0.25}) == ""   # the prior does as well
    assert recognisable_row({**base, "identified": False, "identified_among": 138}) == ""


def test_the_old_ssim_line_still_counts():
    # a row without coarse measures (an older run) and one with SSIM >= 0.5: recognisable as before
    assert recognisable_row({"name": "x", "ssim": 0.55})
    assert recognisable_row({"name": "x", "ssim": 0.55, "coarse_ssim": 0.0, "prior_coarse_ssim": 0.3})
    assert recognisable_row({"name": "x", "ssim": 0.45}) == ""


# ------------------------------------------------------------------------------------------ text
LAMP = {"modality": "text", "attack": "lamp", "token_accuracy": 0.1333, "token_set_precision": 1.0,
        "token_set_recall": 0.7857, "rouge1": 0.604, "converged": False, "relative_gradient_distance": 0.83,
        "truth_relative_distance": 8e-13, "per_sentence": [
            {"token_accuracy": 0.25, "rouge1": 0.875,
             "tokens_true": ["my", "landlord", "raised", "the", "rent", "again", "in", "march"],
             "tokens_recovered": ["raised", "in", "march", "my", "landlord", "landlord", "rent", "again"]},
            {"token_accuracy": 0.0, "rouge1": 0.333,
             "tokens_true": ["the", "bio", "##psy", "results", "came", "back", "negative"],
             "tokens_recovered": ["again", "came", "##psy", "in", "##psy", "rent", "negative", "back"]}]}


def test_a_leaked_set_of_words_is_leaked_and_shown():
    out = judge(evidence_from_metrics(LAMP))
    assert out.verdict == LEAKED, out.reason
    assert "landlord" in out.reason and "march" in out.reason and "precision 1.00" in out.reason
    assert judge(evidence_from_metrics({**LAMP, "defenses": ["gaussian:0.1"]})).verdict == LEAKED


@pytest.mark.parametrize("precision, recall", [(0.0667, 0.0714),   # the best of 20 random token answers
                                               (0.3636, 0.2857),   # a fixed generic sentence
                                               (1.0, 0.2), (0.5, 0.9)])
def test_random_or_generic_words_are_not_leaked(precision, recall):
    m = {**LAMP, "token_set_precision": precision, "token_set_recall": recall}
    assert judge(evidence_from_metrics(m)).verdict != LEAKED


# ---------------------------------------------------------------------------------- a real run
def test_a_random_start_run_records_why_it_is_not_recognisable(tmp_path: Path, capsys):
    folder = tmp_path / "photos"
    for i, name in enumerate(PHOTOS):
        (folder / name).mkdir(parents=True)
        Image.fromarray((photo(name)[0].permute(1, 2, 0).numpy() * 255).astype(np.uint8)).save(folder / name / f"{i}.png")
    out = tmp_path / "run"
    assert main(["attack", "--attack", "idlg", "--data", str(folder), "--indices", "0", "--iterations", "0",
                 "--threads", "1", "--no-progress", "--no-paper-metrics", "--out", str(out)]) == 0
    m = json.loads((out / "metrics.json").read_text())
    row = m["per_image"][0]
    assert row["identified_among"] >= MIN_DECOY_POOL + len(PHOTOS)   # the folder's photos and the decoys
    assert row["recognisable"] is False and row["recognisable_reason"] == ""
    assert row["coarse_ssim"] < row["prior_coarse_ssim"] + 0.1 or row["coarse_ssim"] < 0.5
    assert m["verdict"] != LEAKED


# ------------------------------------------------------------------ the source's own mean is a prior
def test_the_source_mean_is_a_prior_and_a_lighter_middle_is_no_leak():
    """On Fashion-MNIST (items centred on black) the source's own mean image is a leak-free answer
    that scores far above the natural photos' mean; DLG's noise answer under Gaussian 0.1 (5.2 dB, a
    lighter middle, not identified among 379) beat only the latter and was called leaked."""
    from gradleak.data import open_source, sample_batch
    from gradleak.outcome import recognisable_row

    source = open_source("fashion-mnist")
    batch = sample_batch(source, 1, 0, image_size=28, channels=1)
    others = sample_batch(source, 64, 1, image_size=28, channels=1, allow_repeats=True).images
    pool = candidate_pool(others, batch.images)
    zero = torch.zeros(1, 1, 28, 28)
    row = recognisability(zero, batch.images, zero, pool)[0]
    assert row["source_prior_coarse_ssim"] > row["public_prior_coarse_ssim"] + 0.1
    assert row["prior_coarse_ssim"] == max(row["source_prior_coarse_ssim"], row["public_prior_coarse_ssim"])
    # the measured rows: not identified, 0.12 above the source's mean -> no leak; identified -> a leak;
    # far above both without an identification (a class-mate nearer in pixels) -> a leak
    lighter = {"ssim": 0.18, "coarse_ssim": 0.656, "zero_coarse_ssim": 0.0, "prior_coarse_ssim": 0.537,
               "identified": False, "identified_among": 379}
    assert recognisable_row(lighter) == ""
    assert recognisable_row({**lighter, "identified": True}) != ""
    assert recognisable_row({**lighter, "coarse_ssim": 0.9}) != ""
