"""A variational autoencoder (Kingma and Welling 2014) over images, for DGD's manifold regularisation
(seed 004): its decoder maps a latent code to an image, so a step in the code is a step along the images'
manifold (tangent) and the decoder's Jacobian spans that manifold's tangent space.

Fully connected: two hidden layers each way, a Gaussian code of `latent_dim` (the seed's 32), and a Bernoulli
decoder on the images rescaled to [0, 1] from `value_range` (its logits; `decode` returns images in that range).
The range is the images' own: [-1, 1] for a data set's, wider for a generator ending in DAFL's BatchNorm, whose
images have unit variance. A Bernoulli likelihood of a target outside [0, 1] has no lower bound: fitted to such
images the decoder's logits grow without end and its sigmoid saturates, so every reconstruction and every
tangent-normal view would be a clipped, dead copy.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from dpdistill.errors import ConfigError


class VAE(nn.Module):
    def __init__(self, in_shape: tuple[int, ...], latent_dim: int = 32, hidden: tuple[int, int] = (512, 256),
                 value_range: tuple[float, float] = (-1.0, 1.0)) -> None:
        super().__init__()
        low, high = value_range
        if not high > low:
            raise ConfigError(f"a VAE needs images that are not all one value (their range is {low} to {high})")
        self.in_shape, self.latent_dim, self.low, self.span = tuple(in_shape), latent_dim, low, high - low
        pixels = math.prod(in_shape)
        self.encoder = nn.Sequential(nn.Flatten(), nn.Linear(pixels, hidden[0]), nn.ReLU(),
                                     nn.Linear(hidden[0], hidden[1]), nn.ReLU(), nn.Linear(hidden[1], 2 * latent_dim))
        self.decoder = nn.Sequential(nn.Linear(latent_dim, hidden[1]), nn.ReLU(), nn.Linear(hidden[1], hidden[0]),
                                     nn.ReLU(), nn.Linear(hidden[0], pixels))

    def encode(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """The code's mean and log-variance, (n, latent_dim) each."""
        mean, log_variance = self.encoder(images).chunk(2, dim=1)
        return mean, log_variance

    def decode_logits(self, codes: Tensor) -> Tensor:
        return self.decoder(codes).view(len(codes), *self.in_shape)

    def decode(self, codes: Tensor) -> Tensor:
        """Images in the value range."""
        return self.low + self.span * torch.sigmoid(self.decode_logits(codes))

    def loss(self, images: Tensor) -> Tensor:
        """The negative evidence lower bound per image: reconstruction (Bernoulli) plus KL to the prior; a pixel
        outside the value range counts as its nearer end."""
        mean, log_variance = self.encode(images)
        codes = mean + torch.randn_like(mean) * (0.5 * log_variance).exp()
        targets = ((images - self.low) / self.span).clamp(0, 1)
        reconstruction = nn.functional.binary_cross_entropy_with_logits(self.decode_logits(codes), targets,
                                                                        reduction="none").flatten(1).sum(1)
        kl = 0.5 * (mean.pow(2) + log_variance.exp() - 1 - log_variance).sum(1)
        return (reconstruction + kl).mean()
