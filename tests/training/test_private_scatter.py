"""Scattering students in train-private: Tramer & Boneh's DP-SGD recipe by default, head-only training on fixed
features computed once, and a tiny run on digits that learns within its budget."""

import dataclasses
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dpdistill.data import load_dataset
from dpdistill.errors import ConfigError
from dpdistill.evaluation.metrics import accuracy
from dpdistill.models import build_classifier
from dpdistill.models.checkpoint import load_classifier
from dpdistill.pipeline import train_private
from dpdistill.models import features as features_module
from dpdistill.models.features import frozen_features
from dpdistill.privacy.selection import FASHION_MNIST, MNIST_SET
from dpdistill.training.private import PrivateTrainingConfig, training_selection_notes


def test_scatter_students_default_to_tramer_and_boneh_recipe():
    linear = PrivateTrainingConfig(dataset="digits", epsilon=1.0).fitted(60_000)  # the default student
    assert (linear.student_arch, linear.batch_size, linear.max_grad_norm, linear.optimizer, linear.momentum, linear.lr,
            linear.epochs, linear.train_layers) == ("scatter-linear", 8192, 0.1, "sgd", 0.9, 8.0, 40, "head")
    cnn = PrivateTrainingConfig(dataset="digits", student_arch="scatter-cnn", epsilon=1.0).fitted(60_000)
    assert (cnn.optimizer, cnn.batch_size, cnn.train_layers) == ("sgd", 4096, "all")
    other = PrivateTrainingConfig(dataset="digits", student_arch="datalens", epsilon=1.0).fitted(60_000)
    assert (other.batch_size, other.max_grad_norm, other.optimizer, other.lr, other.epochs,
            other.train_layers) == (256, 1.0, "adam", 1e-3, 3, "all")  # other students: the measured rows' defaults
    explicit = PrivateTrainingConfig(dataset="digits", student_arch="scatter-linear", epsilon=1.0, lr=0.5,
                                     optimizer="adam").fitted(60_000)
    assert (explicit.lr, explicit.optimizer, explicit.batch_size, explicit.momentum) == (0.5, "adam", 8192, 0.0)
    assert PrivateTrainingConfig.from_dict(linear.to_dict()) == linear  # saved resolved, resumed as saved
    encoder = PrivateTrainingConfig(dataset="digits", epsilon=1.0, student_init="runs/encoder")
    assert encoder.student_arch == "cnn"  # pretrain's default encoder


def test_a_default_batch_keeps_the_recipes_sampling_rate_on_a_small_training_set():
    """8,192 of 60,000 images a step (0.137); on digits' 1,437, 196 a step with the step scaled alike, not every
    image every step; a batch or step given stays as given."""
    small = PrivateTrainingConfig(dataset="digits", epsilon=1.0).fitted(1437)
    assert small.batch_size == 196 and small.lr == pytest.approx(8.0 * 196 / 8192)
    given = PrivateTrainingConfig(dataset="digits", epsilon=1.0, batch_size=512, lr=2.0).fitted(1437)
    assert (given.batch_size, given.lr) == (512, 2.0)
    adam = PrivateTrainingConfig(dataset="digits", student_arch="datalens", epsilon=1.0).fitted(1437)
    assert (adam.batch_size, adam.lr) == (196, 1e-3)  # Adam's step does not scale with the batch


@pytest.mark.parametrize("values, message", [
    ({"optimizer": "rmsprop"}, "unknown --optimizer 'rmsprop'"),
    ({"momentum": 1.0}, "momentum must be in"),
    ({"optimizer": "adam", "momentum": 0.9}, "--momentum is SGD's"),
    ({"student_arch": "scatter-cnn", "train_layers": "head"}, "give the encoder with --student-init"),
])
def test_private_config_refuses_bad_optimizer_settings(values, message):
    with pytest.raises(ConfigError, match=message):
        PrivateTrainingConfig(**{"dataset": "digits", "epsilon": 1.0, "student_arch": "scatter-linear", **values})


def test_fixed_features_are_computed_once_per_images():
    model = build_classifier("scatter-linear", (1, 8, 8), 10)
    images = load_dataset("digits").x_test[:50]
    first = frozen_features(model.backbone, images, torch.device("cpu"), fixed=True)
    assert first.shape == (50, 81 * 2 * 2)
    rebuilt = build_classifier("scatter-linear", (1, 8, 8), 10)
    assert frozen_features(rebuilt.backbone, images.clone(), torch.device("cpu"), fixed=True) \
        is first  # same transform, same images: the cached tensor
    assert not torch.equal(frozen_features(model.backbone, images.flip(0), torch.device("cpu"), fixed=True), first)
    assert frozen_features(model.backbone, images, torch.device("cpu"), fixed=False) is not first  # an encoder


@pytest.mark.slow
def test_private_scatter_linear_learns_its_head_within_the_budget(tmp_path: Path):
    config = PrivateTrainingConfig(dataset="digits", student_arch="scatter-linear", epsilon=3.0, batch_size=256,
                                   lr=2.0, epochs=5)
    report = train_private(config, tmp_path)
    privacy = report["privacy"]
    assert privacy["epsilon"] <= 3.0 and privacy["formal_guarantee"] and privacy["max_grad_norm"] == 0.1
    assert report["accuracy"]["student"] > 0.6  # chance is 0.1; measured 0.91
    assert set(load_file(tmp_path / "student.safetensors")) == {"head.weight", "head.bias"}  # nothing else to learn
    digits = load_dataset("digits")
    model, _ = load_classifier(tmp_path, "student")
    assert accuracy(model, digits.x_test, digits.y_test) == pytest.approx(report["accuracy"]["student"], abs=1e-6)


@pytest.mark.slow
def test_private_scatter_cnn_trains_its_layers_after_the_transform_computed_once(tmp_path: Path):
    config = PrivateTrainingConfig(dataset="digits", student_arch="scatter-cnn", epsilon=3.0, batch_size=256,
                                   lr=2.0, epochs=3)
    report = train_private(config, tmp_path)
    assert report["privacy"]["epsilon"] <= 3.0 and report["privacy"]["formal_guarantee"]
    assert report["accuracy"]["student"] > 0.3  # chance is 0.1
    digits = load_dataset("digits")
    model, _ = load_classifier(tmp_path, "student")  # the layers trained on cached coefficients are the saved ones
    assert accuracy(model, digits.x_test, digits.y_test) == pytest.approx(report["accuracy"]["student"], abs=1e-6)


def test_fixed_features_are_stored_once_for_later_runs(tmp_path: Path, monkeypatch, fresh_features):
    model = build_classifier("scatter-linear", (1, 8, 8), 10)
    images = load_dataset("digits").x_test[:40]
    first = frozen_features(model.backbone, images, torch.device("cpu"), fixed=True).clone()  # apart from the file
    stored = list((tmp_path / "features").iterdir())
    assert len(stored) == 1 and stored[0].stat().st_mode & 0o777 == 0o600  # private, like the images
    fresh_features()  # a later process
    monkeypatch.setattr(features_module, "batches", lambda *args, **kwargs: pytest.fail("recomputed"))
    again = frozen_features(model.backbone, images, torch.device("cpu"), fixed=True)
    assert torch.equal(again, first)
    again += 1  # memory-mapped copy-on-write: the stored file keeps its values
    fresh_features()
    assert torch.equal(frozen_features(model.backbone, images, torch.device("cpu"), fixed=True), first)
    stored[0].write_bytes(stored[0].read_bytes()[:-4])  # a truncated file is computed again
    monkeypatch.undo()
    fresh_features()
    assert torch.equal(frozen_features(model.backbone, images, torch.device("cpu"), fixed=True), first)
    stored[0].write_bytes(b"broken")  # and so is one that is no array
    monkeypatch.undo()
    fresh_features()
    assert torch.equal(frozen_features(model.backbone, images, torch.device("cpu"), fixed=True), first)


def test_settings_chosen_on_the_private_data_are_stated_where_they_are_used_by_the_datas_digest():
    defaults = PrivateTrainingConfig(dataset="fmnist", epsilon=1.0, student_arch="scatter-linear").fitted(60_000)
    [note] = training_selection_notes(defaults, FASHION_MNIST)
    assert note == ("scatter-linear's DP-SGD settings (batch 8,192, step 8, 40 epochs) were chosen on Fashion-MNIST's "
                    "training split (without noise), which is this private data (same digest): a use of it that no "
                    "epsilon here covers")
    longer = dataclasses.replace(defaults, batch_size=16384, lr=16.0, epochs=160)
    assert "(batch 16,384, step 16, 160 epochs)" in training_selection_notes(longer, FASHION_MNIST)[0]
    assert training_selection_notes(dataclasses.replace(defaults, epochs=20), FASHION_MNIST) == []  # the user's
    copy = dataclasses.replace(defaults, dataset="/data/my-copy.npz")  # the name is not what counts
    assert training_selection_notes(copy, FASHION_MNIST) == [note]
    assert training_selection_notes(dataclasses.replace(defaults, dataset="fmnist"), MNIST_SET) == [
        "scatter-linear's DP-SGD settings (batch 8,192, step 8, 40 epochs) were chosen on Fashion-MNIST's training "
        "split (without noise): a fixed public choice for this data"]
