"""What leaked: image similarity, slot matching and the evaluation against ground truth."""

from gradleak.metrics.evaluate import Evaluation, ImageScore, evaluate, label_accuracy, prior_psnr
from gradleak.metrics.image import mse, psnr, ssim
from gradleak.metrics.matching import match, pair_by_label

__all__ = [
    "Evaluation",
    "ImageScore",
    "evaluate",
    "label_accuracy",
    "match",
    "pair_by_label",
    "prior_psnr",
    "mse",
    "psnr",
    "ssim",
]
