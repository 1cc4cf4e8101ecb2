"""Evaluation of classifiers on real held-out data."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpdistill.models.features import in_batches


def probabilities(model: nn.Module, images: Tensor, batch_size: int = 1024,
                  device: str | torch.device = "cpu") -> Tensor:
    """(n, classes) softmax outputs, computed in eval mode in batches."""
    return in_batches(model, lambda batch: F.softmax(model(batch), 1), images, batch_size, device)


def features(model: nn.Module, images: Tensor, batch_size: int = 1024, device: str | torch.device = "cpu") -> Tensor:
    """(n, F) backbone features of a classifier (models.base.Classifier.features), computed in eval mode in batches."""
    return in_batches(model, model.features, images, batch_size, device)


def predict(model: nn.Module, images: Tensor, batch_size: int = 1024, device: str | torch.device = "cpu") -> Tensor:
    """Predicted classes (see `probabilities`)."""
    return probabilities(model, images, batch_size, device).argmax(1)


def confusion_counts(predicted: Tensor, labels: Tensor, num_classes: int) -> Tensor:
    """(classes, classes) counts of the images of each true class (row) given each predicted class (column)."""
    pairs = labels.long().cpu() * num_classes + predicted.long().cpu()
    return torch.bincount(pairs, minlength=num_classes * num_classes).view(num_classes, num_classes)


def accuracy(model: nn.Module, images: Tensor, labels: Tensor, batch_size: int = 1024,
             device: str | torch.device = "cpu") -> float:
    """Fraction of correct predictions, in [0, 1]."""
    return share_correct(predict(model, images, batch_size, device), labels)


def share_correct(predicted: Tensor, labels: Tensor) -> float:
    """Fraction of `predicted` classes equal to `labels`, in [0, 1] (for predictions already made)."""
    return (predicted == labels).float().mean().item()
