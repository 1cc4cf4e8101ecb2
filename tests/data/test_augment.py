"""Augmentation of synthetic batches: translations fill with background, flips mirror, shapes are kept."""

import pytest
import torch

from dpdistill.data.augment import BACKGROUND, shift_and_flip, strong_augment


def _dots(count: int, size: int = 9) -> torch.Tensor:
    images = torch.full((count, 1, size, size), BACKGROUND)
    images[:, :, size // 2, size // 2] = 1.0  # one bright pixel in the centre
    return images


def test_shifts_move_the_content_by_at_most_the_bound_and_fill_with_background():
    torch.manual_seed(0)
    shifted = shift_and_flip(_dots(500), max_shift=2, flip=False)
    assert shifted.shape == (500, 1, 9, 9)
    positions = (shifted[:, 0] == 1.0).flatten(1).float().argmax(1)
    rows, columns = positions // 9 - 4, positions % 9 - 4
    assert rows.abs().max() == 2 and columns.abs().max() == 2  # every offset up to the bound occurs
    assert set(rows.tolist()) == {-2, -1, 0, 1, 2}
    assert torch.all((shifted == 1.0).sum(dim=(1, 2, 3)) == 1)  # nothing but background comes in


def test_flips_mirror_about_half_of_the_images_and_zero_shift_changes_nothing():
    torch.manual_seed(0)
    images = torch.randn(2000, 3, 5, 5)
    assert torch.equal(shift_and_flip(images, 0, False), images)
    flipped = shift_and_flip(images, 0, True)
    mirrored = torch.all((flipped == images.flip(3)).flatten(1), dim=1)
    kept = torch.all((flipped == images).flatten(1), dim=1)
    assert torch.all(mirrored ^ kept)
    assert 0.45 < mirrored.float().mean() < 0.55


def test_a_negative_shift_is_refused():
    with pytest.raises(ValueError):
        shift_and_flip(_dots(1), -1, False)


def test_the_strong_view_erases_one_square_and_keeps_the_range():
    torch.manual_seed(0)
    bright = torch.ones(2000, 1, 28, 28)
    erased = (strong_augment(bright, max_shift=0, contrast=0, brightness=0) == BACKGROUND).flatten(1).sum(1)
    assert erased.max() == 11 * 11 and erased.min() >= 6 * 6  # an 11-pixel square, clipped at the borders
    whole = (erased == 121).float().mean()  # centres 5 to 22 of 28 on both axes keep it whole
    assert abs(whole - (18 / 28) ** 2) < 0.04
    views = strong_augment(torch.randn(500, 1, 28, 28).clamp(-1, 1))
    assert views.shape == (500, 1, 28, 28) and views.min() >= -1 and views.max() <= 1


def test_the_strong_view_moves_brightness_uniformly_within_its_bound():
    torch.manual_seed(0)
    grey = strong_augment(torch.zeros(4000, 1, 8, 8), max_shift=0, erase=0, contrast=0, brightness=0.2)
    offsets = grey[:, 0, 0, 0]
    assert torch.all(grey == offsets[:, None, None, None])  # one offset per image
    assert offsets.abs().max() <= 0.2 and abs(offsets.std() - 0.2 / 3 ** 0.5) < 0.01  # uniform on [-0.2, 0.2]
