"""Consistency training (FixMatch, Sohn et al. 2020): a classifier from few labels and many unlabelled images.

Each step the classifier learns the labelled images' labels and, for every unlabelled image it already classifies
with probability at least `threshold` on an easy view (shifted and mirrored), to give the same class to a hard view
of it (`strong_augment`). The unlabelled images shape the decision boundaries; the labels only name the clusters.
Used where a few hundred noisy answers are all a student may learn from (PATE): the unlabelled images are public,
so this is post-processing and costs no privacy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from dpdistill.data.augment import shift_and_flip, strong_augment
from dpdistill.errors import ConfigError
from dpdistill.evaluation.metrics import accuracy
from dpdistill.models.base import Classifier
from dpdistill.training.teacher import fresh_classifier


@dataclass(frozen=True)
class ConsistencyConfig:
    arch: str = "cnn"
    steps: int = 3000
    batch_size: int = 64  # labelled images per step
    unlabelled_ratio: int = 3  # unlabelled images per labelled one in each step
    threshold: float = 0.95  # the classifier's probability on the easy view needed to train the hard view
    weight: float = 1.0  # of the unlabelled term against the labelled one
    lr: float = 1e-3
    augment_shift: int = 2  # the easy view's shift
    init: str | None = None  # start from this pretrained encoder (`dpdistill pretrain`), not random weights
    seed: int = 0
    device: str = "cpu"
    report_every: int = 500  # steps between progress records

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "unlabelled_ratio", "report_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not 0 < self.threshold <= 1:
            raise ConfigError(f"the consistency threshold must be in (0, 1], got {self.threshold}")
        if self.weight < 0 or not self.lr > 0:
            raise ConfigError(f"the consistency weight must not be negative and lr must be positive, got "
                              f"{self.weight} and {self.lr}")


def train_consistency(images: Tensor, labels: Tensor, unlabelled: Tensor, x_test: Tensor, y_test: Tensor,
                      num_classes: int, config: ConsistencyConfig,
                      progress: Callable[[dict], None] | None = None) -> tuple[Classifier, dict]:
    """Train `config.arch` (Adam, cosine decay) on labelled `images` and `unlabelled` ones; report test accuracy
    and how many unlabelled images passed the threshold in the last steps (the share it trusts itself on).
    `labels` are class indices (n,) or class probabilities (n, classes) (soft targets)."""
    if not len(labels):
        raise ConfigError("consistency training needs at least one labelled image")
    device = torch.device(config.device)
    model, optimizer, schedule = fresh_classifier(config.arch, tuple(images.shape[1:]), num_classes, config.lr,
                                                  config.steps, config.seed, device, config.init)
    images, labels, unlabelled = images.to(device), labels.to(device), unlabelled.to(device)
    labelled_count, unlabelled_count = config.batch_size, config.batch_size * config.unlabelled_ratio
    started, confident_share, history = time.perf_counter(), 0.0, []
    model.train()
    for step in range(1, config.steps + 1):
        chosen = torch.randint(len(labels), (labelled_count,), device=device)
        pool = unlabelled[torch.randint(len(unlabelled), (unlabelled_count,), device=device)]
        batch = torch.cat([shift_and_flip(images[chosen], config.augment_shift, flip=True),
                           shift_and_flip(pool, config.augment_shift, flip=True), strong_augment(pool)])
        logits = model(batch)  # one pass, so BatchNorm sees labelled and unlabelled images together
        labelled_logits, easy, hard = logits.split([labelled_count, unlabelled_count, unlabelled_count])
        confidence, guesses = F.softmax(easy.detach(), 1).max(1)
        trusted = (confidence >= config.threshold).float()
        loss = F.cross_entropy(labelled_logits, labels[chosen]) + config.weight * (
            F.cross_entropy(hard, guesses, reduction="none") * trusted).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        confident_share = 0.9 * confident_share + 0.1 * trusted.mean().item() if step > 1 else trusted.mean().item()
        if step % config.report_every == 0 or step == config.steps:
            record = {"step": step, "train_loss": loss.item(), "confident_share": confident_share}
            history.append(record)
            if progress:
                progress(record)
    report = {"test_accuracy": accuracy(model.eval(), x_test, y_test, device=device), "history": history,
              "confident_share": confident_share, "wall_seconds": time.perf_counter() - started}
    return model, report
