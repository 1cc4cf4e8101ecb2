"""A synthetic set's balanced draw: each class its share of the labeller's argmax, and a bounded search for a class
the generator rarely draws."""

import torch

from dpdistill.methods.synthetic import balanced_draw


def test_each_class_gets_its_share_and_a_missing_class_ends_short_after_bounded_draws():
    calls = []

    def generate(count: int) -> torch.Tensor:
        calls.append(count)
        return torch.rand(count, 1, 2, 2)

    def label(images: torch.Tensor) -> torch.Tensor:  # never class 3: its draws go to class 0
        values = (images.flatten(1)[:, 0] * 10).long().clamp(max=9)
        return torch.where(values == 3, torch.zeros_like(values), values)

    images, labels = balanced_draw(generate, label, 103, 10, batch=64)
    counts = torch.bincount(labels, minlength=10).tolist()
    assert counts == [11, 11, 11, 0, 10, 10, 10, 10, 10, 10]  # 103 = 3 classes of 11, 7 of 10; class 3 never drawn
    assert len(calls) == 33  # 20 draws an image: ceil(20 * 103 / 64) batches, then it stops
    assert torch.equal(label(images), labels)
    assert balanced_draw(generate, label, 103, 10, batch=64, max_batches=5)[1].numel() < 103


def test_a_draw_that_fills_every_share_keeps_each_image_beside_its_label():
    def generate(count: int) -> torch.Tensor:
        return torch.rand(count, 1, 2, 2)

    def label(images: torch.Tensor) -> torch.Tensor:
        return (images.flatten(1)[:, 0] * 10).long().clamp(max=9)

    images, labels = balanced_draw(generate, label, 50, 10, batch=16)
    assert torch.bincount(labels, minlength=10).tolist() == [5] * 10 and images.shape == (50, 1, 2, 2)
    assert torch.equal(label(images), labels)  # the classes' slots in order, each filled over several batches
