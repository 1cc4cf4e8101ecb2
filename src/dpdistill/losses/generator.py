"""Generator objectives of data-free distillation (DAFL family), each a scalar to minimise.

A generator learns from a classifier used as a multi-class discriminator: images it labels confidently
(one-hot term), balanced over the classes (information entropy), that excite its features the way real images
do (activation term, or the BatchNorm-statistics term where the discriminator has BatchNorm).
"""

from __future__ import annotations

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
    """Negative mean feature norm (L2 in DPSD/DPDFD, L1 in DGD): real images excite features strongly."""
    return -features.norm(p=norm, dim=1).mean()


class BatchNormStatistics:
    """Collects, during a discriminator forward pass, how far each BatchNorm layer's batch statistics are
    from its running statistics (DP-DFD's term); the sum is the loss. Use as a context manager."""

    def __init__(self, model: nn.Module, enabled: bool = True) -> None:
        self._layers = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)] if enabled else []
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self.terms: list[Tensor] = []

    def _hook(self, module: nn.BatchNorm2d, inputs: tuple[Tensor, ...], _output: Tensor) -> None:
        x = inputs[0]
        mean = x.mean(dim=(0, 2, 3))
        var = x.var(dim=(0, 2, 3), unbiased=False)
        self.terms.append((mean - module.running_mean).norm() + (var - module.running_var).norm())

    def __enter__(self) -> "BatchNormStatistics":
        self.terms = []
        self._handles = [layer.register_forward_hook(self._hook) for layer in self._layers]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()

    def loss(self) -> Tensor:
        if not self.terms:
            raise ValueError("the discriminator has no BatchNorm2d layer: the BatchNorm-statistics term is undefined")
        return torch.stack(self.terms).sum()
