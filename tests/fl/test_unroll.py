"""The one local-SGD unroll (gradleak.fl.unroll) shared by the FedAvg clients and the attackers'
simulations: it is the hand-written loop bit for bit, its differentiable modes give the right
derivatives, and the client's update equals the attacker's simulation on the true inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

from gradleak.errors import UpdateFileError
from gradleak.fl.threats import ThreatModel, fedavg
from gradleak.fl.unroll import local_sgd, mean_over_steps, step_assignment

LR = 0.3


def _tiny(dtype: torch.dtype = torch.float64) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3)).to(dtype)
    return module, {n: p.detach().clone() for n, p in module.named_parameters()}


def _loss(module: torch.nn.Module):  # noqa: ANN202
    def loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = functional_call(module, params, (x,))
        if y.is_floating_point():  # soft labels (DLG)
            return torch.mean(torch.sum(-F.softmax(y, dim=-1) * F.log_softmax(logits, dim=-1), dim=-1))
        return F.cross_entropy(logits, y)
    return loss


def _data(dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(4, 5, generator=gen, dtype=dtype), torch.tensor([0, 2, 1, 2])


STEPS = step_assignment(4, 2, 3, None)  # [0, 1], [2, 3], [0, 1]


def test_step_assignment_epochs_and_private_shuffling():
    assert [s.tolist() for s in step_assignment(5, 2, 4, None)] == [[0, 1], [2, 3], [4], [0, 1]]
    shuffled = step_assignment(4, 4, 3, torch.Generator().manual_seed(3))
    assert all(sorted(s.tolist()) == [0, 1, 2, 3] for s in shuffled)  # every epoch sees every sample
    t = ThreatModel("fedavg", local_steps=3, local_batch_size=2)
    assert [s.tolist() for s in t.local_schedule(4, None)] == [s.tolist() for s in STEPS]
    assert [s.tolist() for s in t.local_schedule(4, 7)] == \
        [s.tolist() for s in step_assignment(4, 2, 3, torch.Generator().manual_seed(7))]
    assert [len(s) for s in ThreatModel("fedavg", local_steps=2).local_schedule(3, 0)] == [3, 3]  # default B = K


@pytest.mark.parametrize("soft", [False, True])
def test_client_mode_is_the_hand_written_sgd_loop_bit_for_bit(soft):
    module, start = _tiny(torch.float32)
    x, y = _data(torch.float32)
    if soft:
        y = torch.randn(4, 3, generator=torch.Generator().manual_seed(2))
    loss = _loss(module)
    run = local_sgd(start, loss, (x, y), STEPS, LR, mode="client")
    params, losses = {n: p.clone() for n, p in start.items()}, []
    for idx in STEPS:  # the loop fl.threats.fedavg used to hold
        live = {n: p.requires_grad_(True) for n, p in params.items()}
        value = loss(live, x[idx], y[idx])
        grads = torch.autograd.grad(value, list(live.values()))
        params = {n: (p - LR * g).detach() for (n, p), g in zip(live.items(), grads)}
        losses.append(float(value.detach()))
    for n in start:
        assert torch.equal(run.params[n], params[n])
        assert torch.equal(run.update()[n], params[n] - start[n])
        assert not run.params[n].requires_grad
    assert run.mean_loss == sum(losses) / len(losses)
    assert all(not p.requires_grad for p in start.values())  # W_0 untouched
    assert list(run.update(["2.bias", "0.weight"])) == ["2.bias", "0.weight"]


def test_graph_mode_is_the_hand_written_differentiable_loop_bit_for_bit():
    module, start = _tiny()
    x, y = _data()
    x.requires_grad_(True)
    w0 = {n: p.clone().requires_grad_(True) for n, p in start.items()}
    run = local_sgd(w0, _loss(module), (x, y), STEPS, LR, mode="graph")
    params = dict(w0)
    for idx in STEPS:  # the loop attacks.simulate.UpdateSimulator used to hold
        value = _loss(module)(params, x[idx], y[idx])
        grads = torch.autograd.grad(value, list(params.values()), create_graph=True)
        params = {n: p - LR * d for (n, p), d in zip(params.items(), grads)}
    ref = {n: params[n] - w0[n] for n in params}
    got = run.update()
    for n in ref:
        assert torch.equal(got[n], ref[n])
    (ga,) = torch.autograd.grad(sum(u.square().sum() for u in got.values()), x)
    (gb,) = torch.autograd.grad(sum(u.square().sum() for u in ref.values()), x)
    assert torch.equal(ga, gb)
    # the same values as the client's (non-differentiable) steps
    client = local_sgd(start, _loss(module), (x.detach(), y), STEPS, LR, mode="client").update()
    for n in ref:
        assert torch.equal(client[n], got[n].detach())


@pytest.mark.parametrize("soft", [False, True])
def test_graph_mode_derivative_matches_finite_differences(soft):
    """d/dx of a function of Delta = W_S - W_0 through all three local steps (the attacker's
    double backward), against central differences in float64."""
    module, start = _tiny()
    x, y = _data()
    if soft:
        y = torch.randn(4, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64, requires_grad=True)
    weights = {n: torch.randn(p.shape, generator=torch.Generator().manual_seed(i), dtype=torch.float64)
               for i, (n, p) in enumerate(start.items())}
    w0 = {n: p.clone().requires_grad_(True) for n, p in start.items()}

    def f(x_: torch.Tensor, y_: torch.Tensor) -> torch.Tensor:
        upd = local_sgd(w0, _loss(module), (x_, y_), STEPS, LR, mode="graph").update()
        return sum((upd[n] * weights[n]).sum() for n in upd)

    xv = x.clone().requires_grad_(True)
    inputs = [xv] + ([y] if soft else [])
    grads = torch.autograd.grad(f(xv, y), inputs)
    eps = 1e-6
    for var, g in zip(inputs, grads):
        for i in range(0, var.numel(), 3):
            plus, minus = var.detach().clone(), var.detach().clone()
            plus.view(-1)[i] += eps
            minus.view(-1)[i] -= eps
            args = (plus, y) if var is xv else (xv.detach(), plus)
            args_m = (minus, y) if var is xv else (xv.detach(), minus)
            fd = (f(*args) - f(*args_m)).item() / (2 * eps)
            assert abs(fd - g.view(-1)[i].item()) <= 1e-6 * max(1.0, abs(fd))


def test_func_mode_under_vmap_equals_graph_mode_per_candidate():
    """The batched attacker (G candidate batches, torch.func under vmap) computes the same update
    and the same derivative as G separate differentiable unrolls."""
    module, start = _tiny()
    loss = _loss(module)

    def loss_with_aux(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor):  # noqa: ANN202
        return loss(params, x, y), [(x.mean(0), x.var(0, unbiased=False))]

    def candidate(x: torch.Tensor, y: torch.Tensor):  # noqa: ANN202
        run = local_sgd(start, loss_with_aux, (x, y), STEPS, LR, mode="func", has_aux=True)
        return run.update(), mean_over_steps(run.aux)

    gen = torch.Generator().manual_seed(5)
    xs = torch.randn(3, 4, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    y = _data()[1]
    upd, stats = vmap(candidate, in_dims=(0, None))(xs, y)
    w0 = {n: p.clone().requires_grad_(True) for n, p in start.items()}
    refs = [local_sgd(w0, loss, (xs[g], y), STEPS, LR, mode="graph").update() for g in range(3)]
    for g, ref in enumerate(refs):
        for n in ref:
            torch.testing.assert_close(upd[n][g], ref[n], rtol=1e-12, atol=1e-14)
        steps_mean = torch.stack([xs[g][idx].detach().mean(0) for idx in STEPS]).mean(0)
        torch.testing.assert_close(stats[0][0][g].detach(), steps_mean)
    (ga,) = torch.autograd.grad(sum(u.square().sum() for u in upd.values()), xs)
    (gb,) = torch.autograd.grad(sum(u.square().sum() for r in refs for u in r.values()), xs)
    torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-14)


def test_mean_over_steps_and_bad_mode():
    a, b = (torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])), (torch.tensor([3.0, 6.0]), torch.tensor([5.0, 0.0]))
    ((m, v),) = mean_over_steps([[a], [b]])
    assert m.tolist() == [2.0, 4.0] and v.tolist() == [4.0, 2.0]
    assert mean_over_steps([]) == [] and mean_over_steps([[], []]) == []
    with pytest.raises(ValueError, match="mode"):
        local_sgd({}, lambda p: p, (), [], 0.1, mode="sgd")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- client vs attacker
@pytest.mark.parametrize("local_batch_size", [1, 2])
def test_fedavg_client_update_equals_the_attacker_simulation_on_the_true_inputs(local_batch_size):
    """The client's FedAvg update (private shuffling, BatchNorm) equals the attacker's simulated
    update of the true images and labels put in the client's step order (one epoch: the client
    reshuffles each epoch, the attacker cannot know how)."""
    from gradleak.attacks.simulate import UpdateSimulator
    from gradleak.data import Batch
    from gradleak.models import build_model

    model = build_model("convnet", num_classes=10, width=8)
    gen = torch.Generator().manual_seed(0)
    batch = Batch(images=torch.rand(4, *model.input_shape, generator=gen), labels=torch.tensor([3, 1, 3, 7]))
    threat = ThreatModel("fedavg", local_steps=4 // local_batch_size, local_batch_size=local_batch_size, local_lr=0.05)
    update = fedavg(model, batch, threat, private_seed=11, share_bn_statistics=True)
    steps = threat.local_schedule(batch.size, 11)  # the client's private order, known to this test only
    order = torch.cat(steps)  # one epoch: a permutation
    assert sorted(order.tolist()) == [0, 1, 2, 3]
    sim = UpdateSimulator(model, update, dtype=torch.float64)
    x = model.normalize(batch.images[order]).double()
    with torch.enable_grad():
        got = sim(x, batch.labels[order])
    for a, want in zip(got, sim.target, strict=True):
        torch.testing.assert_close(a.detach(), want, rtol=1e-4, atol=1e-6)
    # the BN statistics the client shares are the batched simulator's
    upd, stats = sim.batched(x.unsqueeze(0), batch.labels[order])
    for a, want in zip(upd, sim.target, strict=True):
        torch.testing.assert_close(a[0].detach(), want, rtol=1e-4, atol=1e-6)
    for name, (m, v) in zip(sim.bn_names, stats, strict=True):
        torch.testing.assert_close(m[0].float(), update.bn_statistics[name][0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(v[0].float(), update.bn_statistics[name][1], rtol=1e-4, atol=1e-5)
    assert update.meta.loss > 0 and update.meta.bn_statistics_shared


def test_text_fedavg_client_update_equals_the_text_simulation_on_the_true_inputs():
    pytest.importorskip("tokenizers")
    from gradleak.text import build_text_model, text_batch
    from gradleak.text.simulate import TextSimulator
    from gradleak.text.client import text_fedavg

    model = build_text_model("tiny-transformer", seed=0)
    batch = text_batch(["the cat sat on the mat", "my password is hunter two"], model, 2, 0)
    threat = ThreatModel("fedavg", local_steps=3, local_batch_size=1, local_lr=0.1)
    update = text_fedavg(model, batch, threat, private_seed=4)
    order = torch.cat(threat.local_schedule(batch.size, 4)[:2])
    rows = sorted(set(batch.input_ids.flatten().tolist()))
    sim = TextSimulator(model, update, rows=rows, dtype=torch.float64, device=torch.device("cpu"))
    lookup = {t: i for i, t in enumerate(rows)}
    onehot = F.one_hot(torch.tensor([[lookup[t] for t in s] for s in batch.input_ids[order].tolist()]),
                       len(rows)).double()
    got = sim(onehot, batch.attention_mask[order], batch.labels[order])
    for a, want in zip(got, sim.target, strict=True):  # the word-embedding rows of the batch too
        torch.testing.assert_close(a.detach(), want, rtol=1e-4, atol=1e-6)


def test_one_truth_header_check_for_images_and_text(tmp_path):
    from gradleak.data import Batch
    from gradleak.fl.files import load_truth, save_truth

    save_truth(Batch(images=torch.rand(1, 3, 8, 8), labels=torch.tensor([1])), tmp_path / "t.safetensors")
    assert load_truth(tmp_path / "t.safetensors").labels.tolist() == [1]
    pytest.importorskip("tokenizers")
    import gradleak.text.client  # noqa: F401  registers the text modality's files

    with pytest.raises(UpdateFileError, match="is not a gradleak text truth file"):
        load_truth(tmp_path / "t.safetensors", modality="text")
