"""Classifier architectures sized for 8x8, 28x28 and 32x32 inputs."""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from dpdistill.models.base import Classifier, use_channels_last


class ConvNet(Classifier):
    """Teacher default: three 3x3 conv blocks with BatchNorm, each max-pooled while the map is at least 4 wide,
    flattened into a linear classifier (32-64-64 channels: 28 -> 14 -> 7 -> 3 pixels)."""

    def __init__(self, in_shape: tuple[int, int, int], num_classes: int, width: tuple[int, ...] = (32, 64, 64)) -> None:
        super().__init__()
        layers, channels, size = conv_blocks(in_shape[0], min(in_shape[1:]), width, nn.BatchNorm2d)
        self.backbone = nn.Sequential(*layers, nn.Flatten())
        self.head = nn.Linear(channels * size * size, num_classes)
        use_channels_last(self)


def conv_blocks(channels: int, size: int, width: tuple[int, ...], norm: Callable[[int], nn.Module]
                ) -> tuple[list[nn.Module], int, int]:
    """3x3 conv, `norm`, ReLU blocks of `width` channels, each max-pooled while the map is at least 4 wide: the
    layers, and the channels and width of the map they leave."""
    layers: list[nn.Module] = []
    for out_channels in width:
        layers += [nn.Conv2d(channels, out_channels, 3, padding=1), norm(out_channels), nn.ReLU()]
        if size >= 4:
            layers.append(nn.MaxPool2d(2))
            size //= 2
        channels = out_channels
    return layers, channels, size


class DataLensStudent(Classifier):
    """The student of DataLens and DPSD: Conv32-MaxPool-Dropout0.2-Conv64-Dropout0.25-Dense64-Dense(classes)."""

    def __init__(self, in_shape: tuple[int, int, int], num_classes: int) -> None:
        super().__init__()
        channels, height, width = in_shape
        self.backbone = nn.Sequential(
            nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Dropout(0.25), nn.Flatten(),
            nn.Linear(64 * (height // 2) * (width // 2), 64), nn.ReLU(),
        )
        self.head = nn.Linear(64, num_classes)
        use_channels_last(self)


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual connection (1x1 projection when the shape changes)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False), nn.BatchNorm2d(out_channels), nn.ReLU(),
            nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False), nn.BatchNorm2d(out_channels),
        )
        self.shortcut = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                                          nn.BatchNorm2d(out_channels))
        self.activation = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.activation(self.body(x) + self.shortcut(x))


class ResNet(Classifier):
    """CIFAR-style ResNet (3x3 stem, no initial pooling), the papers' teacher for larger inputs."""

    def __init__(self, in_shape: tuple[int, int, int], num_classes: int, blocks: tuple[int, ...],
                 width: int = 64) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(in_shape[0], width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
        channels = width
        for stage, count in enumerate(blocks):
            out_channels = width * 2**stage
            for index in range(count):
                layers.append(BasicBlock(channels, out_channels, 2 if stage > 0 and index == 0 else 1))
                channels = out_channels
        self.backbone = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(channels, num_classes)
        use_channels_last(self)


def resnet18(in_shape: tuple[int, int, int], num_classes: int, width: int = 64) -> ResNet:
    """ResNet-18; `width` is the stem's channel count (64 in the paper, small values for tests)."""
    return ResNet(in_shape, num_classes, (2, 2, 2, 2), width)


def resnet34(in_shape: tuple[int, int, int], num_classes: int, width: int = 64) -> ResNet:
    """ResNet-34; `width` as for resnet18."""
    return ResNet(in_shape, num_classes, (3, 4, 6, 3), width)
