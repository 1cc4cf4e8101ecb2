"""Supervised training: the augmentation option reaches every batch, and only when asked for; a pretrained
encoder is the starting point only when it fits; heads on frozen features each learn from their own partition
alone."""

from pathlib import Path

import pytest
import torch

from dpdistill.data import load_dataset
from dpdistill import progress
from dpdistill.errors import CheckpointError, ConfigError
from dpdistill.models.checkpoint import ENCODER, load_classifier
from dpdistill.training import teacher
from dpdistill.training.teacher import TeacherConfig, fresh_classifier, train_classifier


@pytest.mark.parametrize("shift, expected_calls", [(0, 0), (2, 3)])
def test_augmentation_shifts_each_batch_when_asked(monkeypatch, shift, expected_calls):
    digits = load_dataset("digits")
    small = digits.train_subset(slice(96))
    calls = []

    def counting(images, max_shift, flip):
        calls.append((max_shift, flip))
        return images

    monkeypatch.setattr(teacher, "shift_and_flip", counting)
    train_classifier(small, TeacherConfig(epochs=1, batch_size=32, augment_shift=shift), evaluate_each_epoch=False)
    assert calls == [(shift, False)] * expected_calls


def test_soft_targets_replace_the_labels_and_must_fit_the_training_split():
    digits = load_dataset("digits")
    small = digits.train_subset(slice(300))
    config = TeacherConfig(epochs=1, batch_size=32, min_steps=200, augment_shift=0)
    shifted = torch.nn.functional.one_hot((small.y_train + 1) % 10, 10).float()  # every label moved by one class
    model, _ = train_classifier(small, config, evaluate_each_epoch=False, targets=shifted)
    with torch.no_grad():
        predictions = model(small.x_test).argmax(1)
    assert (predictions == (small.y_test + 1) % 10).float().mean() > 0.5  # the targets were learnt, not the labels
    with pytest.raises(ConfigError, match=r"soft targets must be \(training images, classes\) = \(300, 10\)"):
        train_classifier(small, config, targets=shifted[:10])


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


def _blobs(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Three well-separated Gaussian clusters in 6 dimensions: features a linear head can tell apart."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(count) % 3
    centres = torch.eye(6)[:3] * 4
    return centres[labels] + torch.randn(count, 6, generator=generator), labels


def test_heads_learn_their_partition_and_only_their_partition():
    features, labels = _blobs(90, seed=0)
    parts = [torch.arange(0, 30), torch.arange(30, 60), torch.arange(60, 90)]
    config = TeacherConfig(lr=0.05, min_steps=100, init="encoder", heads_only=True)
    weight, bias, report = teacher.train_heads(features, labels, parts, 3, config)
    assert weight.shape == (3, 6, 3) and bias.shape == (3, 3)
    test_features, test_labels = _blobs(300, seed=1)
    for head in range(3):  # each head alone separates the clusters
        predictions = (test_features @ weight[head] + bias[head]).argmax(1)
        assert (predictions == test_labels).float().mean() > 0.9
    assert report["history"][-1]["loss"] < report["history"][0]["loss"]
    # One example of partition 1 changed: head 1 moves, the other heads are exactly the same.
    changed_features, changed_labels = features.clone(), labels.clone()
    changed_features[40], changed_labels[40] = torch.full((6,), 9.0), (labels[40] + 1) % 3
    changed_weight, changed_bias, _ = teacher.train_heads(changed_features, changed_labels, parts, 3, config)
    assert not torch.equal(changed_weight[1], weight[1])
    for head in (0, 2):
        assert torch.equal(changed_weight[head], weight[head]) and torch.equal(changed_bias[head], bias[head])


def test_heads_report_their_position_against_their_steps():
    features, labels = _blobs(30, seed=0)
    records: list[dict] = []
    config = TeacherConfig(lr=0.05, min_steps=120, init="encoder", heads_only=True)
    teacher.train_heads(features, labels, [torch.arange(0, 15), torch.arange(15, 30)], 3, config, records.append)
    assert records and all(record["total"] == 120 for record in records)  # a display shows 50/120, not 50/?
    assert [record["step"] for record in records if "loss" in record] == [50, 100, 120]


def test_heads_of_unequal_partitions_ignore_the_padding():
    features, labels = _blobs(40, seed=2)
    config = TeacherConfig(lr=0.05, min_steps=20, init="encoder", heads_only=True)
    # The larger partition first: heads train grouped by size and must come back in the partitions' order.
    together, _, _ = teacher.train_heads(features, labels, [torch.arange(10, 40), torch.arange(0, 10)], 3, config)
    alone, _, _ = teacher.train_heads(features, labels, [torch.arange(0, 10)], 3, config)
    assert torch.allclose(together[1], alone[0], atol=1e-6)
    assert not torch.allclose(together[0], alone[0], atol=1e-3)


def test_heads_are_padded_only_to_the_largest_partition_of_their_group():
    features, labels = _blobs(64 * 10 + 64 * 500, seed=3)
    sizes = [500, 10] * 64  # unequal partitions, interleaved: one common padding would be 128 x 500 cells
    bounds = torch.tensor([0, *sizes]).cumsum(0)
    parts = [torch.arange(bounds[member], bounds[member + 1]) for member in range(len(sizes))]
    order, groups = teacher._padded_groups(features, labels, parts, torch.device("cpu"))
    assert sum(group[3].numel() for group in groups) == sum(sizes)  # no padding at all here
    assert sorted(order.tolist()) == list(range(len(sizes)))
    for first, inputs, targets, present, counts in groups:  # each head reads its own partition, in order
        for row, member in enumerate(order[first:first + len(inputs)].tolist()):
            assert torch.equal(inputs[row][present[row]], features[parts[member]])
            assert torch.equal(targets[row][present[row]], labels[parts[member]])
            assert counts[row] == len(parts[member])


@pytest.mark.parametrize("options, message", [({"heads_only": True}, "give a pretrained encoder"),
                                              ({"init": "scatter"}, "add --heads-only"),
                                              ({"heads_only": True, "init": "e", "augment_shift": 2},
                                               "drop --augment-shift"),
                                              ({"weight_decay": -1.0}, "weight-decay must be at least 0")])
def test_impossible_teacher_settings_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        TeacherConfig(**options)


def test_a_long_epoch_reports_how_far_into_it_the_run_is(monkeypatch):
    """A record at least every PACE_SECONDS (0 here: every batch), its epoch a fraction, then the epoch's."""
    monkeypatch.setattr(progress, "PACE_SECONDS", 0.0)
    records: list[dict] = []
    train_classifier(load_dataset("digits"), TeacherConfig(arch="cnn", epochs=1, batch_size=512), records.append)
    assert [record["epoch"] for record in records] == [0.0, 0.36, 0.71, 1]  # 1,437 images in batches of 512
    assert "test_accuracy" in records[-1] and all(record["total"] == 1 for record in records)


def test_a_stopped_training_continues_from_its_state_to_the_model_it_would_have_trained(tmp_path: Path,
                                                                                       monkeypatch):
    """Saved after every batch here (CHECKPOINT_SECONDS 0, a save's cost not counted), stopped in its second epoch:
    the resumed run trains the same weights as one that never stopped, and reports the whole history."""
    from dpdistill.training import state

    monkeypatch.setattr(state, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr(state, "SAVE_SHARE", float("inf"))
    monkeypatch.setattr(progress, "PACE_SECONDS", 0.0)
    digits, config = load_dataset("digits"), TeacherConfig(arch="cnn", epochs=2, batch_size=256)
    whole, whole_report = train_classifier(digits, config, evaluate_each_epoch=True)

    def stop_in_the_second_epoch(record: dict) -> None:
        if record["epoch"] == 1.53:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_classifier(digits, config, stop_in_the_second_epoch, state_dir=tmp_path)
    records: list[dict] = []
    resumed, resumed_report = train_classifier(digits, config, records.append, state_dir=tmp_path)
    assert records[0]["epoch"] == 1.53  # where it stopped, not the start
    assert all(torch.equal(a, b) for a, b in zip(whole.state_dict().values(), resumed.state_dict().values()))
    assert resumed_report["history"] == whole_report["history"]


def test_a_linear_schedule_decays_the_learning_rate_to_zero_in_a_straight_line():
    _, optimizer, schedule = fresh_classifier("datalens", (1, 8, 8), 10, 1e-3, 10, 0, torch.device("cpu"),
                                              schedule="linear")
    rates = []
    for _ in range(10):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert rates == pytest.approx([1e-3 * (1 - step / 10) for step in range(10)])
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0)
