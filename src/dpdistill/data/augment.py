"""Label-preserving augmentation of image batches (random translations and horizontal flips), and a strong
variant (also erased squares and contrast and brightness changes) for consistency training.

A data-free student sees only what the generator draws; small translations and flips of those samples widen
the region of input space the student learns the teacher's function on, at no cost in teacher queries.
Images are scaled to [-1, 1], so translations fill the uncovered border with -1 (black background).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

BACKGROUND = -1.0


def shift_and_flip(images: Tensor, max_shift: int, flip: bool) -> Tensor:
    """Each image translated by its own random offset in [-max_shift, max_shift]^2 and, with `flip`, mirrored
    left-right with probability 1/2. Draws from torch's global random stream (saved with a run's checkpoint)."""
    if max_shift < 0:
        raise ValueError(f"max_shift must not be negative, got {max_shift}")
    count, channels, height, width = images.shape
    device = images.device
    if max_shift:
        padded = F.pad(images, (max_shift,) * 4, value=BACKGROUND)
        offsets = torch.randint(0, 2 * max_shift + 1, (2, count), device=device)
        rows = (offsets[0][:, None] + torch.arange(height, device=device))[:, None, :, None]
        columns = (offsets[1][:, None] + torch.arange(width, device=device))[:, None, None, :]
        batch = torch.arange(count, device=device)[:, None, None, None]
        channel = torch.arange(channels, device=device)[None, :, None, None]
        images = padded[batch, channel, rows, columns]
    if flip:
        mirrored = torch.rand(count, device=device) < 0.5
        images = torch.where(mirrored[:, None, None, None], images.flip(3), images)
    return images


def strong_augment(images: Tensor, max_shift: int | None = None, erase: int | None = None, contrast: float = 0.4,
                   brightness: float = 0.2) -> Tensor:
    """A much harder view of each image: shifted by up to `max_shift` (default a seventh of the width: 4 pixels
    at 28), mirrored half the time, an `erase` x `erase` square around a random pixel set to background (Cutout;
    default 0.4 of the width: 11 at 28; 0: none), contrast scaled by a factor in [1 - contrast, 1 + contrast] about
    black and brightness moved by up to `brightness`, then clamped to [-1, 1]. Consistency training asks the
    student to give this view the class it gives an easy one, which it can only do by learning what the classes
    look like. Draws from torch's global random stream."""
    count, _, height, width = images.shape
    max_shift = max(1, round(width / 7)) if max_shift is None else max_shift
    erase = round(0.4 * width) | 1 if erase is None else erase
    images = shift_and_flip(images, max_shift, flip=True)
    device = images.device
    if erase:
        inside = []
        for size in (height, width):  # per image, the rows (then columns) of a square around a random pixel
            start = torch.randint(0, size, (count, 1), device=device) - erase // 2
            offsets = torch.arange(size, device=device) - start
            inside.append((offsets >= 0) & (offsets < erase))
        images = images.masked_fill((inside[0][:, :, None] & inside[1][:, None, :])[:, None], BACKGROUND)
    scale = 1 + contrast * (2 * torch.rand(count, 1, 1, 1, device=device) - 1)
    offset = brightness * (2 * torch.rand(count, 1, 1, 1, device=device) - 1)
    return ((images - BACKGROUND) * scale + BACKGROUND + offset).clamp(-1, 1)
