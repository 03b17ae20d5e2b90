"""The imprint attack of "Robbing the Fed" (Fowl et al., ICLR 2022): a malicious server's block
in front of ResNet-18 (CIFAR stem), real CIFAR-10 photos (cifar10-samples).

* The block: rows 1/d, biases at the Gaussian quantiles of the brightness prior, linear2's
  identical columns; the imprinted model computes nearly the victim's logits (inconspicuous).
* Batch 1: exact (>= 60 dB), judged exact by the attacker itself.
* Batch 4 (photos 0-3): photos 1 and 3 have the same brightness bin (0.706 and 0.701 in
  normalised units): the attacker reports 3 separated and 1 collided (and sees that the shared
  bin is a mix); the other two exact.
* The issue's target: 64 bins, 2 clients x 4 photos (photos 0-7) aggregated: at least half of
  the 8 photos at >= 40 dB (measured: 6 of 8 exact at 100 dB, the colliding pair lost).
* FedAvg with one local step works; more steps, a model without the block, a malformed block
  are refused with typed errors; a noise-defended update is never claimed exact.
"""

from __future__ import annotations

import copy
import math
from statistics import NormalDist

import pytest
import torch

from gradleak.attacks.imprint import check_imprint, imprint_attack
from gradleak.data import batch_of, open_source
from gradleak.defenses import apply_defenses
from gradleak.errors import ConfigError, ModelMismatchError, NonFiniteError
from gradleak.fl import fedsgd
from gradleak.fl.threats import ThreatModel, share
from gradleak.metrics import evaluate
from gradleak.models import build_model
from gradleak.models.imprint import (IMPRINT_GAIN, PUBLIC_BRIGHTNESS_MEAN, PUBLIC_BRIGHTNESS_STD, ImprintBlock,
                                     IMPRINT_SHIFT, ImprintedNet, default_brightness_prior, imprint_model, imprint_thresholds)

BINS = 64
BATCH8 = list(range(8))      # the fixed photos of the 2 x 4 aggregate
BATCH4 = [0, 1, 2, 3]        # photos 1 and 3 share a bin
FEDAVG4 = [0, 2, 3, 4]       # four photos in four different bins


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(scope="module")
def victim():
    torch.set_num_threads(1)
    return build_model("resnet18-cifar", num_classes=10, channels=3, image_size=32, seed=0)


@pytest.fixture(scope="module")
def imprinted(victim):
    mean, std = default_brightness_prior(victim)
    return imprint_model(victim, bins=BINS, mean=mean, std=std)


@pytest.fixture(scope="module")
def source():
    return open_source("cifar10-samples")


def _psnrs(rec, batch):  # noqa: ANN001, ANN202
    return [s.psnr for s in evaluate(rec, batch).per_image]


# --- the block -------------------------------------------------------------------------------

def test_thresholds_are_increasing_gaussian_quantiles():
    c = imprint_thresholds(BINS, -0.3, 0.7)
    assert c.shape == (BINS,) and c.dtype == torch.float64
    assert bool((c[1:] > c[:-1]).all())
    dist = NormalDist(-0.3, 0.7)
    expected = torch.tensor([dist.inv_cdf(i / (BINS + 1)) for i in range(1, BINS + 1)], dtype=torch.float64)
    assert torch.allclose(c, expected, atol=1e-12)
    assert abs(float(c[BINS // 2 - 1] + c[BINS // 2]) / 2 + 0.3) < 1e-9  # symmetric about the mean


def test_imprinted_model_structure(victim, imprinted):
    assert imprinted.name == victim.name and imprinted.input_shape == victim.input_shape
    assert imprinted.num_classes == victim.num_classes and imprinted.mean == victim.mean and imprinted.std == victim.std
    mean, std = default_brightness_prior(victim)
    assert imprinted.kwargs == {**victim.kwargs,
                                "server": f"imprint:bins={BINS},mean={mean!r},std={std!r},gain={IMPRINT_GAIN!r}"}
    module = imprinted.module
    assert isinstance(module, ImprintedNet) and isinstance(module.imprint, ImprintBlock)
    assert module.net is not victim.module  # a deep copy: the victim is left alone
    names = [n for n, _ in module.named_parameters()]
    assert names[:4] == ["imprint.linear0.weight", "imprint.linear0.bias", "imprint.linear2.weight",
                         "imprint.linear2.bias"]
    assert set(names[4:]) == {f"net.{n}" for n, _ in victim.module.named_parameters()}
    assert imprinted.classifier_name == "net.fc"
    block = module.imprint
    d = 3 * 32 * 32
    scale = IMPRINT_SHIFT / IMPRINT_GAIN  # the measurement's scale: a small forward shift, loud gradients
    assert torch.allclose(block.linear0.weight, torch.full((BINS, d), scale / d))
    assert torch.allclose(block.linear0.bias.double(), -scale * imprint_thresholds(BINS, mean, std), rtol=1e-6)
    assert torch.allclose(block.thresholds.double(), imprint_thresholds(BINS, mean, std), atol=1e-5)
    assert torch.equal(block.linear2.weight, torch.full((d, BINS), IMPRINT_GAIN))
    assert torch.equal(block.linear2.bias, torch.zeros(d))


def test_block_is_inconspicuous(victim, imprinted, source):
    """The victim sees its input plus a small per-image constant: nearly the same logits."""
    x = victim.normalize(batch_of(source, list(range(20)), 32, 3).images)
    # copies: a training-mode forward moves BatchNorm's running statistics
    plain, server = copy.deepcopy(victim.module), copy.deepcopy(imprinted.module)
    for train in (False, True):
        plain.train(train)
        server.train(train)
        with torch.no_grad():
            a, b = plain(x), server(x)
        assert float((a - b).abs().max()) <= 0.05 * float(a.abs().max())
    with torch.no_grad():
        shift = server.imprint(x) - x
        # the residual's shift is the same on every entry of an image
        assert float((shift - shift.flatten(1)[:, :1, None, None]).abs().max()) < 1e-6
        h = server.imprint.measure(x)
    assert torch.allclose(h, x.flatten(1).mean(1), atol=1e-5)  # w . x is the mean brightness


def test_default_brightness_prior_is_in_normalised_units(victim):
    mean, std = default_brightness_prior(victim)
    exp_mean = sum((PUBLIC_BRIGHTNESS_MEAN - m) / s for m, s in zip(victim.mean, victim.std)) / 3
    exp_std = sum(PUBLIC_BRIGHTNESS_STD / s for s in victim.std) / 3
    assert math.isclose(mean, exp_mean) and math.isclose(std, exp_std) and std > 0
    plain = build_model("lenet-dlg", num_classes=10, channels=3, image_size=32)  # mean 0 / std 1
    assert default_brightness_prior(plain) == pytest.approx((PUBLIC_BRIGHTNESS_MEAN, PUBLIC_BRIGHTNESS_STD))


@pytest.mark.parametrize("bins, mean, std", [(1, 0.0, 1.0), (4097, 0.0, 1.0), (2.5, 0.0, 1.0), (True, 0.0, 1.0),
                                             ("64", 0.0, 1.0), (64, 0.0, 0.0), (64, 0.0, -1.0),
                                             (64, float("nan"), 1.0), (64, 0.0, float("inf"))])
def test_invalid_imprint_settings_are_refused(victim, bins, mean, std):
    with pytest.raises(ConfigError) as err:
        imprint_model(victim, bins=bins, mean=mean, std=std)
    assert "\n" not in str(err.value) and str(err.value).startswith("imprint:")


def test_invalid_gain_is_refused(victim):
    for gain in (0.0, -1e-3, float("nan")):
        with pytest.raises(ConfigError):
            imprint_model(victim, bins=8, mean=0.0, std=1.0, gain=gain)


# --- the attack ------------------------------------------------------------------------------

@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_batch_of_one_is_exact(imprinted, source, index):
    batch = batch_of(source, [index], 32, 3)
    rec = imprint_attack(fedsgd(imprinted, batch), imprinted)
    assert rec.images.shape == (1, 3, 32, 32) and rec.images.dtype == torch.float32
    assert _psnrs(rec, batch)[0] >= 60
    assert rec.extra["exact"] is True and rec.extra["analytic"] is True
    assert rec.extra["separated"] == 1 and rec.extra["nonempty_bins"] == 1 and rec.extra["collided_or_lost"] == 0
    assert rec.extra["bins"] == BINS and rec.extra["plateau"] is False and rec.extra["restarts_used"] == 0
    assert rec.iterations == 0 and rec.wall_seconds > 0 and rec.label_method == "counts"
    assert rec.labels.tolist() == batch.labels.tolist()


def test_batch_of_four_reports_the_collision(imprinted, source):
    batch = batch_of(source, BATCH4, 32, 3)
    rec = imprint_attack(fedsgd(imprinted, batch), imprinted)
    psnr = _psnrs(rec, batch)
    assert sum(p >= 60 for p in psnr) == 2  # photos 0 and 2 alone in their bins
    assert rec.extra["exact"] is False and rec.extra["separated"] == 3 and rec.extra["nonempty_bins"] == 3
    assert rec.extra["collided_or_lost"] == 1 and rec.extra["filled"] == 1
    # photos 1 and 3 have gradients g_k of opposite signs: their bin's ratio is no photo, so the
    # attacker knows the bin is mixed and answers both slots with a flat image at its brightness
    assert rec.extra["mixed_bins"] == 1 and rec.extra["fill"] == "mixed-bin brightness"
    assert sorted(rec.labels.tolist()) == sorted(batch.labels.tolist())  # "counts": repeats (two 8s)


def test_aggregate_of_two_clients_issue_target(imprinted, source):
    """The issue's target: 64 bins, ResNet-18, 2 clients x 4 photos aggregated: >= half at 40 dB."""
    batch = batch_of(source, BATCH8, 32, 3)
    update = share(imprinted, batch, ThreatModel(name="aggregate", clients=2), private_seed=0)
    rec = imprint_attack(update, imprinted)
    psnr = _psnrs(rec, batch)
    assert sum(p >= 40 for p in psnr) >= 4
    assert sum(p >= 60 for p in psnr) == 6  # measured: the 6 photos alone in a bin come out exactly
    assert rec.extra["separated"] == 7 and rec.extra["collided_or_lost"] == 1 and rec.extra["exact"] is False
    assert evaluate(rec, batch).label_accuracy >= 0.75


def test_aggregate_with_every_photo_alone_is_exact(imprinted, source):
    batch = batch_of(source, list(range(8, 16)), 32, 3)
    update = share(imprinted, batch, ThreatModel(name="aggregate", clients=2), private_seed=0)
    rec = imprint_attack(update, imprinted)
    assert rec.extra["exact"] is True and rec.extra["separated"] == 8
    assert min(_psnrs(rec, batch)) >= 60


def test_victim_spec_reads_the_servers_thresholds(victim, imprinted, source):
    """The attacker may pass the victim's own spec: the thresholds come from the update."""
    batch = batch_of(source, [5], 32, 3)
    update = fedsgd(imprinted, batch)
    rec = imprint_attack(update, victim)
    assert rec.extra["exact"] is True and _psnrs(rec, batch)[0] >= 60
    assert rec.labels.tolist() == batch.labels.tolist()


def test_fedavg_one_local_step(imprinted, source):
    """W_1 - W_0 = -lr g: the ratio is unchanged; only float32 rounding of the difference remains."""
    batch = batch_of(source, FEDAVG4, 32, 3)
    update = share(imprinted, batch, ThreatModel(name="fedavg", local_steps=1, local_lr=0.01), private_seed=0)
    rec = imprint_attack(update, imprinted)
    assert rec.extra["nonempty_bins"] == 4 and rec.extra["exact"] is True  # rounding noise is not a sample
    assert min(_psnrs(rec, batch)) >= 60  # measured 100 dB (the cap) for all 4


def test_refusals_are_typed(victim, imprinted, source):
    batch = batch_of(source, [0, 1], 32, 3)
    several = share(imprinted, batch, ThreatModel(name="fedavg", local_steps=2, local_lr=0.01), private_seed=0)
    with pytest.raises(ConfigError, match="local steps"):
        imprint_attack(several, imprinted)
    plain = fedsgd(victim, batch)
    with pytest.raises(ModelMismatchError) as err:
        imprint_attack(plain, victim)
    assert str(err.value) == ("imprint: the update was not computed on a model with the server's imprint block "
                              "(share with --server imprint)")
    update = fedsgd(imprinted, batch)
    check_imprint(update, imprinted)  # a sound update passes
    w2 = update.global_weights["imprint.linear2.weight"].clone()
    w2[:, 0] *= 2  # bin 0 no longer shares g_k
    with pytest.raises(ModelMismatchError, match="columns"):
        check_imprint(update.replace(global_weights={**update.global_weights, "imprint.linear2.weight": w2}), imprinted)
    g = update.gradients["imprint.linear0.weight"].clone()
    g[0, 0] = float("nan")
    with pytest.raises(NonFiniteError):
        imprint_attack(update.replace(gradients={**update.gradients, "imprint.linear0.weight": g}), imprinted)
    small = build_model("resnet18-cifar", num_classes=10, channels=3, image_size=16, seed=0)
    with pytest.raises(ModelMismatchError, match="linear0 weight"):
        check_imprint(update, small)


def test_noise_defense_is_never_claimed_exact(imprinted, source):
    batch = batch_of(source, [0], 32, 3)
    update = fedsgd(imprinted, batch)
    defended = apply_defenses(update, ["gaussian:1e-6"], torch.Generator().manual_seed(0))
    assert defended.meta.defenses
    rec = imprint_attack(defended, imprinted)
    assert rec.extra["exact"] is False and rec.images.shape == (1, 3, 32, 32)
    assert 0 <= float(rec.images.min()) and float(rec.images.max()) <= 1
