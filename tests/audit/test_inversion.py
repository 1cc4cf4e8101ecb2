"""Model inversion's measure: a reconstruction matches the class whose distinctive shape it carries."""

import torch

from dpdistill.audit.inversion import class_means, invert_classes, match


def test_reconstructions_equal_to_the_class_means_match_every_class_and_shuffled_ones_none():
    means = torch.randn(10, 1, 8, 8)
    share, correlation = match(means, means)
    assert share == 1.0 and correlation > 0.999
    shuffled = means[torch.roll(torch.arange(10), 1)]
    assert match(shuffled, means)[0] == 0.0


def test_class_means_average_each_classs_images():
    images, labels = torch.arange(8.0).view(4, 1, 1, 2), torch.tensor([0, 1, 0, 1])
    assert torch.equal(class_means(images, labels, 2), torch.tensor([[[[2.0, 3.0]]], [[[4.0, 5.0]]]]))


def test_inversion_reads_the_model_only_and_leaves_it_as_it_was():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))
    before = [p.detach().clone() for p in model.parameters()]
    images = invert_classes(model, (1, 8, 8), 3, steps=50)
    assert images.shape == (3, 1, 8, 8) and images.abs().max() <= 1
    assert model(images).argmax(1).tolist() == [0, 1, 2]  # each image is its class to the model
    assert all(torch.equal(a, b) and b.requires_grad for a, b in zip(before, model.parameters()))
