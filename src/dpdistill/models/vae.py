"""A variational autoencoder (Kingma and Welling 2014) over images in [-1, 1], for DGD's manifold regularisation
(seed 004): its decoder maps a latent code to an image, so a step in the code is a step along the images'
manifold (tangent) and the decoder's Jacobian spans that manifold's tangent space.

Fully connected: two hidden layers each way, a Gaussian code of `latent_dim` (the seed's 32), and a Bernoulli
decoder on the images rescaled to [0, 1] (its logits; `decode` returns images in [-1, 1]).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class VAE(nn.Module):
    def __init__(self, in_shape: tuple[int, ...], latent_dim: int = 32, hidden: tuple[int, int] = (512, 256)) -> None:
        super().__init__()
        self.in_shape, self.latent_dim = tuple(in_shape), latent_dim
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
        """Images in [-1, 1]."""
        return 2 * torch.sigmoid(self.decode_logits(codes)) - 1

    def loss(self, images: Tensor) -> Tensor:
        """The negative evidence lower bound per image: reconstruction (Bernoulli) plus KL to the prior."""
        mean, log_variance = self.encode(images)
        codes = mean + torch.randn_like(mean) * (0.5 * log_variance).exp()
        targets = (images + 1) / 2
        reconstruction = nn.functional.binary_cross_entropy_with_logits(self.decode_logits(codes), targets,
                                                                        reduction="none").flatten(1).sum(1)
        kl = 0.5 * (mean.pow(2) + log_variance.exp() - 1 - log_variance).sum(1)
        return (reconstruction + kl).mean()
