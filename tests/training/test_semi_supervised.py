"""Consistency training: the unlabelled images must teach something the few labels alone do not."""

import pytest
import torch

from dpdistill.data import load_dataset
from dpdistill.errors import ConfigError
from dpdistill.training.semi_supervised import ConsistencyConfig, train_consistency


@pytest.mark.slow
def test_unlabelled_images_lift_a_student_with_two_labels_per_class():
    digits = load_dataset("digits")
    chosen = torch.cat([(digits.y_train == label).nonzero().squeeze(1)[:2] for label in range(10)])
    accuracies = {}
    for weight in (0.0, 1.0):  # weight 0: the same loop on the 20 labels alone, no unlabelled image
        config = ConsistencyConfig(steps=700, batch_size=32, weight=weight, report_every=175)
        _, report = train_consistency(digits.x_train[chosen], digits.y_train[chosen], digits.x_train,
                                      digits.x_test, digits.y_test, 10, config)
        accuracies[weight] = report["test_accuracy"]
        assert [record["step"] for record in report["history"]] == [175, 350, 525, 700]
        assert ("confident_share" in report) == (weight > 0) and 0 < report.get("confident_share", 1) <= 1
    assert accuracies[1.0] > accuracies[0.0] + 0.04, accuracies  # measured: 0.764 against 0.683 (seed 0)


@pytest.mark.parametrize("values, message", [
    ({"steps": 0}, "steps must be at least 1"),
    ({"unlabelled_ratio": 0}, "unlabelled-ratio"),
    ({"threshold": 1.5}, "threshold must be in"),
    ({"weight": -1}, "weight must not be negative"),
])
def test_impossible_settings_are_refused(values, message):
    with pytest.raises(ConfigError, match=message):
        ConsistencyConfig(**values)


def test_no_labelled_image_is_refused():
    digits = load_dataset("digits")
    with pytest.raises(ConfigError, match="at least one labelled image"):
        train_consistency(digits.x_train[:0], digits.y_train[:0], digits.x_train, digits.x_test, digits.y_test, 10,
                          ConsistencyConfig(steps=1))


@pytest.mark.slow
def test_soft_targets_teach_their_most_likely_class():
    digits = load_dataset("digits")
    chosen = torch.cat([(digits.y_train == label).nonzero().squeeze(1)[:5] for label in range(10)])
    truth, decoy = digits.y_train[chosen], (digits.y_train[chosen] + 1) % 10
    config = ConsistencyConfig(steps=300, batch_size=32, report_every=300, weight=0.0)  # the labelled loss alone
    accuracies = []
    for likely, unlikely in ((truth, decoy), (decoy, truth)):
        targets = 0.6 * torch.nn.functional.one_hot(likely, 10) + 0.4 * torch.nn.functional.one_hot(unlikely, 10)
        _, report = train_consistency(digits.x_train[chosen], targets, digits.x_train, digits.x_test, digits.y_test,
                                      10, config)
        accuracies.append(report["test_accuracy"])
    assert accuracies[0] > 0.4 and accuracies[1] < 0.3, accuracies  # the 0.6 class is learnt, not the 0.4 one:
    # measured 0.50-0.64 and 0.19-0.25 (seeds 0-7)
