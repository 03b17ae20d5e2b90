"""The attacker's simulation of the threat model: dummy inputs -> the update they would produce."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torch.func import grad, vmap

from ..errors import ConfigError
from ..fl.threats import ThreatModel
from ..fl.unroll import local_train, mean_over_steps
from ..fl.update import SharedUpdate
from ..models import ModelSpec
from .victim import BNStats, DummyGradient


# The largest autograd graph the attacker's unroll may hold (estimated before the run): above it
# the attack is refused with the estimate rather than swapping or being killed part-way.
MAX_UNROLL_BYTES = 32 * 2**30
# Draws of the client's crop-flip augmentation each simulated step averages over (expected_augment);
# "flip" takes its two states, which is its exact expectation per sample.
AUGMENT_DRAWS = 4


class UpdateSimulator:
    """Callable (x [K, C, H, W] normalised, labels [K] or soft [K, N]) -> list of tensors in the
    order of ``names``, comparable with ``target`` (the shared update).

    FedAvg: the announced client (fl.threats.ThreatModel: optimizer with momentum, weight decay
    or Adam's moments, epochs, mini-batches) is unrolled exactly and differentiably (fl.unroll,
    fl.optim). One set of K dummies is shared by every epoch (Dimitrov et al., "Data Leakage in
    Federated Averaging", TMLR 2022), simulated in the attacker's own fixed order 0..K-1;
    the client's private order across epochs and its augmentation draws are not known, and
    ``client_model`` says so (the answer is then a lower bound).

    ``epoch_dummies``: Dimitrov et al.'s reconstruction for several epochs of several
    mini-batches, where the order is private: one set of K dummies per epoch (x then holds
    ``dummy_batch`` = E * K dummies per client, epoch e's set at rows e*K..e*K+K-1, each epoch
    simulated in the fixed order), so that any private order is representable; the sets are tied
    by :meth:`epoch_prior` and merged by :meth:`merge_epochs`. Labels stay [K] per client, each
    epoch's set carrying the same label counts."""

    def __init__(self, model: ModelSpec, update: SharedUpdate, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", epoch_dummies: bool = False,
                 expected_augment: bool = False):
        self.gradient = DummyGradient(model, update, dtype=dtype, device=device)
        self.threat = ThreatModel.from_record(update.meta.threat)
        self.names, self.target = self.gradient.names, self.gradient.target
        self.bn_names = self.gradient.bn_names
        self.batch_size = update.meta.batch_size
        self.clients = self.threat.clients if self.threat.name == "aggregate" else 1
        self.client_batch = self.batch_size // self.clients
        self.input_shape = tuple(model.input_shape)
        self.client_model = self.threat.client_model(self.client_batch)
        self.epochs = 1  # dummy sets per client: Dimitrov et al.'s E with epoch_dummies, else 1
        if epoch_dummies and not epoch_dummies_apply(update):
            raise ConfigError("one dummy set per epoch (Dimitrov et al.) applies to a FedAvg client of several "
                              "epochs of several mini-batches, whose order across epochs is private")
        if self.threat.client_threat == "fedavg":
            self.steps = self.threat.local_schedule(self.client_batch, None)  # the fixed order 0..K-1
            if epoch_dummies:
                per_epoch = math.ceil(self.client_batch / (self.threat.local_batch_size or self.client_batch))
                self.epochs = math.ceil(len(self.steps) / per_epoch)
                # step s of epoch e = s // per_epoch reads epoch e's own set of K dummies
                self.steps = [idx + (s // per_epoch) * self.client_batch for s, idx in enumerate(self.steps)]
            # the client's draws are private (client_model says so); expected_augment models their mean
            self.transform = self._expected_augment() if expected_augment and self.threat.local_augment != "none" \
                else None
            self.optimizer = self.threat.optimizer
            self._activations: int | None = None
            self.check_memory(1)

    def _expected_augment(self) -> Any:
        """The transform of a step's mini-batch [B, ...] -> [D * B, ...]: D augmented copies, so that
        the step's mean loss (and gradient) is the mean over D draws of the client's augmentation:
        "flip" its two states (the exact expectation of each sample's flip with probability 1/2,
        without BatchNorm), "crop-flip" AUGMENT_DRAWS fixed draws per step of a crop offset and a
        flip, the attacker's own (the client's are private). Zero padding is in pixel space, as the
        client's (fl.augment): the normalised value of a black pixel."""
        policy, pad = self.threat.local_augment, self.threat.local_crop_padding
        first = next(iter(self.gradient.params.values()))
        zero = self.gradient.model.normalize(torch.zeros(1, *self.input_shape, dtype=first.dtype))
        zero = zero[0, :, :1, :1].to(first.device)                                 # [C, 1, 1]
        g = torch.Generator().manual_seed(0)
        if policy == "flip" or pad == 0:
            draws = [[(pad, pad, False), (pad, pad, True)]] * len(self.steps)
        else:
            draws = [[(int(a), int(b), bool(f)) for a, b, f in zip(torch.randint(0, 2 * pad + 1, (AUGMENT_DRAWS,), generator=g),
                                                                  torch.randint(0, 2 * pad + 1, (AUGMENT_DRAWS,), generator=g),
                                                                  torch.rand(AUGMENT_DRAWS, generator=g) < 0.5, strict=True)]
                     for _ in self.steps]
        calls = [0]
        h, w = self.input_shape[-2:]

        def transform(mini: list[torch.Tensor]) -> list[torch.Tensor]:
            x, y = mini
            step = draws[calls[0] % len(draws)]
            calls[0] += 1
            padded = F.pad(x - zero, (pad, pad, pad, pad)) + zero if policy == "crop-flip" and pad else x
            out = []
            for i, j, flip in step:
                z = padded[..., i:i + h, j:j + w] if policy == "crop-flip" and pad else x
                out.append(z.flip(-1) if flip else z)
            return [torch.cat(out), y.repeat(len(step), *([1] * (y.ndim - 1)))]
        self.augment_draws = len(draws[0])
        return transform

    @property
    def dummy_batch(self) -> int:
        """Dummies per client: E * K with one set per epoch, else K."""
        return self.epochs * self.client_batch

    def _tiled(self, labels: torch.Tensor) -> torch.Tensor:
        """One client's labels [K] (or soft [K, N]) for its ``dummy_batch`` dummies: each epoch's set
        has the same labels (every epoch covers the client's K samples once)."""
        return labels if self.epochs == 1 else labels.repeat(self.epochs, *([1] * (labels.ndim - 1)))

    def from_epochs(self, x: torch.Tensor) -> torch.Tensor:
        """[..., E, N, C, H, W] (N = all clients' samples, client by client) -> [..., clients * E * K,
        C, H, W] in the simulation's layout (client by client, within a client epoch by epoch)."""
        lead, (e, n), rest = x.shape[:-5], x.shape[-5:-3], x.shape[-3:]
        y = x.reshape(*lead, e, self.clients, n // self.clients, *rest).transpose(-6, -5)
        return y.reshape(*lead, self.clients * e * (n // self.clients), *rest)

    def _by_epoch(self, x: torch.Tensor) -> torch.Tensor:
        """[..., clients * E * K, C, H, W] -> [..., clients, E, K, C, H, W]."""
        return x.reshape(*x.shape[:-4], self.clients, self.epochs, self.client_batch, *x.shape[-3:])

    def epoch_prior(self, x: torch.Tensor) -> torch.Tensor:
        """Dimitrov et al. 2022's epoch order-invariant prior on x [..., clients * E * K, C, H, W]
        -> [...]: the sets X^e of the E epochs hold the same K images in different orders, so a
        function of a set that ignores its order, g(X) = mean_k x_k, must agree across epochs:
        R_inv = 1/E^2 sum_{e, e'} mean_pixels (g(X^e) - g(X^e'))^2 (their code's "l2_mean"),
        averaged over the clients. 0 with one set."""
        if self.epochs == 1:
            return x.new_zeros(x.shape[:-4])
        g = self._by_epoch(x).mean(-4)                                  # [..., clients, E, C, H, W]
        diff = (g.unsqueeze(-4) - g.unsqueeze(-5)).square()              # [..., clients, E, E, C, H, W]
        return diff.flatten(-5).mean(-1)                                 # mean over e, e', pixels, clients

    def merge_epochs(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """x [..., clients * E * K, C, H, W] -> [..., clients * K, C, H, W]: per client, each
        epoch's set matched to epoch 0's (Hungarian on the squared pixel distance, only between
        dummies of the same label), then the matched images averaged over the epochs (Dimitrov et
        al.'s reconstruction of the client's data from its per-epoch sets). ``labels``: [N] or soft
        [N, C_classes] (their argmax is the label)."""
        if self.epochs == 1:
            return x
        hard = (labels.argmax(-1) if labels.ndim == 2 else labels).reshape(self.clients, self.client_batch).cpu()
        by = self._by_epoch(x)
        lead = by.shape[:-6]
        flat = by.reshape(-1, *by.shape[-6:])
        out = []
        for one in flat:                                                 # [clients, E, K, C, H, W]
            clients = []
            for c in range(self.clients):
                same = hard[c][:, None] != hard[c][None, :]              # [K, K]: True where labels differ
                ref, kept = one[c, 0], [one[c, 0]]
                for e in range(1, self.epochs):
                    cost = torch.cdist(ref.flatten(1).double(), one[c, e].flatten(1).double()).square().cpu()
                    cost = cost.masked_fill(same, float("inf")).nan_to_num(posinf=1e30)
                    rows, cols = linear_sum_assignment(cost.numpy())
                    kept.append(one[c, e][torch.as_tensor(cols[rows.argsort()], device=x.device)])
                clients.append(torch.stack(kept).mean(0))
            out.append(torch.cat(clients))
        return torch.stack(out).reshape(*lead, self.clients * self.client_batch, *x.shape[-3:])

    def unroll_bytes(self, candidates: int = 1) -> int:
        """Estimated bytes of the autograd graph one simulation keeps for ``candidates`` dummy
        batches: per local step, the forward activations of its mini-batch three times (the
        forward, and the backward kept for the outer derivative), and per parameter the
        gradient, the new weights and the optimizer's state (fl.optim.state_tensors) twice."""
        if self.threat.client_threat != "fedavg":
            return 0
        if self._activations is None:
            self._activations = _activations_per_sample(self.gradient, self.input_shape)
        g = self.gradient
        params = sum(p.numel() for p in g.params.values())
        per_param = 3 + 2 * self.optimizer.state_tensors()
        draws = self.augment_draws if self.transform is not None else 1
        elems = sum(3 * self._activations * len(idx) * draws + per_param * params for idx in self.steps)
        item = next(iter(g.params.values())).element_size()
        return int(elems * item * self.clients * candidates)

    def check_memory(self, candidates: int = 1) -> None:
        """ConfigError with the estimate when the unroll would hold more than MAX_UNROLL_BYTES."""
        need = self.unroll_bytes(candidates)
        if need > MAX_UNROLL_BYTES:
            raise ConfigError(f"the attacker's unroll of {len(self.steps)} local steps x {self.clients} client(s) x "
                              f"{candidates} candidate(s) would hold about {need / 2**30:.1f} GiB of autograd graph "
                              f"(limit {MAX_UNROLL_BYTES / 2**30:.0f} GiB): fewer local epochs or steps, larger "
                              "local mini-batches, or a smaller batch")

    @property
    def is_fedsgd(self) -> bool:
        return self.threat.client_threat == "fedsgd" and self.clients == 1

    def _client(self, x: torch.Tensor, labels: torch.Tensor, create_graph: bool) -> list[torch.Tensor]:
        if self.threat.client_threat == "fedsgd":
            return self.gradient(x, labels, create_graph=create_graph)
        g = self.gradient
        labels = self._tiled(labels)

        def loss(params: dict[str, torch.Tensor], x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            buffers = {n: b.clone() for n, b in g.buffers.items()}
            return DummyGradient.loss(g.forward(params, buffers, x), labels)
        # The client's local steps (fl.unroll), the graph kept through every step (even when the
        # caller needs values only, create_graph=False), as in Geiping et al. 2020, Sec. 5.
        run = local_train(g.params, loss, (x, labels), self.steps, self.optimizer, mode="graph",
                          transform=self.transform)
        return list(run.update(self.names).values())

    # ------------------------------------------------------------------ G candidates at once
    def _client_batched(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                        labels: torch.Tensor) -> tuple[dict[str, torch.Tensor], BNStats]:
        """One candidate's one client: (update by parameter name, BN statistics of its input).
        FedAvg unrolls the local steps with torch.func (fl.unroll, mode "func"; differentiable
        w.r.t. x by the caller's autograd); its BN statistics are the mean over the steps of each
        step's batch statistics, as the client shares them (fl.threats.fedavg)."""
        g = self.gradient
        if self.threat.client_threat == "fedsgd":
            return grad(g._loss_and_stats, has_aux=True)(params, x, labels)
        run = local_train(params, g._loss_and_stats, (x, self._tiled(labels)), self.steps, self.optimizer, mode="func",
                          has_aux=True, transform=self.transform)
        return run.update(), mean_over_steps(run.aux)

    def _candidate(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                   labels: torch.Tensor) -> tuple[dict[str, torch.Tensor], BNStats]:
        if self.clients == 1:
            return self._client_batched(params, x, labels)
        k, d = self.client_batch, self.dummy_batch
        parts = [self._client_batched(params, x[i * d:(i + 1) * d], labels[i * k:(i + 1) * k])
                 for i in range(self.clients)]
        update = {n: sum(u[n] for u, _ in parts) / self.clients for n in parts[0][0]}
        stats = [(sum(st[i][0] for _, st in parts) / self.clients, sum(st[i][1] for _, st in parts) / self.clients)
                 for i in range(len(parts[0][1]))]
        return update, stats

    def batched(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[list[torch.Tensor], BNStats]:
        """x [G, K, C, H, W] -> (one tensor [G, *param.shape] per name in ``names``: candidate g's
        simulated update under the threat model; per BN layer (mean [G, C], var [G, C]) as the
        client would share them). One vmap over the G candidates, as DummyGradient.batched
        does for FedSGD (which this equals under fedsgd with one client)."""
        if self.is_fedsgd:
            return self.gradient.batched(x, labels)
        self.check_memory(x.shape[0])  # before the first unroll of G candidates
        params = {n: p.detach() for n, p in self.gradient.params.items()}
        update, stats = vmap(self._candidate, in_dims=(None, 0, None))(params, x, labels)
        return [update[n] for n in self.names], stats

    def __call__(self, x: torch.Tensor, labels: torch.Tensor, *, create_graph: bool = True) -> list[torch.Tensor]:
        if self.clients == 1:
            return self._client(x, labels, create_graph)
        k, d = self.client_batch, self.dummy_batch
        parts = [self._client(x[i * d:(i + 1) * d], labels[i * k:(i + 1) * k], create_graph)
                 for i in range(self.clients)]
        return [sum(p[j] for p in parts) / self.clients for j in range(len(self.names))]


def epoch_dummies_apply(update: SharedUpdate) -> bool:
    """Whether Dimitrov et al.'s one dummy set per epoch applies to ``update``: a FedAvg client
    (or an aggregate of them) of several epochs of several mini-batches, its order private."""
    threat = ThreatModel.from_record(update.meta.threat)
    return "order unknown" in threat.client_model(update.meta.batch_size // threat.clients)


def _activations_per_sample(g: DummyGradient, input_shape: tuple[int, ...]) -> int:
    """Output elements of every module in a forward pass, per sample (no graph kept): the
    activations a step's graph holds per sample, for :meth:`UpdateSimulator.unroll_bytes`."""
    count = [0]

    def hook(_m: torch.nn.Module, _i: object, out: object) -> None:
        if isinstance(out, torch.Tensor):
            count[0] += out.numel()
    handles = [m.register_forward_hook(hook) for m in g.module.modules()]
    try:
        first = next(iter(g.params.values()))
        # two samples: BatchNorm in training mode needs more than one value per channel
        x = torch.zeros((2, *input_shape), dtype=first.dtype, device=first.device)
        with torch.no_grad():
            g.forward({n: p.detach() for n, p in g.params.items()}, {n: b.clone() for n, b in g.buffers.items()}, x)
    finally:
        for h in handles:
            h.remove()
    return max(1, count[0] // 2)


def label_evidence(update: SharedUpdate, classifier_name: str) -> torch.Tensor:
    """The classifier-weight tensor whose signs label restoration reads, [N, M], shaped like a
    gradient: the gradient itself for FedSGD, and -(W_S - W_0) for FedAvg (the local steps move
    the weights against the summed gradients, so the signs match a sum of gradients)."""
    key = f"{classifier_name}.weight" if classifier_name else "weight"
    t = update.gradients[key]
    threat = ThreatModel.from_record(update.meta.threat)
    return -t if threat.client_threat == "fedavg" else t
