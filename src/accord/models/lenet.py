"""LeNet-5 style classifier for small grey images: 28x28 (MNIST) and 8x8 (scikit-learn digits).

For 28x28 it is Paddle's ``paddle.vision.models.LeNet`` layout (61,610 parameters with 10
classes): conv 3x3 pad 1 -> pool -> conv 5x5 -> pool -> 120 -> 84 -> classes. Images smaller than
20x20 cannot take the 5x5 convolution after pooling, so the second convolution becomes 3x3 with
padding 1 (for 8x8 digits: 19,754 parameters with 10 classes).
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["LeNet", "lenet"]


class LeNet(nn.Module):
    """Two convolution + pooling stages and three fully connected layers.

    Args:
        num_classes: outputs of the last layer.
        image_size: side of the square input image (>= 4), e.g. 28 or 8.
        in_channels: input channels (1 for grey images).
    Inputs are ``(N, C, H, W)``, or ``(N, C*H*W)`` rows (as scikit-learn's digits come), which are
    reshaped.
    """

    def __init__(self, num_classes: int = 10, image_size: int = 28, in_channels: int = 1) -> None:
        super().__init__()
        if image_size < 4:
            raise ValueError(
                f"LeNet needs images of at least 4x4 pixels; got image_size={image_size}.\n"
                "HINT: pass the side of your square images, e.g. 8 for digits or 28 for MNIST."
            )
        self.image_size = image_size
        self.in_channels = in_channels
        pooled = image_size // 2
        if pooled >= 10:  # room for the classic 5x5 valid convolution
            conv2 = nn.Conv2d(6, 16, kernel_size=5, stride=1, padding=0)
            side = (pooled - 4) // 2
        else:
            conv2 = nn.Conv2d(6, 16, kernel_size=3, stride=1, padding=1)
            side = pooled // 2
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, kernel_size=3, stride=1, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2, 2),
            conv2,
            nn.ReLU(),
            nn.MaxPool2d(2, 2),
        )
        self.fc = nn.Sequential(
            nn.Linear(16 * side * side, 120),
            nn.Linear(120, 84),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x.view(x.shape[0], self.in_channels, self.image_size, self.image_size)
        return self.fc(torch.flatten(self.features(x), 1))


def lenet(num_classes: int = 10, image_size: int = 28, in_channels: int = 1) -> LeNet:
    """LeNet for ``image_size`` x ``image_size`` images (28: MNIST; 8: scikit-learn digits)."""
    return LeNet(num_classes=num_classes, image_size=image_size, in_channels=in_channels)
