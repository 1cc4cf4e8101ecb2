"""DataLens' networks as its official code builds them (a conditional DCGAN): a class-conditional generator and a
bank of N teacher discriminators evaluated as one batched computation.

The teachers are identical in shape and each sees only its own partition, so their weights are stacked along a
teacher axis: the convolutions are grouped convolutions (groups = N) over a (batch, N x channels, H, W) layout, the
dense layers batched matrix products, and batch norm, in training mode as in the official code, normalises each
channel of each teacher over that teacher's own batch only. N teachers cost one wide network, not a Python loop.

The one-hot class joins every layer. Through a convolution, constant class maps give one fixed map per class (the
kernel summed over the window's pixels inside the image), so the bank computes those ten maps per teacher once per
call and adds the one of each sample's class: equal to convolving the concatenated maps, at about half the cost.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpdistill.errors import ConfigError

KERNEL, STRIDE = 5, 2  # every (transposed) convolution of the official DCGAN
INIT_STD = 0.02  # DCGAN's initialisation of every weight
LEAK = 0.2
BN_EPS = 1e-5


class ConditionalGenerator(nn.Module):
    """(latent, class) -> image in [-1, 1], the official DCGAN generator: the one-hot class joins the latent vector
    and every hidden layer; linear (hidden) -> linear (2 width x H/4 x W/4) -> 5x5 stride-2 transposed convolution
    (2 width channels at H/2) -> 5x5 stride-2 transposed convolution -> sigmoid, scaled to [-1, 1]. Batch norm uses
    each batch's own statistics, when training and when generating alike (the official code never switches it to
    running averages), so the generator takes batches of at least two."""

    def __init__(self, latent_dim: int, num_classes: int, out_shape: tuple[int, int, int], hidden: int = 1024,
                 width: int = 64) -> None:
        super().__init__()
        channels, height, image_width = out_shape
        if height % 4 or image_width % 4:
            raise ConfigError(f"the DataLens generator doubles its size twice: image height and width must be "
                              f"multiples of 4, got {out_shape}")
        self.latent_dim, self.num_classes = latent_dim, num_classes
        self.start = (2 * width, height // 4, image_width // 4)
        self.dense = nn.Sequential(nn.Linear(latent_dim + num_classes, hidden), _batch_norm(nn.BatchNorm1d, hidden),
                                   nn.ReLU())
        self.project = nn.Sequential(nn.Linear(hidden + num_classes, math.prod(self.start)),
                                     _batch_norm(nn.BatchNorm1d, math.prod(self.start)), nn.ReLU())
        self.up = nn.Sequential(_transposed(2 * width + num_classes, 2 * width), _batch_norm(nn.BatchNorm2d, 2 * width),
                                nn.ReLU())
        self.out = _transposed(2 * width + num_classes, channels)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.ConvTranspose2d)):
                nn.init.normal_(module.weight, std=INIT_STD)
                nn.init.zeros_(module.bias)

    def forward(self, latents: Tensor, labels: Tensor) -> Tensor:
        onehot = F.one_hot(labels, self.num_classes).to(latents.dtype)
        hidden = self.dense(torch.cat([latents, onehot], 1))
        maps = self.project(torch.cat([hidden, onehot], 1)).view(-1, *self.start)
        maps = self.up(_with_class_maps(maps, onehot))
        return 2 * torch.sigmoid(self.out(_with_class_maps(maps, onehot))) - 1


def _batch_norm(kind: type[nn.Module], features: int) -> nn.Module:
    """Batch norm on each batch's statistics, always (no running averages to switch to)."""
    return kind(features, eps=BN_EPS, track_running_stats=False)


def _transposed(in_channels: int, out_channels: int) -> nn.ConvTranspose2d:
    """A 5x5 stride-2 transposed convolution that doubles the size ('SAME', as TensorFlow's)."""
    return nn.ConvTranspose2d(in_channels, out_channels, KERNEL, STRIDE, padding=KERNEL // 2, output_padding=1)


def _with_class_maps(maps: Tensor, onehot: Tensor) -> Tensor:
    """The one-hot class as constant feature maps beside `maps` (conditioning every layer)."""
    return torch.cat([maps, onehot[:, :, None, None].expand(-1, -1, *maps.shape[2:])], 1)


def same_padding(size: int) -> tuple[int, int]:
    """TensorFlow's 'SAME' padding of a 5x5 stride-2 convolution along one side of `size` pixels: (before,
    after), the odd pixel after."""
    total = max((math.ceil(size / STRIDE) - 1) * STRIDE + KERNEL - size, 0)
    return total // 2, total - total // 2


class DiscriminatorBank(nn.Module):
    """N official DataLens teachers (conditional DCGAN discriminators), weights stacked on a teacher axis. Each is:
    [image, class maps] -> 5x5 stride-2 conv (channels + classes filters), LeakyReLU 0.2 -> [., class maps] -> 5x5
    stride-2 conv (width + classes filters), batch norm, LeakyReLU -> flatten, [., class] -> dense (hidden), batch
    norm, LeakyReLU -> [., class] -> logit. Weights N(0, 0.02) (the convolutions' truncated at two deviations),
    biases 0, batch norm in training mode on each teacher's own batch.

    `forward` takes pixels in [0, 1] (the official scale) as (N, B, C, H, W), one batch per teacher, or (B, C, H, W)
    shared by all, and labels (N, B) or (B,); it returns (N, B) logits."""

    def __init__(self, teachers: int, in_shape: tuple[int, int, int], num_classes: int, width: int = 32,
                 hidden: int = 256) -> None:
        super().__init__()
        channels, height, image_width = in_shape
        self.teachers, self.in_shape, self.num_classes = teachers, in_shape, num_classes
        self.first, self.second = channels + num_classes, width + num_classes  # the official filter counts
        self.pads = [same_padding(image_width) + same_padding(height)]
        self.sizes = [(math.ceil(height / STRIDE), math.ceil(image_width / STRIDE))]
        self.pads.append(same_padding(self.sizes[0][1]) + same_padding(self.sizes[0][0]))
        self.sizes.append((math.ceil(self.sizes[0][0] / STRIDE), math.ceil(self.sizes[0][1] / STRIDE)))
        flat = self.second * math.prod(self.sizes[1])
        self.conv1 = nn.Parameter(_truncated(teachers * self.first, channels, KERNEL, KERNEL))
        self.conv1_class = nn.Parameter(_truncated(teachers * self.first, num_classes, KERNEL, KERNEL))
        self.conv1_bias = nn.Parameter(torch.zeros(teachers * self.first))
        self.conv2 = nn.Parameter(_truncated(teachers * self.second, self.first, KERNEL, KERNEL))
        self.conv2_class = nn.Parameter(_truncated(teachers * self.second, num_classes, KERNEL, KERNEL))
        self.conv2_bias = nn.Parameter(torch.zeros(teachers * self.second))
        self.conv2_scale = nn.Parameter(torch.ones(teachers * self.second))
        self.conv2_shift = nn.Parameter(torch.zeros(teachers * self.second))
        self.dense = nn.Parameter(torch.randn(teachers, flat, hidden) * INIT_STD)
        self.dense_class = nn.Parameter(torch.randn(teachers, num_classes, hidden) * INIT_STD)
        self.dense_bias = nn.Parameter(torch.zeros(teachers, 1, hidden))
        self.dense_scale = nn.Parameter(torch.ones(teachers * hidden))
        self.dense_shift = nn.Parameter(torch.zeros(teachers * hidden))
        self.logit = nn.Parameter(torch.randn(teachers, hidden, 1) * INIT_STD)
        self.logit_class = nn.Parameter(torch.randn(teachers, num_classes, 1) * INIT_STD)
        self.logit_bias = nn.Parameter(torch.zeros(teachers, 1, 1))

    def forward(self, images: Tensor, labels: Tensor) -> Tensor:
        teachers, channels = self.teachers, self.in_shape[0]
        if images.dim() == 4:  # one batch shared by every teacher
            images = images.unsqueeze(0).expand(teachers, *images.shape)
        if labels.dim() == 1:
            labels = labels.unsqueeze(0).expand(teachers, -1)
        batch = images.shape[1]
        maps = images.transpose(0, 1).reshape(batch, teachers * channels, *images.shape[3:])
        maps = self._conditioned_conv(maps, self.conv1, self.conv1_class, self.conv1_bias, 0, labels)
        maps = F.leaky_relu(maps, LEAK)
        maps = self._conditioned_conv(maps, self.conv2, self.conv2_class, self.conv2_bias, 1, labels)
        maps = F.leaky_relu(F.batch_norm(maps, None, None, self.conv2_scale, self.conv2_shift, True, 0.0, BN_EPS), LEAK)
        features = maps.reshape(batch, teachers, -1).transpose(0, 1)  # (N, B, flat): each teacher's own rows
        hidden = self._conditioned_dense(features, self.dense, self.dense_class, self.dense_bias, labels)
        hidden = hidden.transpose(0, 1).reshape(batch, -1)  # batch norm of each teacher's units over its batch
        hidden = F.leaky_relu(F.batch_norm(hidden, None, None, self.dense_scale, self.dense_shift, True, 0.0, BN_EPS),
                              LEAK)
        hidden = hidden.reshape(batch, teachers, -1).transpose(0, 1)
        return self._conditioned_dense(hidden, self.logit, self.logit_class, self.logit_bias, labels).squeeze(-1)

    def _conditioned_conv(self, maps: Tensor, weight: Tensor, class_weight: Tensor, bias: Tensor, layer: int,
                          labels: Tensor) -> Tensor:
        """Every teacher's 5x5 stride-2 convolution of [maps, class maps] (`weight`, `class_weight`: the kernels'
        two parts): the maps through the grouped convolution, plus the fixed map of each sample's class."""
        left_right_top_bottom = self.pads[layer]
        out = F.conv2d(F.pad(maps, left_right_top_bottom), weight, bias, STRIDE, groups=self.teachers)
        ones = F.pad(maps.new_ones(1, 1, *maps.shape[2:]), left_right_top_bottom)
        per_class = F.conv2d(ones, class_weight.reshape(-1, 1, KERNEL, KERNEL), stride=STRIDE)
        per_class = per_class.view(self.teachers, -1, self.num_classes, *out.shape[2:]).transpose(1, 2)
        chosen = per_class[torch.arange(self.teachers, device=labels.device)[:, None], labels]  # (N, B, C', h, w)
        return out + chosen.transpose(0, 1).reshape(out.shape)

    @staticmethod
    def _conditioned_dense(features: Tensor, weight: Tensor, class_weight: Tensor, bias: Tensor,
                           labels: Tensor) -> Tensor:
        """Every teacher's dense layer on [features, one-hot class]: the class's row of `class_weight`, added."""
        rows = torch.gather(class_weight, 1, labels[:, :, None].expand(-1, -1, class_weight.shape[-1]))
        return torch.baddbmm(bias, features, weight) + rows


def _truncated(*shape: int) -> Tensor:
    """TensorFlow's truncated_normal_initializer(0.02): N(0, 0.02^2) redrawn beyond two deviations."""
    return nn.init.trunc_normal_(torch.empty(shape), std=INIT_STD, a=-2 * INIT_STD, b=2 * INIT_STD)
