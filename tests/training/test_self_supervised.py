"""Contrastive pretraining: the loss is NT-Xent exactly, training lowers it, and the encoder is a better start."""

import math

import pytest
import torch

from dpdistill.data import load_dataset
from dpdistill.errors import ConfigError
from dpdistill.models.registry import build_classifier
from dpdistill.training.self_supervised import ContrastiveConfig, contrastive_loss, pretrain_contrastive


def test_loss_is_nt_xent_on_a_known_geometry():
    # Twins identical, all pairs orthogonal: each row's twin scores 1 / T, its 2N - 2 other candidates 0.
    count, temperature = 4, 0.5
    embeddings = torch.eye(count) * 3  # normalisation must remove the scale
    expected = -math.log(math.exp(1 / temperature) / (math.exp(1 / temperature) + 2 * count - 2))
    assert contrastive_loss(embeddings, embeddings, temperature).item() == pytest.approx(expected, rel=1e-6)
    # Twins swapped with strangers: the loss must be much larger than with the true twins.
    assert contrastive_loss(embeddings, embeddings.roll(1, 0), temperature).item() > expected + 1


def test_pretraining_lowers_the_loss_and_leaves_the_head_as_built():
    digits = load_dataset("digits")
    config = ContrastiveConfig(steps=60, batch_size=64, report_every=20)
    records: list[dict] = []
    encoder, report = pretrain_contrastive(digits.x_train, 10, config, progress=records.append)
    losses = [record["loss"] for record in report["history"]]
    assert [record["step"] for record in report["history"]] == [20, 40, 60]
    assert [record["step"] for record in records] == list(range(1, 61))  # a display moves every step
    assert losses[-1] < losses[0] - 0.3, losses
    torch.manual_seed(config.seed)
    built = build_classifier("cnn", digits.input_shape, 10)
    assert torch.equal(encoder.head.weight, built.head.weight)  # the head is never trained
    assert not torch.equal(encoder.backbone[0].weight, built.backbone[0].weight)


@pytest.mark.parametrize("values, message", [
    ({"steps": 0}, "steps must be at least 1"),
    ({"batch_size": 1}, "at least 2 images a batch"),
    ({"temperature": 0}, "temperature and lr must be positive"),
])
def test_impossible_settings_are_refused(values, message):
    with pytest.raises(ConfigError, match=message):
        ContrastiveConfig(**values)


def test_one_image_is_refused():
    digits = load_dataset("digits")
    with pytest.raises(ConfigError, match="at least 2 public images"):
        pretrain_contrastive(digits.x_train[:1], 10, ContrastiveConfig(steps=1))
