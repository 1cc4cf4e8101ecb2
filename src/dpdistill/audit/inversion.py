"""Model inversion, as the seeds evaluate their students (DPSD's Fig. 8, DP-DFD's Fig. 9): from the released
student alone, reconstruct a representative image of each class by gradient ascent on its logit.

What a reconstruction recovers is measured against the private data it must not reveal: what sets each class's
mean training image apart (the class mean minus the mean of all class means; the reconstructions likewise).
`class_match` is the share of classes whose reconstruction correlates best with its own class's (chance: one in
the number of classes); a student that learnt the data's shapes matches most, one at chance
accuracy matches few. A good match is not by itself a leak (a private student must learn what classes look like),
which is why the audit's bound comes from the canaries, not from here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

INVERSION_STEPS = 300
INVERSION_LR = 0.05
SMOOTHNESS = 1.0  # total-variation weight: shapes, not adversarial noise (on digits the non-private cnn's
SHRINKAGE = 0.3  # reconstructions match 3 to 9 of 10 classes over seeds 0-5); L2 weight towards grey


@dataclass(frozen=True)
class Inversion:
    images: Tensor  # (classes, C, H, W) in [-1, 1]
    class_match: float  # share of classes whose reconstruction correlates best with its own class's mean image
    correlation: float  # mean correlation of a reconstruction with its own class's mean image


def total_variation(images: Tensor) -> Tensor:
    return ((images[..., 1:, :] - images[..., :-1, :]).abs().mean()
            + (images[..., :, 1:] - images[..., :, :-1]).abs().mean())


def invert_classes(model: nn.Module, input_shape: tuple[int, ...], num_classes: int, steps: int = INVERSION_STEPS,
                   device: str = "cpu") -> Tensor:
    """One image per class maximising the model's probability of that class, smooth and close to grey: all
    classes at once, from the grey image (deterministic given the model)."""
    model = model.to(device).eval()
    flags = [parameter.requires_grad for parameter in model.parameters()]
    for parameter in model.parameters():
        parameter.requires_grad_(False)  # the image is learnt, the model only read
    latent = torch.zeros(num_classes, *input_shape, device=device, requires_grad=True)
    optimizer = torch.optim.Adam([latent], lr=INVERSION_LR)
    targets = torch.arange(num_classes, device=device)
    try:
        for _ in range(steps):
            images = torch.tanh(latent)
            loss = (F.cross_entropy(model(images), targets) + SMOOTHNESS * total_variation(images)
                    + SHRINKAGE * images.pow(2).mean())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        for parameter, flag in zip(model.parameters(), flags):
            parameter.requires_grad_(flag)
    return torch.tanh(latent).detach().cpu()


def class_means(images: Tensor, labels: Tensor, num_classes: int) -> Tensor:
    return torch.stack([images[labels == label].mean(0) for label in range(num_classes)])


def match(reconstructions: Tensor, means: Tensor) -> tuple[float, float]:
    """The share of reconstructions whose best-correlated class is their own, and their mean correlation with it
    (Pearson over pixels, each set taken relative to its own mean over classes)."""
    def centred(batch: Tensor) -> Tensor:
        flat = (batch - batch.mean(0)).flatten(1)
        flat = flat - flat.mean(1, keepdim=True)
        return flat / flat.norm(dim=1, keepdim=True).clamp_min(1e-12)

    correlations = centred(reconstructions) @ centred(means).T
    own = correlations.diagonal()
    return (float((correlations.argmax(1) == torch.arange(len(means))).float().mean()), float(own.mean()))


def invert(model: nn.Module, images: Tensor, labels: Tensor, num_classes: int, device: str = "cpu") -> Inversion:
    """Reconstruct each class from `model` and measure the reconstructions against the class means of the
    private `images`."""
    reconstructions = invert_classes(model, tuple(images.shape[1:]), num_classes, device=device)
    class_match, correlation = match(reconstructions, class_means(images, labels, num_classes))
    return Inversion(reconstructions, class_match, correlation)
