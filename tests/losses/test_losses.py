"""Loss functions: zero where they should be, gradients that point the right way."""

import math

import pytest
import torch
import torch.nn.functional as F

from dpdistill.losses.distillation import dkd_loss, inverse_class_frequency, kd_loss, soft_cross_entropy
from dpdistill.losses.generator import (
    FeatureStatistics,
    activation_loss,
    information_entropy_loss,
    one_hot_loss,
)


def test_kd_and_dkd_vanish_when_student_equals_teacher():
    logits = torch.randn(8, 10)
    target = logits.argmax(1)
    assert torch.allclose(kd_loss(logits, logits), torch.zeros(8), atol=1e-6)
    assert torch.allclose(dkd_loss(logits, logits, target), torch.zeros(8), atol=1e-5)


def test_dkd_is_positive_and_its_gradient_moves_student_towards_teacher():
    teacher = torch.randn(16, 10) * 3
    student = torch.randn(16, 10, requires_grad=True)
    loss = dkd_loss(student, teacher, teacher.argmax(1))
    assert (loss > 0).all()
    (gradient,) = torch.autograd.grad(loss.sum(), student)
    stepped = student - 0.1 * gradient
    assert dkd_loss(stepped, teacher, teacher.argmax(1)).sum() < loss.sum()


def test_dkd_with_beta_one_alpha_one_differs_from_kd_only_by_decoupling():
    # DKD's identity: KD = TCKD + (1 - p_t_target) * NCKD. Check it numerically.
    teacher, student = torch.randn(32, 10), torch.randn(32, 10)
    target = teacher.argmax(1)
    tckd = dkd_loss(student, teacher, target, alpha=1.0, beta=0.0)
    nckd = dkd_loss(student, teacher, target, alpha=0.0, beta=1.0)
    p_target = F.softmax(teacher, 1).gather(1, target[:, None]).squeeze(1)
    assert torch.allclose(kd_loss(student, teacher), tckd + (1 - p_target) * nckd, atol=1e-4)


def test_soft_cross_entropy_equals_hard_cross_entropy_on_one_hot_targets():
    logits = torch.randn(5, 4)
    labels = torch.tensor([0, 3, 1, 2, 2])
    assert torch.allclose(soft_cross_entropy(logits, F.one_hot(labels, 4).float()),
                          F.cross_entropy(logits, labels, reduction="none"))


def test_information_entropy_is_minimal_for_balanced_classes():
    balanced = torch.eye(4) * 20
    collapsed = torch.zeros(4, 4)
    collapsed[:, 0] = 20
    assert information_entropy_loss(balanced).item() < information_entropy_loss(collapsed).item()
    assert information_entropy_loss(balanced).item() == pytest.approx(-math.log(4), abs=1e-3)


def test_one_hot_loss_prefers_confident_logits():
    assert one_hot_loss(torch.tensor([[10.0, 0.0]])) < one_hot_loss(torch.tensor([[0.1, 0.0]]))


def test_activation_loss_rewards_large_features():
    assert activation_loss(torch.ones(3, 5) * 4) < activation_loss(torch.ones(3, 5))
    assert activation_loss(torch.ones(1, 4) * 3).item() == -6.0  # L2 norm
    assert activation_loss(torch.tensor([[1.0, -3.0], [2.0, 2.0]]), norm=1).item() == -2.0  # DAFL: mean |f|


def test_batchnorm_statistics_are_zero_on_matching_data_and_hooks_are_removed():
    layer = torch.nn.BatchNorm2d(3)
    layer.eval()
    model = torch.nn.Sequential(layer)
    x = torch.randn(20_000, 3, 2, 2)
    layer.running_mean.copy_(x.mean((0, 2, 3)))
    layer.running_var.copy_(x.var((0, 2, 3), unbiased=False))
    with FeatureStatistics.of_batchnorm(model) as stats:
        model(x)
    assert stats.loss().item() < 1e-4
    with FeatureStatistics.of_batchnorm(model) as stats:
        model(x + 1)
    assert stats.loss().item() > 1.0
    assert not layer._forward_hooks


def test_inverse_class_frequency_gives_each_present_class_equal_total_weight():
    targets = F.one_hot(torch.tensor([0, 0, 0, 1, 2, 2]), 4).float()
    weights = inverse_class_frequency(targets)
    assert weights.mean().item() == pytest.approx(1.0)
    per_class = [weights[targets.argmax(1) == c].sum().item() for c in range(3)]
    assert per_class == pytest.approx([per_class[0]] * 3)
