"""gradleak.defenses: exact effects of noise, pruning, quantisation and DP-SGD on updates."""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from gradleak.data.batch import Batch
from gradleak.defenses import (DPSGD, FP16, GaussianNoise, Int8, LaplaceNoise, Prune, apply_defenses,
                               client_update, dp_epsilon, dpsgd_gradient, parse_defense, parse_defenses)
from gradleak.defenses.pruning import prune_count
from gradleak.errors import ConfigError, UnknownNameError
from gradleak.fl import SharedUpdate, UpdateMeta, fedsgd, read_update_meta, save_update
from gradleak.models import build_model


def make_update(shapes: dict[str, tuple[int, ...]], seed: int = 0, bn: bool = False) -> SharedUpdate:
    """A synthetic update with N(0, 1) gradients (no exact zeros, no ties in practice)."""
    g = torch.Generator().manual_seed(seed)
    grads = {k: torch.randn(s, generator=g) for k, s in shapes.items()}
    weights = {k: torch.randn(s, generator=g) for k, s in shapes.items()}
    meta = UpdateMeta(model="lenet-dlg", num_classes=10, input_shape=(3, 32, 32), mean=(0.0,) * 3,
                      std=(1.0,) * 3, batch_size=4, loss=1.0)
    stats = {"bn1": (torch.randn(8, generator=g), torch.rand(8, generator=g))} if bn else {}
    return SharedUpdate(gradients=grads, global_weights=weights, meta=meta, bn_statistics=stats)


SHAPES = {"conv.weight": (12, 3, 5, 5), "conv.bias": (12,), "fc.weight": (10, 768), "fc.bias": (10,)}


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_batch(k: int, seed: int = 0) -> Batch:
    g = gen(seed)
    return Batch(images=torch.rand(k, 3, 32, 32, generator=g), labels=torch.randint(0, 10, (k,), generator=g))


@pytest.fixture(scope="module")
def lenet():  # noqa: ANN201
    return build_model("lenet-dlg", num_classes=10)


# --------------------------------------------------------------------------- specs


@pytest.mark.parametrize("spec, cls, params, canonical", [
    ("gaussian:1e-4", GaussianNoise, {"sigma": 1e-4}, "gaussian:0.0001"),
    ("gaussian:sigma=0.01", GaussianNoise, {"sigma": 0.01}, "gaussian:0.01"),
    ("laplace:0.1", LaplaceNoise, {"b": 0.1}, "laplace:0.1"),
    ("prune:0.9", Prune, {"fraction": 0.9, "scope": "layer"}, "prune:0.9"),
    (" Prune: 0.5 , scope = global ", Prune, {"fraction": 0.5, "scope": "global"}, "prune:0.5,scope=global"),
    ("fp16", FP16, {}, "fp16"),
    ("int8", Int8, {}, "int8"),
    ("dpsgd:noise=0.5,clip=1", DPSGD, {"clip": 1.0, "noise": 0.5, "delta": 1e-5, "sample_rate": 1.0, "steps": 1},
     "dpsgd:clip=1,noise=0.5"),
    ("dpsgd:clip=2,noise=1,delta=1e-6,steps=10,sample_rate=0.01", DPSGD,
     {"clip": 2.0, "noise": 1.0, "delta": 1e-6, "sample_rate": 0.01, "steps": 10},
     "dpsgd:clip=2,noise=1,delta=1e-06,sample_rate=0.01,steps=10"),
])
def test_parse_and_canonical_spec(spec: str, cls: type, params: dict, canonical: str) -> None:
    d = parse_defense(spec)
    assert isinstance(d, cls)
    assert d.params == params
    assert d.spec == canonical
    assert parse_defense(d.spec) == d  # the canonical spec round-trips
    assert d.describe()["spec"] == canonical and d.describe()["name"] == d.name


@pytest.mark.parametrize("spec, words", [
    ("gaussian", ["gaussian", "sigma"]),
    ("gaussian:", ["gaussian", "missing"]),
    ("gaussian:-0.1", ["gaussian", "sigma"]),
    ("gaussian:nan", ["gaussian", "sigma"]),
    ("gaussian:inf", ["gaussian", "sigma"]),
    ("gaussian:abc", ["gaussian", "sigma"]),
    ("gaussian:0.1,scale=2", ["gaussian", "scale"]),
    ("gaussian:0.1,sigma=0.2", ["gaussian", "sigma", "twice"]),
    ("laplace:-1", ["laplace", "b"]),
    ("prune:1", ["prune", "fraction"]),
    ("prune:-0.1", ["prune", "fraction"]),
    ("prune:0.5,scope=row", ["prune", "scope"]),
    ("prune:0.5,", ["prune", "empty"]),
    ("fp16:1", ["fp16", "no parameters"]),
    ("int8:bits=4", ["int8", "no parameters"]),
    ("dpsgd:clip=1", ["dpsgd", "noise"]),
    ("dpsgd:1", ["dpsgd", "key=value"]),
    ("dpsgd:clip=0,noise=1", ["dpsgd", "clip"]),
    ("dpsgd:clip=1,noise=-1", ["dpsgd", "noise"]),
    ("dpsgd:clip=1,noise=1,delta=1", ["dpsgd", "delta"]),
    ("dpsgd:clip=1,noise=1,steps=2.5", ["dpsgd", "steps"]),
    ("dpsgd:clip=1,noise=1,sample_rate=0", ["dpsgd", "sample_rate"]),
    ("", ["defense"]),
])
def test_bad_specs_raise_config_error_naming_defense_and_field(spec: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_defense(spec)
    for w in words:
        assert w in str(exc.value)


def test_unknown_defense_name() -> None:
    with pytest.raises(UnknownNameError, match="known: .*gaussian"):
        parse_defense("dropout:0.5")


def test_direct_construction_is_validated() -> None:
    with pytest.raises(ConfigError, match="sigma"):
        GaussianNoise(sigma=float("nan"))
    with pytest.raises(ConfigError, match="fraction"):
        Prune(fraction=1.0)


def test_client_side_defense_must_come_first() -> None:
    assert [d.spec for d in parse_defenses(["dpsgd:clip=1,noise=1", "int8"])] == ["dpsgd:clip=1,noise=1", "int8"]
    with pytest.raises(ConfigError, match="first"):
        parse_defenses(["int8", "dpsgd:clip=1,noise=1"])


# --------------------------------------------------------------------------- noise


def test_gaussian_noise_has_asked_std_and_zero_mean() -> None:
    sigma = 0.01
    up = make_update({"w": (1000, 1000)})
    out = GaussianNoise(sigma).apply(up, gen())
    noise = (out.gradients["w"] - up.gradients["w"]).double()
    assert noise.std().item() == pytest.approx(sigma, rel=0.01)
    assert abs(noise.mean().item()) < 5 * sigma / 1000  # 5 standard errors
    # Gaussian, not Laplace: E|x| = sigma sqrt(2/pi)
    assert noise.abs().mean().item() == pytest.approx(sigma * math.sqrt(2 / math.pi), rel=0.01)


def test_laplace_noise_std_is_sqrt2_b() -> None:
    b = 0.1
    up = make_update({"w": (1000, 1000)})
    out = LaplaceNoise(b).apply(up, gen())
    noise = (out.gradients["w"] - up.gradients["w"]).double()
    assert noise.std().item() == pytest.approx(math.sqrt(2) * b, rel=0.01)
    assert abs(noise.mean().item()) < 5 * math.sqrt(2) * b / 1000
    assert noise.abs().mean().item() == pytest.approx(b, rel=0.01)  # Laplace: E|x| = b
    assert bool(torch.isfinite(noise).all())


def test_noise_is_reproducible_from_the_generator() -> None:
    up = make_update(SHAPES)
    for spec in ("gaussian:0.1", "laplace:0.1"):
        d = parse_defense(spec)
        a, b, c = d.apply(up, gen(7)), d.apply(up, gen(7)), d.apply(up, gen(8))
        for k in SHAPES:
            assert torch.equal(a.gradients[k], b.gradients[k])
            assert not torch.equal(a.gradients[k], c.gradients[k])


def test_zero_noise_is_identity_but_recorded() -> None:
    up = make_update(SHAPES)
    out = GaussianNoise(0.0).apply(up, gen())
    assert all(torch.equal(out.gradients[k], up.gradients[k]) for k in SHAPES)
    assert out.meta.defenses == ["gaussian:0"]


# --------------------------------------------------------------------------- pruning


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.5, 0.9, 0.999])
def test_prune_per_layer_zeroes_exactly_the_fraction(fraction: float) -> None:
    up = make_update(SHAPES)
    out = Prune(fraction).apply(up, gen())
    for k, g in up.gradients.items():
        o = out.gradients[k]
        pruned = o == 0
        assert int(pruned.sum()) == prune_count(fraction, g.numel()) == math.floor(fraction * g.numel() + 0.5)
        assert torch.equal(o[~pruned], g[~pruned])  # survivors untouched
        if pruned.any() and (~pruned).any():  # the smallest magnitudes went
            assert g[pruned].abs().max() <= g[~pruned].abs().min()


def test_prune_global_zeroes_exactly_the_fraction_across_layers() -> None:
    up = make_update(SHAPES)
    up.gradients["fc.weight"].mul_(10)  # a large-gradient layer keeps more of its entries
    fraction = 0.7
    out = Prune(fraction, scope="global").apply(up, gen())
    n = sum(g.numel() for g in up.gradients.values())
    pruned_all = torch.cat([(out.gradients[k] == 0).flatten() for k in SHAPES])
    orig_all = torch.cat([up.gradients[k].flatten() for k in SHAPES])
    assert int(pruned_all.sum()) == math.floor(fraction * n + 0.5)
    assert orig_all[pruned_all].abs().max() <= orig_all[~pruned_all].abs().min()
    frac_fc = float((out.gradients["fc.weight"] == 0).float().mean())
    frac_conv = float((out.gradients["conv.weight"] == 0).float().mean())
    assert frac_fc < fraction < frac_conv  # not per layer
    assert out.meta.defenses == ["prune:0.7,scope=global"]


def test_prune_ties_still_give_the_exact_count() -> None:
    up = make_update({"a": (7,), "b": (3, 10)})
    up = up.replace(gradients={"a": torch.ones(7), "b": torch.full((3, 10), -2.0)})
    out = Prune(0.5).apply(up, gen())
    assert int((out.gradients["a"] == 0).sum()) == 4  # 3.5 rounds half up
    assert int((out.gradients["b"] == 0).sum()) == 15
    out = Prune(0.5, scope="global").apply(up, gen())
    assert int(sum((g == 0).sum() for g in out.gradients.values())) == 19  # 18.5 -> 19
    assert int((out.gradients["a"] == 0).sum()) == 7  # |1| < |-2|: all of a goes first


# --------------------------------------------------------------------------- quantisation


def test_fp16_equals_a_float16_round_trip() -> None:
    up = make_update(SHAPES)
    up.gradients["fc.bias"][:3] = torch.tensor([1 / 3, 1e-9, 70000.0])
    out = FP16().apply(up, gen())
    for k, g in up.gradients.items():
        o = out.gradients[k]
        assert o.dtype == g.dtype and o.shape == g.shape
        assert torch.equal(o, g.half().float())
    assert out.gradients["fc.bias"][0] != up.gradients["fc.bias"][0]  # precision really lost
    assert out.gradients["fc.bias"][1] == 0 and out.gradients["fc.bias"][2] == math.inf  # as on the wire


def test_int8_error_within_half_a_step_and_values_on_the_grid() -> None:
    up = make_update(SHAPES)
    out = Int8().apply(up, gen())
    for k, g in up.gradients.items():
        o = out.gradients[k]
        scale = g.abs().max() / 127
        q = o / scale
        assert torch.allclose(q, q.round(), atol=1e-4)  # on the grid scale * Z
        assert int(q.round().abs().max()) == 127  # the extreme entry maps to +-127
        assert (o - g).abs().max() <= scale / 2 * (1 + 1e-5)
        assert len(torch.unique(q.round())) <= 255
    zero = make_update({"z": (5,)}).replace(gradients={"z": torch.zeros(5)})
    assert torch.equal(Int8().apply(zero, gen()).gradients["z"], torch.zeros(5))


# --------------------------------------------------------------------------- composition, purity


def test_composition_order_is_respected_and_recorded() -> None:
    up = make_update(SHAPES)
    up = up.replace(meta=dataclasses.replace(up.meta, defenses=["earlier"]))
    prior = list(up.meta.defenses)
    prune_then_noise = apply_defenses(up, parse_defenses(["prune:0.5", "gaussian:0.01"]), gen())
    noise_then_prune = apply_defenses(up, ["gaussian:0.01", "prune:0.5"], gen())
    assert prune_then_noise.meta.defenses == prior + ["prune:0.5", "gaussian:0.01"]
    assert noise_then_prune.meta.defenses == prior + ["gaussian:0.01", "prune:0.5"]
    w = "fc.weight"
    n = up.gradients[w].numel()
    assert int((noise_then_prune.gradients[w] == 0).sum()) == n // 2  # pruning last leaves exact zeros
    assert int((prune_then_noise.gradients[w] == 0).sum()) == 0  # noise last fills them
    # prune then noise = noise added to the pruned gradient
    pruned = Prune(0.5).apply(up, gen())
    manual = GaussianNoise(0.01).apply(pruned, gen())
    assert torch.equal(manual.gradients[w], prune_then_noise.gradients[w])


def test_input_update_is_not_mutated_and_bn_statistics_untouched() -> None:
    up = make_update(SHAPES, bn=True)
    before = {k: g.clone() for k, g in up.gradients.items()}
    weights = {k: w.clone() for k, w in up.global_weights.items()}
    bn = {k: (m.clone(), v.clone()) for k, (m, v) in up.bn_statistics.items()}
    specs = ["prune:0.5", "prune:0.3,scope=global", "gaussian:0.1", "laplace:0.1", "fp16", "int8"]
    out = apply_defenses(up, parse_defenses(specs), gen())
    assert up.meta.defenses == [] and out.meta.defenses == specs
    for k in SHAPES:
        assert torch.equal(up.gradients[k], before[k])
        assert torch.equal(up.global_weights[k], weights[k])
        assert out.gradients[k].data_ptr() != up.gradients[k].data_ptr()
        assert out.gradients[k].shape == before[k].shape and out.gradients[k].dtype == before[k].dtype
        assert torch.equal(out.global_weights[k], weights[k])
    for k, (m, v) in bn.items():  # defenses transform gradients only
        assert torch.equal(out.bn_statistics[k][0], m) and torch.equal(out.bn_statistics[k][1], v)
    # each defense alone is pure too (the Prune in-place work happens on copies)
    for spec in specs:
        parse_defense(spec).apply(up, gen())
        assert all(torch.equal(up.gradients[k], before[k]) for k in SHAPES)


def test_same_seed_same_output_for_a_whole_pipeline() -> None:
    up = make_update(SHAPES)
    specs = parse_defenses(["gaussian:0.01", "prune:0.9", "laplace:0.001", "int8"])
    a, b = apply_defenses(up, specs, gen(3)), apply_defenses(up, specs, gen(3))
    assert all(torch.equal(a.gradients[k], b.gradients[k]) for k in SHAPES)


def test_defended_update_saves_with_its_record(tmp_path, lenet) -> None:  # noqa: ANN001
    up = fedsgd(lenet, random_batch(2))
    out = apply_defenses(up, ["prune:0.9", "fp16"], gen())
    save_update(out, tmp_path / "u.safetensors")
    assert read_update_meta(tmp_path / "u.safetensors").defenses == ["prune:0.9", "fp16"]


# --------------------------------------------------------------------------- DP-SGD


def test_dpsgd_without_noise_and_clipping_is_the_mean_gradient(lenet) -> None:
    batch = random_batch(6)
    plain = fedsgd(lenet, batch).gradients
    dp = dpsgd_gradient(lenet, batch, clip=1e6, noise_multiplier=0.0, generator=gen(), chunk_size=4)
    assert list(dp) == list(plain)
    for k in plain:
        assert dp[k].shape == plain[k].shape
        assert torch.allclose(dp[k], plain[k], rtol=1e-4, atol=1e-6), k


def _per_sample_manual(model, batch: Batch) -> list[dict[str, torch.Tensor]]:  # noqa: ANN001
    """Per-sample gradients by K separate FedSGD calls on one-image batches (no vmap)."""
    return [fedsgd(model, Batch(images=batch.images[i:i + 1], labels=batch.labels[i:i + 1])).gradients
            for i in range(batch.size)]


def test_dpsgd_clips_each_sample_like_a_manual_computation(lenet) -> None:
    batch = random_batch(5, seed=1)
    per = _per_sample_manual(lenet, batch)
    norms = [math.sqrt(sum(float(g.double().pow(2).sum()) for g in p.values())) for p in per]
    clip = 0.5 * min(norms)  # every sample is clipped
    manual = {k: sum(min(1.0, clip / (n + 1e-6)) * p[k] for p, n in zip(per, norms)) / batch.size for k in per[0]}
    dp = dpsgd_gradient(lenet, batch, clip=clip, noise_multiplier=0.0, generator=gen())
    total = math.sqrt(sum(float(g.double().pow(2).sum()) for g in dp.values()))
    assert total <= clip * (1 + 1e-5)  # mean of vectors of norm <= C
    for k in manual:  # float32 rounding: atol relative to the tensor's scale (summation order differs by CPU)
        assert torch.allclose(dp[k], manual[k], rtol=1e-4, atol=1e-5 * float(manual[k].abs().max())), k
    # a clip between the norms: only the large ones are scaled
    clip = sorted(norms)[2]
    manual = {k: sum(min(1.0, clip / (n + 1e-6)) * p[k] for p, n in zip(per, norms)) / batch.size for k in per[0]}
    dp = dpsgd_gradient(lenet, batch, clip=clip, noise_multiplier=0.0, generator=gen(), chunk_size=2)
    for k in manual:
        assert torch.allclose(dp[k], manual[k], rtol=1e-4, atol=1e-5 * float(manual[k].abs().max())), k


def test_dpsgd_matches_opacus_dpoptimizer_noise_included(lenet) -> None:
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    batch = random_batch(4, seed=2)
    clip, z = 0.3, 0.8
    gsm = GradSampleModule(copy.deepcopy(lenet.module))
    named = list(gsm._module.named_parameters())
    opt = DPOptimizer(torch.optim.SGD([p for _, p in named], lr=0.1), noise_multiplier=z, max_grad_norm=clip,
                      expected_batch_size=batch.size, generator=gen(11))
    with warnings.catch_warnings():  # "full backward hook ... no inputs require gradients": expected
        warnings.simplefilter("ignore", UserWarning)
        F.cross_entropy(gsm(lenet.normalize(batch.images)), batch.labels).backward()
    opt.clip_and_accumulate()
    opt.add_noise()
    opt.scale_grad()
    ours = dpsgd_gradient(lenet, batch, clip=clip, noise_multiplier=z, generator=gen(11))
    for name, p in named:
        assert torch.allclose(ours[name], p.grad, rtol=1e-4, atol=1e-6), name
    clipped = dpsgd_gradient(lenet, batch, clip=clip, noise_multiplier=0.0, generator=gen(11))
    diff = torch.cat([(ours[k] - clipped[k]).flatten() for k in clipped])
    assert diff.std().item() == pytest.approx(z * clip / batch.size, rel=0.05)  # noise std Z C / K


def test_dpsgd_is_client_side(lenet) -> None:
    d = parse_defense("dpsgd:clip=1,noise=0.5")
    assert d.client_side
    up = fedsgd(lenet, random_batch(2))
    with pytest.raises(ConfigError, match="client"):
        d.apply(up, gen())
    with pytest.raises(ConfigError, match="client"):
        apply_defenses(up, [d], gen())
    batch = random_batch(3)
    out = client_update(lenet, batch, ["dpsgd:clip=1,noise=0.5", "prune:0.5"], gen(4))
    assert out.meta.defenses == ["dpsgd:clip=1,noise=0.5", "prune:0.5"]
    again = client_update(lenet, batch, parse_defenses(["dpsgd:clip=1,noise=0.5", "prune:0.5"]), gen(4))
    assert all(torch.equal(out.gradients[k], again.gradients[k]) for k in out.gradients)
    direct = d.client_update(lenet, batch, gen(4))
    assert direct.meta.defenses == ["dpsgd:clip=1,noise=0.5"]
    assert list(direct.gradients) == list(up.gradients)
    assert all(torch.equal(direct.global_weights[k], up.global_weights[k]) for k in up.global_weights)
    desc = d.describe()
    assert desc["delta"] == 1e-5 and desc["epsilon"] == pytest.approx(dp_epsilon(0.5, 1.0, 1, 1e-5))
    assert desc["params"] == {"clip": 1.0, "noise": 0.5, "delta": 1e-5, "sample_rate": 1.0, "steps": 1}
    assert parse_defense("dpsgd:clip=1,noise=0").describe()["epsilon"] is None  # no privacy


def test_dpsgd_refuses_batchnorm_models() -> None:
    convnet = build_model("convnet", num_classes=10, width=4)
    with pytest.raises(ConfigError, match="BatchNorm.*GroupNorm"):
        dpsgd_gradient(convnet, random_batch(2), clip=1.0, noise_multiplier=1.0, generator=gen())


def test_dp_epsilon_is_finite_and_falls_as_noise_grows() -> None:
    eps = [dp_epsilon(z, sample_rate=0.01, steps=1000, delta=1e-5) for z in (0.6, 1.0, 2.0, 4.0)]
    assert all(math.isfinite(e) and e > 0 for e in eps)
    assert eps == sorted(eps, reverse=True) and eps[0] > eps[-1]
    assert dp_epsilon(0.0, 0.01, 10, 1e-5) == math.inf
    # more steps cost more privacy
    assert dp_epsilon(1.0, 0.01, 2000, 1e-5) > dp_epsilon(1.0, 0.01, 1000, 1e-5)
    with pytest.raises(ConfigError, match="delta"):
        dp_epsilon(1.0, 0.01, 10, 0.0)
    with pytest.raises(ConfigError, match="sample_rate"):
        dp_epsilon(1.0, 1.5, 10, 1e-5)
