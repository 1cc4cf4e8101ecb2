"""Evaluation of classifiers on real held-out data."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpdistill.models.base import Classifier


@torch.inference_mode()
def _in_batches(model: nn.Module, compute: Callable[[Tensor], Tensor], images: Tensor, batch_size: int,
                device: str | torch.device) -> Tensor:
    """`compute` on each batch of `images`, in eval mode (the model's mode is restored afterwards), on the CPU."""
    was_training = model.training
    model.eval()
    outputs = [compute(images[i:i + batch_size].to(device)).cpu() for i in range(0, len(images), batch_size)]
    model.train(was_training)
    return torch.cat(outputs)


def probabilities(model: nn.Module, images: Tensor, batch_size: int = 1024,
                  device: str | torch.device = "cpu") -> Tensor:
    """(n, classes) softmax outputs, computed in eval mode in batches."""
    return _in_batches(model, lambda batch: F.softmax(model(batch), 1), images, batch_size, device)


def features(model: Classifier, images: Tensor, batch_size: int = 1024, device: str | torch.device = "cpu") -> Tensor:
    """(n, F) backbone features, computed in eval mode in batches."""
    return _in_batches(model, model.features, images, batch_size, device)


def outputs(module: nn.Module, images: Tensor, batch_size: int = 1024, device: str | torch.device = "cpu") -> Tensor:
    """module(images), computed in eval mode in batches: a frozen encoder's or a fixed transform's outputs."""
    return _in_batches(module, module, images, batch_size, device)


def predict(model: nn.Module, images: Tensor, batch_size: int = 1024, device: str | torch.device = "cpu") -> Tensor:
    """Predicted classes (see `probabilities`)."""
    return probabilities(model, images, batch_size, device).argmax(1)


def accuracy(model: nn.Module, images: Tensor, labels: Tensor, batch_size: int = 1024,
             device: str | torch.device = "cpu") -> float:
    """Fraction of correct predictions, in [0, 1]."""
    return (predict(model, images, batch_size, device) == labels).float().mean().item()
