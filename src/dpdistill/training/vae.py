"""Fitting DGD's VAE (models/vae.py) to the images a student learns from: public or covered synthetic images
(or, in faithful DGD, the baseline-trained generator's), never private data. Adam with its learning rate decayed
linearly to zero, as the seed trains its VAE."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from dpdistill.errors import ConfigError
from dpdistill.models.vae import VAE
from dpdistill.progress import Progress

VAE_PHASE = "VAE"  # a progress display's name for fitting the VAE


@dataclass(frozen=True)
class VaeConfig:
    latent_dim: int = 32  # the seed's c
    steps: int = 3000  # the seed trains "500 rounds" without saying whether they are steps or epochs
    batch_size: int = 128
    lr: float = 1e-3
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        for name in ("latent_dim", "steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"vae {name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ConfigError(f"the VAE's lr must be positive, got {self.lr}")


def fit_vae(images: Tensor, config: VaeConfig, progress: Progress | None = None) -> tuple[VAE, dict]:
    """A VAE fitted to `images` in their own value range (their least and greatest pixel); its report gives the
    final negative ELBO per image (nats), the range and the wall time."""
    if len(images) < 2:
        raise ConfigError("a VAE needs at least two images to fit")
    device = torch.device(config.device)
    torch.manual_seed(config.seed)
    vae = VAE(tuple(images.shape[1:]), config.latent_dim, value_range=(images.min().item(), images.max().item()))
    vae = vae.to(device)
    optimizer = torch.optim.Adam(vae.parameters(), lr=config.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / config.steps)
    images, started, smoothed = images.to(device), time.perf_counter(), None
    vae.train()
    for step in range(1, config.steps + 1):
        loss = vae.loss(images[torch.randint(len(images), (config.batch_size,), device=device)])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        smoothed = loss.item() if smoothed is None else 0.98 * smoothed + 0.02 * loss.item()
        if progress:  # every step, so that a display never sits still; the loss now and then (a logged line)
            shown = {"vae_loss": smoothed} if step % 500 == 0 or step == config.steps else {}
            progress({"phase": VAE_PHASE, "done": step, "total": config.steps, **shown})
    return vae.eval().requires_grad_(False), {"negative_elbo": smoothed, "value_range": [vae.low, vae.low + vae.span],
                                              "wall_seconds": time.perf_counter() - started}
