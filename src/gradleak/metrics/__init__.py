"""What leaked: image similarity, slot matching and the evaluation against ground truth."""

from gradleak.metrics.evaluate import Evaluation, ImageScore, evaluate, label_accuracy
from gradleak.metrics.image import mse, psnr, ssim
from gradleak.metrics.matching import match

__all__ = [
    "Evaluation",
    "ImageScore",
    "evaluate",
    "label_accuracy",
    "match",
    "mse",
    "psnr",
    "ssim",
]
