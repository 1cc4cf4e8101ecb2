"""Consistency training: a classifier from few labels and many unlabelled images, with one of two regularisers.

- "fixmatch" (Sohn et al. 2020): each step the classifier learns the labelled images' labels and, for every
  unlabelled image it already classifies with probability at least `threshold` on an easy view (shifted and
  mirrored), to give the same class to a hard view of it (`strong_augment`).
- "tangent-normal" (DGD, seed 004; Yu et al. 2019): a VAE is fitted to the unlabelled images (training/vae.py),
  each is reconstructed as a triple (its reconstruction, a step along the VAE's manifold, a step across it:
  losses/tangent_normal.py), and the classifier's features should not move within a triple while its predictions
  on the reconstructions grow confident.
The unlabelled images shape the decision boundaries; the labels only name the clusters. Used where a few hundred
noisy answers are all a student may learn from (PATE, DGD): the unlabelled images are public or a covered release,
so this is post-processing and costs no privacy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from dpdistill.data.augment import shift_and_flip, strong_augment
from dpdistill.errors import ConfigError
from dpdistill.evaluation.metrics import accuracy
from dpdistill.losses.tangent_normal import FEATURE_DISTANCES, tangent_normal_loss, tangent_normal_views
from dpdistill.models.base import Classifier
from dpdistill.progress import Progress
from dpdistill.training.teacher import SCHEDULES, fresh_classifier
from dpdistill.training.vae import VaeConfig, fit_vae

REGULARIZERS = ("fixmatch", "tangent-normal")
TRIPLE_BATCH = 256  # images reconstructed at once when the triples are made
VIEWS_PHASE = "manifold views"  # a progress display's name for making the triples


@dataclass(frozen=True)
class ConsistencyConfig:
    arch: str = "cnn"
    steps: int = 3000
    batch_size: int = 64  # labelled images per step
    unlabelled_ratio: int = 3  # unlabelled images per labelled one in each step
    regularizer: str = "fixmatch"  # or "tangent-normal"
    threshold: float = 0.95  # fixmatch: the probability on the easy view needed to train the hard view
    weight: float = 1.0  # of the unlabelled term against the labelled one
    tangent_radius: float = 1.0  # tangent-normal: the step along the manifold, L2 in the VAE's code
    normal_radius: float = 0.1  # tangent-normal: the step across it, root mean square per pixel
    entropy_weight: float = 1.0  # tangent-normal: of the predictions' entropy on the reconstructions
    vae: VaeConfig = VaeConfig()
    lr: float = 1e-3
    schedule: str = "cosine"  # the learning rate's decay to zero: cosine, or linear (DGD's student)
    feature_distance: str = "normalized"  # tangent-normal: squared distances between L2-normalised features, the
    # reconstruction's a fixed target, or "raw" (DGD's Eq. 6 as written: the features themselves, all three learning)
    augment_shift: int = 2  # the easy view's shift
    init: str | None = None  # start from this pretrained encoder (`dpdistill pretrain`), not random weights
    seed: int = 0
    device: str = "cpu"
    report_every: int = 500  # steps between the history's figures (a progress record comes every step)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "unlabelled_ratio", "report_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not 0 < self.threshold <= 1:
            raise ConfigError(f"the consistency threshold must be in (0, 1], got {self.threshold}")
        if self.regularizer not in REGULARIZERS:
            raise ConfigError(f"unknown consistency regularizer {self.regularizer!r}; choose one of "
                              f"{', '.join(REGULARIZERS)}")
        if min(self.tangent_radius, self.normal_radius, self.entropy_weight) < 0:
            raise ConfigError("the tangent and normal radii and the entropy weight must not be negative")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"unknown learning-rate schedule {self.schedule!r}; choose {' or '.join(SCHEDULES)}")
        if self.feature_distance not in FEATURE_DISTANCES:
            raise ConfigError(f"unknown feature distance {self.feature_distance!r}; choose "
                              f"{' or '.join(FEATURE_DISTANCES)}")
        if self.feature_distance != "normalized" and self.regularizer != "tangent-normal":
            raise ConfigError(f"feature-distance {self.feature_distance} applies to tangent-normal training, not "
                              f"{self.regularizer}")
        if self.weight < 0 or not self.lr > 0:
            raise ConfigError(f"the consistency weight must not be negative and lr must be positive, got "
                              f"{self.weight} and {self.lr}")


def manifold_triples(unlabelled: Tensor, config: ConsistencyConfig, progress: Progress | None = None
                     ) -> tuple[Tensor, dict]:
    """(3, n, ...): each unlabelled image's reconstruction, tangent and normal neighbours, from a VAE fitted to the
    unlabelled images (made once: the VAE stays fixed while the classifier learns), and the VAE's report."""
    vae, report = fit_vae(unlabelled, config.vae, progress)
    torch.manual_seed(config.seed)
    triples = []
    for batch in unlabelled.split(TRIPLE_BATCH):  # minutes for 60,000 images: a display counts them
        triples.append(torch.stack(tangent_normal_views(vae, batch.to(config.vae.device), config.tangent_radius,
                                                        config.normal_radius)).cpu())
        if progress:
            progress({"phase": VIEWS_PHASE, "done": min(len(triples) * TRIPLE_BATCH, len(unlabelled)),
                      "total": len(unlabelled)})
    return torch.cat(triples, dim=1), report


def train_consistency(images: Tensor, labels: Tensor, unlabelled: Tensor, x_test: Tensor, y_test: Tensor,
                      num_classes: int, config: ConsistencyConfig,
                      progress: Progress | None = None, triples: Tensor | None = None
                      ) -> tuple[Classifier, dict]:
    """Train `config.arch` (Adam, cosine decay) on labelled `images` and `unlabelled` ones; report test accuracy
    and, for fixmatch, how many unlabelled images passed the threshold in the last steps (the share it trusts
    itself on). `labels` are class indices (n,) or class probabilities (n, classes) (soft targets). The
    tangent-normal regulariser uses `triples` (`manifold_triples` of `unlabelled`), made here if not given. At
    weight 0 the labelled images alone are trained on."""
    if not len(labels):
        raise ConfigError("consistency training needs at least one labelled image")
    device = torch.device(config.device)
    labels_alone = config.weight == 0  # the unlabelled images would only move BatchNorm's statistics
    fixmatch = config.regularizer == "fixmatch" and not labels_alone
    tangent_normal = config.regularizer == "tangent-normal" and not labels_alone
    vae_report = None
    if tangent_normal and triples is None:
        triples, vae_report = manifold_triples(unlabelled, config, progress)
    model, optimizer, schedule = fresh_classifier(config.arch, tuple(images.shape[1:]), num_classes, config.lr,
                                                  config.steps, config.seed, device, config.init, config.schedule)
    images, labels, unlabelled = images.to(device), labels.to(device), unlabelled.to(device)
    triples = triples.to(device) if tangent_normal else None
    labelled_count, unlabelled_count = config.batch_size, config.batch_size * config.unlabelled_ratio
    started, confident_share, history = time.perf_counter(), 0.0, []
    model.train()
    for step in range(1, config.steps + 1):
        chosen = torch.randint(len(labels), (labelled_count,), device=device)
        drawn = torch.randint(len(unlabelled), (unlabelled_count,), device=device)
        labelled_view = shift_and_flip(images[chosen], config.augment_shift, flip=True)
        if labels_alone:
            labelled_logits, unlabelled_term = model(labelled_view), torch.zeros((), device=device)
        elif fixmatch:
            pool = unlabelled[drawn]
            logits = model(torch.cat([labelled_view, shift_and_flip(pool, config.augment_shift, flip=True),
                                      strong_augment(pool)]))  # one pass: BatchNorm sees all images together
            labelled_logits, easy, hard = logits.split([labelled_count, unlabelled_count, unlabelled_count])
            confidence, guesses = F.softmax(easy.detach(), 1).max(1)
            trusted = (confidence >= config.threshold).float()
            unlabelled_term = (F.cross_entropy(hard, guesses, reduction="none") * trusted).mean()
            confident_share = (0.9 * confident_share + 0.1 * trusted.mean().item() if step > 1
                               else trusted.mean().item())
        else:  # one pass, so BatchNorm sees all images together
            features = model.features(torch.cat([labelled_view, *triples[:, drawn]]))
            labelled_features, triple_features = features.split([labelled_count, 3 * unlabelled_count])
            labelled_logits = model.classify(labelled_features)
            centre_logits = model.classify(triple_features[:unlabelled_count])
            unlabelled_term = tangent_normal_loss(triple_features, centre_logits, config.entropy_weight,
                                                  config.feature_distance == "raw")
        loss = F.cross_entropy(labelled_logits, labels[chosen]) + config.weight * unlabelled_term
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        record = {"step": step}  # every step, so that a display never sits still; figures now and then
        if step % config.report_every == 0 or step == config.steps:
            record["train_loss"] = loss.item()
            if fixmatch:
                record["confident_share"] = confident_share
            history.append(record)
        if progress:
            progress(record)
    report = {"test_accuracy": accuracy(model.eval(), x_test, y_test, device=device), "history": history,
              "wall_seconds": time.perf_counter() - started}
    if fixmatch:
        report["confident_share"] = confident_share
    if vae_report is not None:
        report["vae"] = vae_report
    return model, report
