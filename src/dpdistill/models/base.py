"""The interface every teacher and student shares."""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import Tensor, nn


class Classifier(nn.Module):
    """forward(x) = classify(features(x)): methods need the backbone features (generator activation loss).

    Built-in architectures set `self.backbone` (input -> flat features) and `self.head` (features -> logits).
    """

    backbone: nn.Module
    head: nn.Module
    fixed_backbone = False  # a backbone without parameters (a fixed transform): head-only training needs no encoder
    channels_last = False  # whether features() passes its images in channels-last order: see use_channels_last

    def fixed_split(self) -> tuple[nn.Module, nn.Module] | None:
        """(a leading fixed transform: no parameters, no state, nothing learnt from data; the layers after it), so
        private training computes the transform once per data set and trains the rest on its output; None when
        the model starts with learnt layers."""
        return (self.backbone, self.head) if self.fixed_backbone else None

    def features(self, x: Tensor) -> Tensor:
        """Flat (N, F) pre-classifier features."""
        return self.backbone(in_memory_order(x, self.channels_last))

    def classify(self, features: Tensor) -> Tensor:
        """Logits (N, classes) from features."""
        return self.head(features)

    def forward(self, x: Tensor) -> Tensor:
        return self.classify(self.features(x))


Network = TypeVar("Network", bound=nn.Module)


def use_channels_last(model: Network, enabled: bool = True) -> Network:
    """`model` with its weights, and the maps it computes, in channels-last order (or back in the standard one);
    the convolutional networks (cnn, datalens, the ResNets, the generator) are built so.
    On CPU (oneDNN) convolutions, batch norm and pooling train faster so: a step of the cnn on 28x28 images, batch
    128, one thread, 276 -> 178 ms. Opacus' per-example gradients are slower so (an epoch of DP-SGD on
    Fashion-MNIST 125 -> 219 s), and so is GroupNorm, twenty times (models/per_example.py): a model made
    per-example computes in the standard order."""
    for network in model.modules():  # a wrapped classifier (an imported model's input transform) follows
        if hasattr(type(network), "channels_last"):
            network.channels_last = enabled
    return model.to(memory_format=torch.channels_last if enabled else torch.contiguous_format)


def in_memory_order(maps: Tensor, channels_last: bool) -> Tensor:
    """Image maps (N, C, H, W) in the order a network built by `use_channels_last` computes in; other tensors as
    they are."""
    return maps.contiguous(memory_format=torch.channels_last) if channels_last and maps.dim() == 4 else maps


def count_parameters(model: nn.Module) -> int:
    """Number of trainable weights, for reports comparing teacher and student sizes."""
    return sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)
