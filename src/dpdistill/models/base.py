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

    def fixed_split(self) -> tuple[nn.Module, nn.Module] | None:
        """(a leading fixed transform: no parameters, no state, nothing learnt from data; the layers after it), so
        private training computes the transform once per data set and trains the rest on its output; None when
        the model starts with learnt layers."""
        return (self.backbone, self.head) if self.fixed_backbone else None

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
