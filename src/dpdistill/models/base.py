"""The interface every teacher and student shares."""

from __future__ import annotations

from torch import Tensor, nn


class Classifier(nn.Module):
    """forward(x) = classify(features(x)): methods need the backbone features (generator activation loss)."""

    def features(self, x: Tensor) -> Tensor:
        """Flat (N, F) pre-classifier features."""
        raise NotImplementedError

    def classify(self, features: Tensor) -> Tensor:
        """Logits (N, classes) from features."""
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        return self.classify(self.features(x))
