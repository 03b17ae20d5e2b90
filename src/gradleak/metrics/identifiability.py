"""Image Identifiability Precision (IIP) and per-sample gradient norms (GradInversion, Sec. 4.3)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from gradleak.data.batch import Batch
from gradleak.errors import ModelMismatchError
from gradleak.models import ModelSpec

__all__ = [
    "FeatureSpace",
    "IIPResult",
    "ModelFeatures",
    "PixelFeatures",
    "iip",
    "per_sample_gradient_norms",
]


@runtime_checkable
class FeatureSpace(Protocol):
    """Where nearest neighbours are searched.

    name:  a short description reported with every IIP result.
    embed: images [N, C, H, W] in [0, 1] -> features [N, D] (float, any device); neighbours
           are compared by cosine similarity of these rows.
    """

    name: str

    def embed(self, images: torch.Tensor) -> torch.Tensor: ...


class PixelFeatures:
    """Raw pixels: each image resized to ``size`` x ``size`` (bilinear, antialiased) and flattened.

    center: subtract each image's mean first, so that cosine similarity becomes the Pearson
            correlation of the pixels (insensitive to a global brightness offset). Off by
            default: plain cosine of the flattened pixels.
    """

    def __init__(self, size: int = 32, center: bool = False) -> None:
        if size < 1:
            raise ModelMismatchError(f"PixelFeatures size must be >= 1, got {size}")
        self.size = int(size)
        self.center = bool(center)
        self.name = f"pixels ({self.size}x{self.size}{', mean-centred' if center else ''}, cosine)"

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        x = _check_images(images).to(torch.float32)
        if tuple(x.shape[-2:]) != (self.size, self.size):
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False,
                              antialias=True)
        flat = x.flatten(1)
        if self.center:
            flat = flat - flat.mean(dim=1, keepdim=True)
        return flat


class ModelFeatures:
    """The input of a model's final nn.Linear (the avgpool features), model in eval mode.

    This is the paper's feature space for IIP ("avgpool feature space cosine similarity").
    Images are resized to the model's input size if needed (bilinear, antialiased),
    normalised with the model's mean/std and run in ``batch_size`` chunks under ``no_grad``;
    a forward hook on ``model_spec.classifier`` captures its input. The module's train/eval
    state is restored afterwards; no running statistic changes (eval mode).
    """

    def __init__(self, model_spec: ModelSpec, batch_size: int = 32) -> None:
        self.spec = model_spec
        self.batch_size = max(1, int(batch_size))
        self.name = (f"{model_spec.name} avgpool features (input of {model_spec.classifier_name}, "
                     "eval mode, cosine)")

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        x = _check_images(images)
        c, h, w = self.spec.input_shape
        if x.shape[1] != c:
            raise ModelMismatchError(f"{self.spec.name} takes {c}-channel images, got {x.shape[1]}")
        module = self.spec.module
        try:
            param = next(module.parameters())
            device, dtype = param.device, param.dtype
        except StopIteration:
            device, dtype = torch.device("cpu"), torch.float32
        captured: list[torch.Tensor] = []

        def hook(_mod: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            captured.append(inputs[0].detach().flatten(1))

        handle = self.spec.classifier.register_forward_pre_hook(hook)
        was_training = module.training
        module.eval()
        out: list[torch.Tensor] = []
        try:
            with torch.no_grad():
                for i in range(0, x.shape[0], self.batch_size):
                    chunk = x[i:i + self.batch_size].to(device, dtype)
                    if tuple(chunk.shape[-2:]) != (h, w):
                        chunk = F.interpolate(chunk, size=(h, w), mode="bilinear", align_corners=False,
                                              antialias=True)
                    captured.clear()
                    module(self.spec.normalize(chunk))
                    if not captured:
                        raise ModelMismatchError(f"{self.spec.name}: the classifier was not reached")
                    out.append(captured[-1])
        finally:
            handle.remove()
            module.train(was_training)
        if not out:
            return torch.zeros(0, 0)
        return torch.cat(out)


def _check_images(images: torch.Tensor) -> torch.Tensor:
    if images.ndim != 4:
        raise ModelMismatchError(f"expected images [N,C,H,W], got shape {tuple(images.shape)}")
    return torch.nan_to_num(images.detach(), nan=0.0, posinf=1.0, neginf=0.0)


@dataclass
class IIPResult:
    """Image Identifiability Precision of one set of reconstructions.

    precision:     fraction of reconstructions whose nearest neighbour is their own original.
    hits:          per reconstruction, whether it identified its original.
    feature_space: the declared feature space (``FeatureSpace.name``).
    pool_size:     number of candidates searched: the K originals plus the pool images that
                   are not exact duplicates of an original.
    nearest:       per reconstruction, the index of its nearest candidate (0..K-1 are the
                   originals, K.. the de-duplicated pool in its given order; -1 when undefined).

    Unpacks like the tuple ``(precision, hits)``.
    """

    precision: float
    hits: list[bool]
    feature_space: str
    pool_size: int
    nearest: list[int] = field(default_factory=list)

    def __iter__(self) -> Iterator[object]:
        return iter((self.precision, self.hits))


def _exact_duplicates(pool: torch.Tensor, originals: torch.Tensor, atol: float = 1e-6) -> torch.Tensor:
    """[P] bool: pool image equal (within atol) to some original of the same shape."""
    dup = torch.zeros(pool.shape[0], dtype=torch.bool)
    if pool.shape[0] == 0 or originals.shape[0] == 0 or pool.shape[1:] != originals.shape[1:]:
        return dup
    p = pool.detach().to("cpu", torch.float64).flatten(1)
    o = originals.detach().to("cpu", torch.float64).flatten(1)
    # Cheap signatures first (mean and mean of squares), exact comparison only for candidates.
    sig_p = torch.stack([p.mean(1), p.pow(2).mean(1)], 1)
    sig_o = torch.stack([o.mean(1), o.pow(2).mean(1)], 1)
    close = (torch.cdist(sig_p, sig_o, p=float("inf")) <= 2 * atol + 1e-12)
    for j, k in close.nonzero().tolist():
        if not dup[j] and torch.allclose(p[j], o[k], rtol=0.0, atol=atol):
            dup[j] = True
    return dup


def iip(reconstructions: torch.Tensor, originals: torch.Tensor, pool: torch.Tensor | None,
        feature_space: FeatureSpace) -> IIPResult:
    """Image Identifiability Precision (GradInversion, Fig. 8).

    reconstructions: [K, C, H, W] in [0, 1], *paired* with ``originals`` (row k is the
                     reconstruction of original k, e.g. ``Evaluation.paired_images``).
    originals:       [K, C, H, W] in [0, 1], the client's private images.
    pool:            [P, C, H', W'] other images from the same distribution (the "similar
                     peers"), or None. It may contain the originals: pool images that are exact
                     duplicates of an original (same shape, equal within 1e-6) are dropped, so
                     each original is a candidate exactly once.
    feature_space:   where neighbours are searched (:class:`ModelFeatures` reproduces the
                     paper's avgpool cosine similarity; :class:`PixelFeatures` is model-free).

    Candidates are the originals followed by the de-duplicated pool. Reconstruction k is a
    hit when its cosine similarity to original k is *strictly* larger than to every other
    candidate (ties, zero feature vectors and NaNs count as misses, so a blank reconstruction
    never scores by tie-breaking). Chance level is about 1 / pool_size.
    """
    rec = _check_images(reconstructions)
    orig = _check_images(originals)
    if rec.shape[0] != orig.shape[0]:
        raise ModelMismatchError(f"{rec.shape[0]} reconstructions for {orig.shape[0]} originals; pass them paired")
    k = int(orig.shape[0])
    name = str(getattr(feature_space, "name", type(feature_space).__name__))
    if pool is not None and pool.numel() > 0:
        pool = _check_images(pool)
        keep = ~_exact_duplicates(pool, orig)
        extra = pool[keep.to(pool.device)]
    else:
        extra = None
    n_pool = 0 if extra is None else int(extra.shape[0])
    if k == 0:
        return IIPResult(0.0, [], name, n_pool, [])

    f_rec = feature_space.embed(rec).to("cpu", torch.float64)
    parts = [feature_space.embed(orig).to("cpu", torch.float64)]
    if extra is not None and n_pool:
        parts.append(feature_space.embed(extra).to("cpu", torch.float64))
    f_cand = torch.cat(parts)
    if f_rec.shape[1] != f_cand.shape[1]:
        raise ModelMismatchError("reconstruction and candidate features have different widths")
    rn = f_rec.norm(dim=1, keepdim=True)
    cn = f_cand.norm(dim=1, keepdim=True)
    sim = (f_rec / rn.clamp_min(1e-300)) @ (f_cand / cn.clamp_min(1e-300)).T  # [K, K + P]
    undefined = (rn.squeeze(1) == 0) | ~torch.isfinite(sim).all(dim=1)
    sim = torch.nan_to_num(sim, nan=-2.0)
    sim[:, (cn.squeeze(1) == 0)] = -2.0  # a blank candidate is nobody's neighbour
    own = sim[torch.arange(k), torch.arange(k)]
    others = sim.clone()
    others[torch.arange(k), torch.arange(k)] = -float("inf")
    best_other = others.max(dim=1).values if others.shape[1] > 1 else torch.full((k,), -float("inf"))
    hits_t = (own > best_other) & ~undefined
    nearest_t = torch.where(undefined, torch.full((k,), -1, dtype=torch.long), sim.argmax(dim=1))
    hits = [bool(h) for h in hits_t]
    return IIPResult(precision=sum(hits) / k, hits=hits, feature_space=name,
                     pool_size=int(f_cand.shape[0]), nearest=[int(i) for i in nearest_t])


NORM_BLOCK = 512  # samples whose per-sample gradients are held at once


def per_sample_gradient_norms(model_spec: ModelSpec, batch: Batch | torch.Tensor,
                              labels: torch.Tensor | None = None, *, chunk_size: int | None = 8) -> torch.Tensor:
    """The l2 norm of each sample's own gradient, ``||d CE(f(x_k), y_k) / d W||`` -> [K] float64.

    batch: a :class:`Batch` (images [K, C, H, W] in [0, 1], labels [K]) or an image tensor
           with ``labels`` given separately.

    Computed with ``torch.func.vmap`` over ``grad`` of a ``functional_call`` (all trainable
    parameters, vmapped in chunks of ``chunk_size`` samples to bound memory). The model runs
    in **eval mode**: BatchNorm then normalises with its running statistics, so each sample's
    gradient depends on that sample alone. (In train mode a lone sample's BN statistics would
    be its own, a different network from the one that sees a batch; and within a batch the
    samples' gradients are coupled through the batch statistics, so there is no per-sample
    gradient at all.) Dropout is inactive in eval mode as well. The module, its buffers and
    its parameters are left untouched. Used for the paper's "vulnerable population": the
    image with the largest gradient norm per class.
    """
    if isinstance(batch, Batch):
        images, labels = batch.images, batch.labels
    else:
        images = batch
        if labels is None:
            raise ModelMismatchError("per_sample_gradient_norms needs labels with a bare image tensor")
    if images.ndim != 4 or labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise ModelMismatchError(f"expected images [K,C,H,W] and labels [K], got {tuple(images.shape)} "
                                 f"and {tuple(labels.shape)}")
    if tuple(images.shape[1:]) != tuple(model_spec.input_shape):
        raise ModelMismatchError(f"images are {list(images.shape[1:])}, model {model_spec.name} expects "
                                 f"{list(model_spec.input_shape)}")
    module = model_spec.module
    params = {n: p.detach() for n, p in module.named_parameters() if p.requires_grad}
    if not params:
        raise ModelMismatchError(f"model {model_spec.name} has no trainable parameters")
    first = next(iter(params.values()))
    buffers = {n: b.detach() for n, b in module.named_buffers()}
    x_all = model_spec.normalize(images.detach().to(first.device, first.dtype))
    y_all = labels.detach().to(first.device, torch.long)

    def loss_one(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = functional_call(module, (p, buffers), (x.unsqueeze(0),))
        return F.cross_entropy(logits, y.unsqueeze(0))

    per_sample = vmap(grad(loss_one), in_dims=(None, 0, 0), chunk_size=chunk_size)
    # Reduced to norms block by block: the per-sample gradients of a whole data source at once
    # are K x P numbers (Fashion-MNIST's 70 000 images on the width-16 convnet: ~20 GB, which
    # the OOM killer ended), a block's are at most NORM_BLOCK x P.
    norms = []
    was_training = module.training
    module.eval()
    try:
        with torch.enable_grad():
            for start in range(0, x_all.shape[0], NORM_BLOCK):
                grads = per_sample(params, x_all[start:start + NORM_BLOCK], y_all[start:start + NORM_BLOCK])
                sq = sum(g.to(torch.float64).flatten(1).pow(2).sum(dim=1) for g in grads.values())
                norms.append(torch.as_tensor(sq).sqrt().cpu())
    finally:
        module.train(was_training)
    return torch.cat(norms) if norms else torch.zeros(0, dtype=torch.float64)
