"""Private client data: offline image sources and reproducible batch sampling."""

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
