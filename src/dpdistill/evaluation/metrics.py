"""Evaluation of classifiers on real held-out data."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@torch.inference_mode()
def probabilities(model: nn.Module, images: Tensor, batch_size: int = 1024,
                  device: str | torch.device = "cpu") -> Tensor:
    """(n, classes) softmax outputs, computed in eval mode in batches (the model's mode is restored afterwards)."""
    was_training = model.training
    model.eval()
    outputs = [F.softmax(model(images[i:i + batch_size].to(device)), 1).cpu() for i in range(0, len(images), batch_size)]
    model.train(was_training)
    return torch.cat(outputs)


def predict(model: nn.Module, images: Tensor, batch_size: int = 1024, device: str | torch.device = "cpu") -> Tensor:
    """Predicted classes (see `probabilities`)."""
    return probabilities(model, images, batch_size, device).argmax(1)


def accuracy(model: nn.Module, images: Tensor, labels: Tensor, batch_size: int = 1024,
             device: str | torch.device = "cpu") -> float:
    """Fraction of correct predictions, in [0, 1]."""
    return (predict(model, images, batch_size, device) == labels).float().mean().item()
