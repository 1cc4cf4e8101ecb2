"""DAFL-style generator: latent vector -> image in [-1, 1] (or, with DAFL's final BatchNorm, normalised)."""

from __future__ import annotations

from torch import Tensor, nn

from dpdistill.errors import ConfigError
from dpdistill.models.base import in_memory_order, use_channels_last


class Generator(nn.Module):
    """Linear to width[0] x H/4 x W/4, then two (upsample x2, conv 3x3, BatchNorm, LeakyReLU) stages, conv, tanh,
    and with `final_norm` DAFL's BatchNorm without affine terms (images then have zero mean and unit variance).

    The generator dominates the cost of a transcription: (128, 128, 64) costs about 2 s per DPSD iteration
    of 256 samples on 2 CPU cores at 28x28, (64, 32, 16) about 0.33 s.
    """

    channels_last = False  # whether forward() computes its maps in channels-last order: see use_channels_last

    def __init__(self, latent_dim: int, out_shape: tuple[int, int, int], width: tuple[int, int, int] = (128, 128, 64),
                 final_norm: bool = False) -> None:
        super().__init__()
        if len(out_shape) != 3 or len(width) != 3:
            raise ConfigError(f"generator needs out_shape (C, H, W) and width of 3 channel counts, "
                              f"got out_shape={out_shape}, width={width}")
        channels, height, image_width = out_shape
        if height % 4 or image_width % 4:
            raise ConfigError(f"generator output height and width must be multiples of 4 (it upsamples twice), "
                              f"got {out_shape}; resize the dataset images")
        self.latent_dim = latent_dim
        self.start = (width[0], height // 4, image_width // 4)
        self.project = nn.Sequential(nn.Linear(latent_dim, width[0] * (height // 4) * (image_width // 4)))
        self.body = nn.Sequential(
            nn.BatchNorm2d(width[0]),
            nn.Upsample(scale_factor=2), nn.Conv2d(width[0], width[1], 3, padding=1), nn.BatchNorm2d(width[1]),
            nn.LeakyReLU(0.2),
            nn.Upsample(scale_factor=2), nn.Conv2d(width[1], width[2], 3, padding=1), nn.BatchNorm2d(width[2]),
            nn.LeakyReLU(0.2),
            nn.Conv2d(width[2], channels, 3, padding=1), nn.Tanh(),
        )
        if final_norm:  # DAFL's last layer: keeps the images' scale while a large learning rate saturates the tanh
            self.body.append(nn.BatchNorm2d(channels, affine=False))
        use_channels_last(self)

    def forward(self, latents: Tensor) -> Tensor:
        return self.body(in_memory_order(self.project(latents).view(-1, *self.start), self.channels_last))
