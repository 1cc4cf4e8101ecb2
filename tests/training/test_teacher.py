"""Supervised training: the augmentation option reaches every batch, and only when asked for."""

import dataclasses

import pytest

from dpdistill.data import load_dataset
from dpdistill.training import teacher
from dpdistill.training.teacher import TeacherConfig, train_classifier


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
