"""Offline LiRA (Carlini et al. 2022, "Membership Inference Attacks From First Principles"), as a canary score.

Shadow models are trained without privacy on random halves of the private data with every canary left out; for
each canary they give the distribution of its logit-scaled confidence on the wrong label when it was NOT
trained on (a Gaussian per canary). The score is how far above that distribution the released student puts it:
(phi - mu) / sigma, the one-sided likelihood-ratio test of the offline attack. It calibrates each canary's own
difficulty, which the plain loss score cannot, at the cost of training the shadows.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import Tensor, nn

from dpdistill.audit.canaries import Canaries, label_log_probabilities
from dpdistill.data.base import ImageDataset
from dpdistill.progress import Progress
from dpdistill.training.teacher import TeacherConfig, train_classifier

STD_FLOOR = 1e-3  # a canary every shadow scores alike must not divide by zero


def logit_confidence(model: nn.Module, images: Tensor, labels: Tensor, device: str = "cpu") -> np.ndarray:
    """log p / (1 - p) of each label."""
    own, others = label_log_probabilities(model, images, labels, device)
    return (own - others).numpy()


def offline_lira(target: np.ndarray, shadows: np.ndarray) -> np.ndarray:
    """The score of each canary (higher: more likely trained on) from its confidence under the released model and
    under K shadow models that never saw it (shape (K, canaries), K >= 2): its own mean, and one spread pooled over
    the canaries (the paper's fixed-variance variant, steadier than a per-canary spread from a few shadows)."""
    mean, std = shadows.mean(0), np.sqrt(shadows.var(0, ddof=1).mean())
    return (target - mean) / max(std, STD_FLOOR)


def shadow_confidences(dataset: ImageDataset, canaries: Canaries, config: TeacherConfig, shadows: int,
                       progress: Progress | None = None) -> np.ndarray:
    """K shadow models of `config`, each on a random half of the training split without the canaries' examples
    (fixed by `config.seed`: the shadows are the auditor's, not a mechanism's noise); their confidences on the
    canaries' wrong labels, (K, canaries)."""
    keep = torch.ones(len(dataset.y_train), dtype=torch.bool)
    keep[canaries.indices] = False
    population = keep.nonzero().squeeze(1)
    generator = torch.Generator().manual_seed(config.seed)
    rows = []
    for shadow in range(shadows):
        half = population[torch.randperm(len(population), generator=generator)[:len(population) // 2]]
        data = dataclasses.replace(dataset, x_train=dataset.x_train[half], y_train=dataset.y_train[half],
                                   ids_train=dataset.ids_train[half])
        model, _ = train_classifier(data, dataclasses.replace(config, seed=config.seed + shadow), None,
                                    evaluate_each_epoch=False)
        rows.append(logit_confidence(model, canaries.images, canaries.labels, config.device))
        if progress:
            progress({"step": shadow + 1, "total": shadows})
    return np.stack(rows)
