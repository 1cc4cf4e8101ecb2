"""Ensemble partitions: disjoint, covering, balanced when IID, skewed by the Dirichlet concentration."""

import pytest
import torch

from dpdistill.data.partition import partition_indices
from dpdistill.errors import ConfigError

LABELS = torch.arange(10).repeat_interleave(200)  # 2,000 examples, 200 per class


def _check_disjoint_cover(parts):
    joined = torch.cat(parts)
    assert len(joined) == len(LABELS) and len(set(joined.tolist())) == len(LABELS)


def test_iid_partitions_are_disjoint_equal_and_mixed():
    parts = partition_indices(LABELS, 7, seed=3)
    _check_disjoint_cover(parts)
    assert {len(part) for part in parts} <= {285, 286}
    assert all(len(set(LABELS[part].tolist())) == 10 for part in parts)
    assert all(torch.equal(a, b) for a, b in zip(parts, partition_indices(LABELS, 7, seed=3)))


def _largest_class_share(parts):
    return sum(torch.bincount(LABELS[part], minlength=10).max().item() / len(part) for part in parts) / len(parts)


def test_dirichlet_partitions_are_disjoint_and_skewed_by_alpha():
    skewed, mild = partition_indices(LABELS, 5, alpha=0.1, seed=0), partition_indices(LABELS, 5, alpha=100.0, seed=0)
    _check_disjoint_cover(skewed)
    _check_disjoint_cover(mild)
    assert _largest_class_share(skewed) > 0.3  # a few classes dominate each client
    assert _largest_class_share(mild) < 0.14  # close to the 0.1 of a balanced split


@pytest.mark.parametrize("parts, alpha, message", [(0, None, "at least 1"), (1001, None, "cannot fill"),
                                                    (5, 0.0, "positive"), (900, 0.001, "Dirichlet")])
def test_impossible_partitions_are_refused(parts, alpha, message):
    with pytest.raises(ConfigError, match=message):
        partition_indices(LABELS, parts, alpha)
