"""DataLens' networks: a class-conditional generator and a bank of N teacher discriminators evaluated as one.

The teachers are identical in shape and each sees only its own partition, so their weights are stacked along a
leading teacher axis and every layer is one batched matrix product (`torch.baddbmm`) over all N at once: the cost
of N discriminators is that of one wide layer, not of a Python loop, and N in the thousands fits two CPU cores.
Each teacher is a conditional MLP (the image and the one-hot class in, one real/fake logit out): the official
code's convolutional discriminators would cost a thousand times more per teacher on a CPU.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpdistill.errors import ConfigError


class ConditionalGenerator(nn.Module):
    """(latent, class) -> image in [-1, 1], DCGAN-style as in DataLens' official code: the one-hot class joins the
    latent vector and every hidden layer; linear -> linear to width x H/4 x W/4 -> two transposed convolutions."""

    def __init__(self, latent_dim: int, num_classes: int, out_shape: tuple[int, int, int], hidden: int = 1024,
                 width: int = 64) -> None:
        super().__init__()
        channels, height, image_width = out_shape
        if height % 4 or image_width % 4:
            raise ConfigError(f"the DataLens generator doubles its size twice: image height and width must be "
                              f"multiples of 4, got {out_shape}")
        self.latent_dim, self.num_classes = latent_dim, num_classes
        self.start = (2 * width, height // 4, image_width // 4)
        self.dense = nn.Sequential(nn.Linear(latent_dim + num_classes, hidden), nn.BatchNorm1d(hidden), nn.ReLU())
        self.project = nn.Sequential(nn.Linear(hidden + num_classes, math.prod(self.start)),
                                     nn.BatchNorm1d(math.prod(self.start)), nn.ReLU())
        self.up = nn.Sequential(nn.ConvTranspose2d(2 * width + num_classes, width, 4, 2, 1), nn.BatchNorm2d(width),
                                nn.ReLU())
        self.out = nn.ConvTranspose2d(width + num_classes, channels, 4, 2, 1)

    def forward(self, latents: Tensor, labels: Tensor) -> Tensor:
        onehot = F.one_hot(labels, self.num_classes).to(latents.dtype)
        hidden = self.dense(torch.cat([latents, onehot], 1))
        maps = self.project(torch.cat([hidden, onehot], 1)).view(-1, *self.start)
        maps = self.up(_with_class_maps(maps, onehot))
        return torch.tanh(self.out(_with_class_maps(maps, onehot)))


def _with_class_maps(maps: Tensor, onehot: Tensor) -> Tensor:
    """The one-hot class as constant feature maps beside `maps` (conditioning every layer)."""
    return torch.cat([maps, onehot[:, :, None, None].expand(-1, -1, *maps.shape[2:])], 1)


class DiscriminatorBank(nn.Module):
    """N conditional MLP discriminators (image + one-hot class -> hidden, LeakyReLU 0.2 -> ... -> logit), their
    weights stacked on a leading teacher axis. `forward` takes (N, B, D) flattened images, one batch per teacher
    (or one shared batch expanded to N), and (N, B) or (B,) labels; it returns (N, B) logits."""

    def __init__(self, teachers: int, input_dim: int, num_classes: int, hidden: tuple[int, ...] = (128,)) -> None:
        super().__init__()
        self.teachers, self.input_dim, self.num_classes = teachers, input_dim, num_classes
        widths = [input_dim, *hidden, 1]
        self.weights = nn.ParameterList(
            nn.Parameter(_stacked_uniform(teachers, fan_in, fan_out)) for fan_in, fan_out in zip(widths, widths[1:]))
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(teachers, 1, width)) for width in widths[1:])
        self.class_weights = nn.Parameter(_stacked_uniform(teachers, input_dim + num_classes, widths[1],
                                                           rows=num_classes))

    def forward(self, images: Tensor, labels: Tensor) -> Tensor:
        activations = images
        for depth, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            activations = torch.baddbmm(bias, activations, weight)
            if depth == 0:  # the class's row of the first layer: a one-hot input multiplies nothing else
                activations = activations + self._class_rows(labels)
            if depth < len(self.weights) - 1:
                activations = F.leaky_relu(activations, 0.2)
        return activations.squeeze(-1)

    def _class_rows(self, labels: Tensor) -> Tensor:
        if labels.dim() == 1:  # one shared batch: the same classes for every teacher
            return self.class_weights[:, labels]
        return torch.gather(self.class_weights, 1,
                            labels[:, :, None].expand(-1, -1, self.class_weights.shape[-1]))


def _stacked_uniform(teachers: int, fan_in: int, fan_out: int, rows: int | None = None) -> Tensor:
    """PyTorch's default Linear initialisation, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), for every teacher."""
    bound = 1 / math.sqrt(fan_in)
    return torch.empty(teachers, fan_in if rows is None else rows, fan_out).uniform_(-bound, bound)
