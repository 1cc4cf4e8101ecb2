"""Label-preserving augmentation of image batches (random translations and horizontal flips).

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
