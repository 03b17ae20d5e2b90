"""The papers' small models: DLG's LeNet, a small BatchNorm ConvNet for fast CPU runs, and a
fully connected network (the analytic attack's victim)."""

from __future__ import annotations

import torch
from torch import nn


class LeNetDLG(nn.Module):
    """LeNet as in the DLG paper's code (Zhu et al. 2019): three 5x5 convolutions with sigmoid
    activations (twice differentiable, which gradient matching needs) and one linear layer.

    Input [B, C, H, W] -> logits [B, num_classes]. For 32 px input the feature size is 768.
    """

    def __init__(self, num_classes: int = 10, channels: int = 3, image_size: int = 32):
        super().__init__()
        act = nn.Sigmoid
        self.body = nn.Sequential(
            nn.Conv2d(channels, 12, kernel_size=5, padding=2, stride=2),
            act(),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=2),
            act(),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=1),
            act(),
        )
        side = (image_size + 1) // 2
        side = (side + 1) // 2
        self.fc = nn.Linear(12 * side * side, num_classes)
        self.reset_parameters_uniform()

    def reset_parameters_uniform(self) -> None:
        # DLG's weights_init: every weight and bias ~ U(-0.5, 0.5). Larger weights than the
        # default init keep the sigmoid layers out of their linear regime (paper's code).
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.uniform_(m.weight, -0.5, 0.5)
                nn.init.uniform_(m.bias, -0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x).flatten(1))


class ConvNet(nn.Module):
    """A small CNN with BatchNorm, ReLU and a width option, for fast CPU experiments.

    conv(w) - conv(2w) - pool - conv(4w) - pool - conv(4w) - avgpool(4x4) - linear.
    The classifier input is non-negative (ReLU then average pooling), which label restoration
    from the FC-layer gradient relies on (GradInversion Eq. 6).
    Input [B, C, H, W] (H, W >= 8) -> logits [B, num_classes].
    """

    def __init__(self, num_classes: int = 10, channels: int = 3, width: int = 32):
        super().__init__()
        w = width

        def block(cin: int, cout: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

        self.features = nn.Sequential(
            *block(channels, w),
            *block(w, 2 * w),
            nn.MaxPool2d(2),
            *block(2 * w, 4 * w),
            nn.MaxPool2d(2),
            *block(4 * w, 4 * w),
            nn.AdaptiveAvgPool2d(4),
        )
        self.fc = nn.Linear(4 * w * 16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).flatten(1))


class MLP(nn.Module):
    """A fully connected network: flatten, Linear(C*H*W, width) with bias, ReLU, Linear(width,
    num_classes). Its first layer sees the image itself, so the gradient of that layer gives the
    input away in closed form (Phong et al. 2017; attacks/analytic.py). PyTorch's default init.

    Input [B, C, H, W] -> logits [B, num_classes].
    """

    def __init__(self, num_classes: int = 10, channels: int = 3, image_size: int = 32, width: int = 1024):
        super().__init__()
        self.fc1 = nn.Linear(channels * image_size * image_size, width)
        self.act = nn.ReLU()
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.act(self.fc1(x.flatten(1))))
