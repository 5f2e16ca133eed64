"""ResNet-18 and ResNet-50 with torchvision's module names, so state dicts load either way.

Architecture as in torchvision 0.x (ResNet v1.5: the stride of a bottleneck sits on its 3x3
convolution). Parameter counts with 1000 classes: resnet18 11,689,512, resnet50 25,557,032.
Written here so that examples and benchmarks do not need torchvision.
"""
from __future__ import annotations

from typing import Type, Union

import torch
from torch import nn

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "resnet18", "resnet50"]


def _conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions and a shortcut (ResNet-18/34)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + shortcut)

    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn2


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carries the stride), 1x1 expand by 4, and a shortcut (ResNet-50+)."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + shortcut)

    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn3


Block = Union[Type[BasicBlock], Type[Bottleneck]]


class ResNet(nn.Module):
    """Stem, four stages of residual blocks, global average pooling, one linear classifier.

    Args:
        block: BasicBlock or Bottleneck.
        layers: number of blocks per stage, e.g. [2, 2, 2, 2] for ResNet-18.
        num_classes: outputs of ``fc``.
        zero_init_residual: start each block's last BatchNorm at zero weight, so every block
            begins as the identity (helps large-batch training; off by default as in torchvision).
    """

    def __init__(self, block: Block, layers: list[int], num_classes: int = 1000,
                 zero_init_residual: bool = False) -> None:
        super().__init__()
        if len(layers) != 4 or any(n < 1 for n in layers):
            raise ValueError(
                f"ResNet needs four stages of at least one block; got layers={layers}.\n"
                "HINT: use [2, 2, 2, 2] (ResNet-18) or [3, 4, 6, 3] (ResNet-50)."
            )
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._stage(block, 64, layers[0], stride=1)
        self.layer2 = self._stage(block, 128, layers[1], stride=2)
        self.layer3 = self._stage(block, 256, layers[2], stride=2)
        self.layer4 = self._stage(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):  # He init for ReLU networks, fan-out (torchvision's choice)
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, (BasicBlock, Bottleneck)):
                    nn.init.zeros_(m.last_bn().weight)

    def _stage(self, block: Block, planes: int, blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        out_planes = planes * block.expansion
        if stride != 1 or self.inplanes != out_planes:
            downsample = nn.Sequential(_conv1x1(self.inplanes, out_planes, stride),
                                       nn.BatchNorm2d(out_planes))
        stage = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = out_planes
        stage += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*stage)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(num_classes: int = 1000, **kwargs: bool) -> ResNet:
    """ResNet-18 (11,689,512 parameters with 1000 classes)."""
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes=num_classes, **kwargs)


def resnet50(num_classes: int = 1000, **kwargs: bool) -> ResNet:
    """ResNet-50 v1.5 (25,557,032 parameters with 1000 classes)."""
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes=num_classes, **kwargs)
