"""Private client data: offline image sources and reproducible batch sampling.

Typical use::

    source = open_source("cifar10-samples")
    batch = sample_batch(source, batch_size=4, seed=0, image_size=32, channels=3)
    batch.images  # [4, 3, 32, 32] float32 in [0, 1]
"""

from gradleak.data.batch import Batch
from gradleak.data.images import IMAGE_EXTENSIONS, load_image_file
from gradleak.data.sources import (
    CIFAR10_CLASSES,
    CIFAR100_CLASSES,
    FASHION_MNIST_CLASSES,
    SOURCE_NAMES,
    FashionMNISTSource,
    ImageFolderSource,
    ImageSource,
    SampleSource,
    open_source,
    batch_of,
    sample_batch,
)

__all__ = [
    "Batch",
    "CIFAR10_CLASSES",
    "CIFAR100_CLASSES",
    "FASHION_MNIST_CLASSES",
    "FashionMNISTSource",
    "IMAGE_EXTENSIONS",
    "ImageFolderSource",
    "ImageSource",
    "SOURCE_NAMES",
    "SampleSource",
    "load_image_file",
    "open_source",
    "batch_of",
    "sample_batch",
]
