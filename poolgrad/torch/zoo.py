"""VGG-11 and ResNet-18, as torchvision defines them, for the tests and the benchmark.

These mirror torchvision's definitions (``torchvision.models.vgg11`` and
``torchvision.models.resnet18``): the same layers, the same attribute names (so their
state dicts load into each other), the same parameter counts and torchvision's default
initialization. They live here so that the tests and ``poolgrad bench --torch --models``
need no torchvision: the registry's torchvision wheel does not load against the CPU
build of PyTorch that poolgrad tests with.

Their pooling layers are ``torch.nn`` modules, as in torchvision;
``poolgrad.torch.replace_pooling(model)`` swaps them for poolgrad's.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["vgg11", "resnet18", "VGG", "ResNet", "BasicBlock"]

# VGG configuration "A": output channels of each 3x3 convolution, "M" a 2x2/2 max pool
VGG11_LAYERS = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


def _init_convolutions_and_norms(model: nn.Module) -> None:
    """torchvision's scheme, shared by both families: He initialization scaled by the
    fan-out for convolutions (they feed ReLUs), batch norms as the identity."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


class VGG(nn.Module):
    """``features`` (3x3 convolutions with ReLUs and 2x2/2 max pools), a 7x7 adaptive
    average pool, and a three-layer classifier with dropout."""

    def __init__(self, layers=VGG11_LAYERS, num_classes: int = 1000, dropout: float = 0.5):
        super().__init__()
        features, channels = [], 3
        for layer in layers:
            if layer == "M":
                features.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                features += [nn.Conv2d(channels, layer, kernel_size=3, padding=1),
                             nn.ReLU(inplace=True)]
                channels = layer
        self.features = nn.Sequential(*features)
        # any input of at least 32x32 reaches the classifier as 512x7x7
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(channels * 7 * 7, 4096), nn.ReLU(inplace=True), nn.Dropout(p=dropout),
            nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(p=dropout),
            nn.Linear(4096, num_classes))
        _init_convolutions_and_norms(self)
        for module in self.classifier:
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, 0.01)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a shortcut; ``downsample`` (a strided
    1x1 convolution and batch norm) matches the shortcut's shape when the block
    changes it."""

    expansion = 1

    def __init__(self, in_channels: int, channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(channels))
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + shortcut)


class ResNet(nn.Module):
    """The stem (7x7/2 convolution, batch norm, ReLU, 3x3/2 max pool), four stages of
    basic blocks (64, 128, 256, 512 channels; each stage after the first halves the
    size), a global average pool and a linear head."""

    def __init__(self, blocks_per_stage=(2, 2, 2, 2), num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        channels = 64
        widths = (64, 128, 256, 512)
        for stage, (width, blocks) in enumerate(zip(widths, blocks_per_stage, strict=True)):
            stride = 1 if stage == 0 else 2
            layers = [BasicBlock(channels, width, stride)]
            layers += [BasicBlock(width, width) for _ in range(blocks - 1)]
            setattr(self, f"layer{stage + 1}", nn.Sequential(*layers))
            channels = width
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(channels, num_classes)  # PyTorch's default init, as torchvision
        _init_convolutions_and_norms(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def vgg11(num_classes: int = 1000) -> VGG:
    """VGG-11 (configuration "A", no batch norm): 132,863,336 parameters for 1000
    classes."""
    return VGG(VGG11_LAYERS, num_classes)


def resnet18(num_classes: int = 1000) -> ResNet:
    """ResNet-18: 11,689,512 parameters for 1000 classes."""
    return ResNet((2, 2, 2, 2), num_classes)
