"""Supervised training: the augmentation option reaches every batch, and only when asked for; a pretrained
encoder is the starting point only when it fits."""

import dataclasses
from pathlib import Path

import pytest
import torch

from dpdistill.data import load_dataset
from dpdistill.errors import CheckpointError, ConfigError
from dpdistill.models.checkpoint import ENCODER, load_classifier
from dpdistill.training import teacher
from dpdistill.training.teacher import TeacherConfig, fresh_classifier, train_classifier


@pytest.mark.parametrize("shift, expected_calls", [(0, 0), (2, 3)])
def test_augmentation_shifts_each_batch_when_asked(monkeypatch, shift, expected_calls):
    digits = load_dataset("digits")
    small = dataclasses.replace(digits, x_train=digits.x_train[:96], y_train=digits.y_train[:96])
    calls = []

    def counting(images, max_shift, flip):
        calls.append((max_shift, flip))
        return images

    monkeypatch.setattr(teacher, "shift_and_flip", counting)
    train_classifier(small, TeacherConfig(epochs=1, batch_size=32, augment_shift=shift), evaluate_each_epoch=False)
    assert calls == [(shift, False)] * expected_calls


def test_a_classifier_starts_from_the_encoder_it_is_given(digits_encoder: Path):
    encoder, _ = load_classifier(digits_encoder, ENCODER, kind="encoder")
    started, _, _ = fresh_classifier("cnn", (1, 8, 8), 10, 1e-3, 10, seed=3, device=torch.device("cpu"),
                                     init=str(digits_encoder))
    random, _, _ = fresh_classifier("cnn", (1, 8, 8), 10, 1e-3, 10, seed=3, device=torch.device("cpu"))
    for name, tensor in encoder.state_dict().items():
        assert torch.equal(started.state_dict()[name], tensor), name
    assert not torch.equal(random.backbone[0].weight, encoder.backbone[0].weight)


@pytest.mark.parametrize("arch, in_shape, classes", [("datalens", (1, 8, 8), 10), ("cnn", (1, 28, 28), 10),
                                                     ("cnn", (1, 8, 8), 3)])
def test_an_encoder_of_another_model_is_refused(digits_encoder: Path, arch, in_shape, classes):
    with pytest.raises(ConfigError, match="this training needs"):
        fresh_classifier(arch, in_shape, classes, 1e-3, 10, seed=0, device=torch.device("cpu"),
                         init=str(digits_encoder))


def test_a_trained_classifier_is_not_an_encoder(digits_teacher: Path, tmp_path: Path):
    for name in ("model.safetensors", "model.json"):
        (tmp_path / name.replace("model", ENCODER)).write_bytes((digits_teacher / name).read_bytes())
    with pytest.raises(CheckpointError, match="holds a classifier, not an encoder"):
        fresh_classifier("cnn", (1, 8, 8), 10, 1e-3, 10, seed=0, device=torch.device("cpu"), init=str(tmp_path))
