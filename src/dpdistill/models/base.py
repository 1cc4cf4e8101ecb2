"""The interface every teacher and student shares."""

from __future__ import annotations

from torch import Tensor, nn


class Classifier(nn.Module):
    """forward(x) = classify(features(x)): methods need the backbone features (generator activation loss).

    Built-in architectures set `self.backbone` (input -> flat features) and `self.head` (features -> logits).
    """

    backbone: nn.Module
    head: nn.Module
    fixed_backbone = False  # a backbone without parameters (a fixed transform): head-only training needs no encoder

    def features(self, x: Tensor) -> Tensor:
        """Flat (N, F) pre-classifier features."""
        return self.backbone(x)

    def classify(self, features: Tensor) -> Tensor:
        """Logits (N, classes) from features."""
        return self.head(features)

    def forward(self, x: Tensor) -> Tensor:
        return self.classify(self.features(x))


def count_parameters(model: nn.Module) -> int:
    """Number of trainable weights, for reports comparing teacher and student sizes."""
    return sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)
