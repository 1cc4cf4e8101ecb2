"""Batched evaluation: the same outputs as one eval-mode pass, whatever the batch size, and the model's mode kept;
the Fréchet distance of the fidelity measure."""

import numpy as np
import pytest
import scipy.linalg
import torch
from torch import nn

from dpdistill.evaluation.fidelity import frechet_distance
from dpdistill.evaluation.metrics import accuracy, predict, probabilities


def _model_with_dropout() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 5))


def test_probabilities_are_one_eval_mode_softmax_pass_in_any_batching():
    model, images = _model_with_dropout(), torch.randn(37, 1, 4, 4)
    model.train()
    expected = torch.softmax(model.eval()(images), 1).detach()
    model.train()
    batched = probabilities(model, images, batch_size=8)  # 37 = 4 full batches and a partial one
    assert batched.shape == (37, 5)
    assert torch.allclose(batched, expected, atol=1e-6)  # no dropout: eval mode
    assert torch.allclose(batched.sum(1), torch.ones(37))
    assert model.training  # restored


def test_predictions_and_accuracy_follow_the_most_probable_class():
    model, images = _model_with_dropout(), torch.randn(20, 1, 4, 4)
    classes = probabilities(model, images).argmax(1)
    assert torch.equal(predict(model, images, batch_size=3), classes)
    labels = classes.clone()
    labels[:5] = (labels[:5] + 1) % 5  # five wrong on purpose
    assert accuracy(model, images, labels) == 0.75


def test_the_frechet_distance_is_the_gaussians_closed_form():
    rng = np.random.default_rng(0)
    first = rng.normal(size=(400, 6)) @ rng.normal(size=(6, 6))
    second = rng.normal(size=(300, 6)) * np.arange(1, 7) + 0.5
    cov_first, cov_second = np.cov(first, rowvar=False), np.cov(second, rowvar=False)
    expected = (((first.mean(0) - second.mean(0)) ** 2).sum()
                + np.trace(cov_first + cov_second - 2 * scipy.linalg.sqrtm(cov_first @ cov_second).real))
    assert frechet_distance(first, second) == pytest.approx(expected, rel=1e-10)
    assert frechet_distance(first, first) == pytest.approx(0.0, abs=1e-9)
    # a set and its copy shifted by (1, ..., 1): the covariances agree, the means are six unit steps apart
    assert frechet_distance(first, first + 1) == pytest.approx(6.0, rel=1e-9)
