"""Contrastive pretraining on public, unlabelled images (SimCLR, Chen et al. 2020): a better starting point.

Each step draws a batch of images, makes two hard views of each (`strong_augment`), and trains the backbone,
through a small projection head, to pick every view's twin out of the batch (the NT-Xent loss). The backbone
learns what stays the same under shifts, mirroring, erasing and contrast changes: the shape of the object.

Where labels are scarce this helps: an ensemble's members each see a few hundred private images, PATE's student
a few hundred noisy answers. Both may start from such a backbone instead of random weights. The images are public
(PATE's own public pool), so the pretraining costs no privacy; the saved model is an "encoder": a classifier
whose head is untrained, which `init` options accept and commands that want a trained model refuse.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpdistill.data.augment import strong_augment
from dpdistill.errors import ConfigError
from dpdistill.models.base import Classifier
from dpdistill.models.registry import build_classifier
from dpdistill.progress import Progress


@dataclass(frozen=True)
class ContrastiveConfig:
    arch: str = "cnn"
    steps: int = 600
    batch_size: int = 256  # images per step, so 2 x batch_size views
    temperature: float = 0.2
    projection_dim: int = 64
    lr: float = 1e-3
    seed: int = 0
    device: str = "cpu"
    report_every: int = 100  # steps between the history's losses (a progress record comes every step)

    def __post_init__(self) -> None:
        for name in ("steps", "projection_dim", "report_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.batch_size < 2:
            raise ConfigError(f"contrastive pretraining needs at least 2 images a batch, got {self.batch_size}")
        if not self.temperature > 0 or not self.lr > 0:
            raise ConfigError(f"temperature and lr must be positive, got {self.temperature} and {self.lr}")


def contrastive_loss(first: Tensor, second: Tensor, temperature: float) -> Tensor:
    """NT-Xent: each of the 2N embeddings must find its twin (row i of the other view) among the 2N - 1 others,
    by cosine similarity over `temperature`."""
    embeddings = F.normalize(torch.cat([first, second]), dim=1)
    similarity = embeddings @ embeddings.T / temperature
    similarity.fill_diagonal_(float("-inf"))  # an embedding is not its own twin
    count = len(first)
    twins = torch.cat([torch.arange(count, 2 * count), torch.arange(count)]).to(similarity.device)
    return F.cross_entropy(similarity, twins)


def pretrain_contrastive(images: Tensor, num_classes: int, config: ContrastiveConfig,
                         progress: Progress | None = None) -> tuple[Classifier, dict]:
    """A `config.arch` classifier whose backbone is trained contrastively on `images` (its head stays as built);
    the report gives the loss history and wall time."""
    if len(images) < 2:
        raise ConfigError(f"contrastive pretraining needs at least 2 public images, got {len(images)}")
    device = torch.device(config.device)
    torch.manual_seed(config.seed)
    model = build_classifier(config.arch, tuple(images.shape[1:]), num_classes).to(device)
    with torch.no_grad():
        width = model.features(images[:2].to(device)).shape[1]
    projection = nn.Sequential(nn.Linear(width, 4 * config.projection_dim), nn.ReLU(),
                               nn.Linear(4 * config.projection_dim, config.projection_dim)).to(device)
    optimizer = torch.optim.Adam([*model.backbone.parameters(), *projection.parameters()], lr=config.lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config.steps)
    images = images.to(device)
    batch_size = min(config.batch_size, len(images))
    started, history = time.perf_counter(), []
    model.train()
    for step in range(1, config.steps + 1):
        batch = images[torch.randperm(len(images), device=device)[:batch_size]]  # distinct: no false negatives
        views = projection(model.features(torch.cat([strong_augment(batch), strong_augment(batch)])))
        loss = contrastive_loss(*views.chunk(2), config.temperature)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        record = {"step": step}  # every step, so that a display never sits still; the loss now and then
        if step % config.report_every == 0 or step == config.steps:
            record["loss"] = loss.item()
            history.append(record)
        if progress:
            progress(record)
    return model.eval(), {"history": history, "wall_seconds": time.perf_counter() - started}
