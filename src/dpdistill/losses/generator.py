"""Generator objectives of data-free distillation (DAFL family), each a scalar to minimise.

A generator learns from a classifier used as a multi-class discriminator: images it labels confidently
(one-hot term), balanced over the classes (information entropy), that excite its features the way real images
do (activation term, or the BatchNorm-statistics term where the discriminator has BatchNorm), and that look like
each class's images, blurred (the class-statistics term, against a DP release of them).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def one_hot_loss(logits: Tensor) -> Tensor:
    """Cross-entropy of the discriminator against its own argmax: rewards confident predictions."""
    return F.cross_entropy(logits, logits.argmax(dim=1))


def information_entropy_loss(logits: Tensor) -> Tensor:
    """sum_j pbar_j log pbar_j of the batch-mean prediction: minimal when generated classes are balanced."""
    mean_probability = F.softmax(logits, dim=1).mean(dim=0)
    return (mean_probability * torch.log(mean_probability + 1e-8)).sum()


def activation_loss(features: Tensor, norm: int = 2) -> Tensor:
    """Real images excite features strongly: the negative mean L2 norm of the features (DPSD/DPDFD), or with norm 1
    DAFL's and DGD's negative mean absolute activation (the L1 norm over the feature count, so that the term stays
    on the scale of the others whatever the width)."""
    if norm == 1:
        return -features.abs().mean()
    return -features.norm(p=norm, dim=1).mean()


def total_variation(images: Tensor) -> Tensor:
    """Mean absolute difference between neighbouring pixels: small for smooth images, a prior on natural images
    that needs no data (DeepInversion's image prior); the generator's only one where the discriminator has no
    BatchNorm statistics to match."""
    return ((images[..., 1:, :] - images[..., :-1, :]).abs().mean()
            + (images[..., :, 1:] - images[..., :, :-1]).abs().mean())


def data_free_terms(logits: Tensor, features: Tensor, one_hot_weight: float, entropy_weight: float,
                    activation_weight: float, activation_norm: int = 2) -> dict[str, Tensor]:
    """DAFL's weighted terms for a generator whose images a fixed classifier sees as `features` and `logits`."""
    return {"one_hot": one_hot_weight * one_hot_loss(logits),
            "entropy": entropy_weight * information_entropy_loss(logits),
            "activation": activation_weight * activation_loss(features, activation_norm)}


class FeatureStatistics:
    """Collects, during a forward pass, how far the batch statistics (per-channel mean and variance) of chosen
    layers' inputs are from target ones; the sum is the loss (DeepInversion's and DP-DFD's term). The targets are a
    BatchNorm layer's running statistics (`of_batchnorm`) or a DP release of them (training/feature_statistics.py).
    Use as a context manager."""

    def __init__(self, targets: dict[nn.Module, tuple[Tensor, Tensor]]) -> None:
        self.targets = targets
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self.terms: list[Tensor] = []

    @classmethod
    def of_batchnorm(cls, model: nn.Module, enabled: bool = True) -> "FeatureStatistics":
        """Against the running statistics of `model`'s BatchNorm layers (none where not `enabled`)."""
        layers = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)] if enabled else []
        return cls({layer: (layer.running_mean, layer.running_var) for layer in layers})

    @property
    def layers(self) -> list[nn.Module]:
        return list(self.targets)

    def _hook(self, module: nn.Module, inputs: tuple[Tensor, ...], _output: Tensor) -> None:
        x = inputs[0]
        mean, var = self.targets[module]
        self.terms.append((x.mean(dim=(0, 2, 3)) - mean).norm() + (x.var(dim=(0, 2, 3), unbiased=False) - var).norm())

    def __enter__(self) -> "FeatureStatistics":
        self.terms = []
        self._handles = [layer.register_forward_hook(self._hook) for layer in self.targets]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()

    def loss(self) -> Tensor:
        if not self.terms:
            raise ValueError("no layer with target statistics ran: the feature-statistics term is undefined")
        return torch.stack(self.terms).sum()


def image_cells(images: Tensor, resolution: int) -> Tensor:
    """(n, C R R): images mapped from [-1, 1] to [0, 1] and averaged over R x R cells: their coarse form."""
    return F.adaptive_avg_pool2d((images + 1) / 2, resolution).flatten(1)


def per_class_distance(features: Tensor, classes: Tensor, distance: Callable[[Tensor, int], Tensor]) -> Tensor:
    """The sum over the classes present at least twice of `distance(their features, class)`, each weighted by its
    share of the batch (0 when none is)."""
    terms = [(classes == label).float().mean() * distance(chosen, label) for label in classes.unique().tolist()
             if len(chosen := features[classes == label]) > 1]
    return torch.stack(terms).sum() if terms else features.new_zeros(())


class ClassCellStatistics:
    """How far each class's generated images are, at R x R cells, from that class's cell means and variances
    (`mean`, `var`: (classes, C R R)). A generated image's class is the one its reader (the teacher) names; each
    class present at least twice counts in proportion to its share of the batch."""

    def __init__(self, mean: Tensor, var: Tensor, resolution: int) -> None:
        self.mean, self.var, self.resolution = mean, var, resolution

    def loss(self, images: Tensor, classes: Tensor) -> Tensor:
        return per_class_distance(image_cells(images, self.resolution), classes, lambda chosen, label: (
            (chosen.mean(0) - self.mean[label]).norm() + (chosen.var(0, unbiased=False) - self.var[label]).norm()))
