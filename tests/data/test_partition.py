"""Ensemble partitions: keyed by each example's id, so no example moves another; disjoint and covering; balanced
up to a binomial spread; Dirichlet splits skewed by their concentration."""

import hashlib
import math

import numpy as np
import pytest
import torch

from dpdistill.data import from_arrays
from dpdistill.data.partition import (KEY_BYTES, dirichlet_partition_indices, keyed_members, new_partition_key,
                                      partition_indices)
from dpdistill.errors import ConfigError

LABELS = torch.arange(10).repeat_interleave(200)  # 2,000 examples, 200 per class
IDS = torch.arange(2000) * 7 + 1000  # stable ids need not be positions
KEY, OTHER_KEY = bytes(range(KEY_BYTES)), bytes(range(1, KEY_BYTES + 1))


def _check_disjoint_cover(parts, count=len(LABELS)):
    joined = torch.cat(parts)
    assert len(joined) == count and len(set(joined.tolist())) == count


def _member_of_each_id(ids: torch.Tensor, parts: list[torch.Tensor]) -> dict[int, int]:
    return {int(ids[position]): member for member, part in enumerate(parts) for position in part.tolist()}


def test_keyed_partitions_are_disjoint_mixed_and_balanced_up_to_a_binomial_spread():
    parts = partition_indices(IDS, 7, KEY)
    _check_disjoint_cover(parts)
    spread = math.sqrt(len(IDS) * (1 / 7) * (6 / 7))  # binomial standard deviation, about 15.6
    sizes = [len(part) for part in parts]
    assert all(abs(size - len(IDS) / 7) < 5 * spread for size in sizes) and len(set(sizes)) > 1  # hashed, not cut
    assert all(len(set(LABELS[part].tolist())) == 10 for part in parts)
    assert all(torch.equal(part, torch.sort(part).values) for part in parts)  # positions in order


def test_the_same_key_gives_the_same_partitions_and_another_key_others():
    parts = partition_indices(IDS, 7, KEY)
    assert all(torch.equal(a, b) for a, b in zip(parts, partition_indices(IDS, 7, KEY)))
    before, after = (_member_of_each_id(IDS, partition) for partition in (parts, partition_indices(IDS, 7, OTHER_KEY)))
    moved = sum(before[i] != after[i] for i in IDS.tolist())
    assert moved > len(IDS) / 2  # about 6/7 of them under an independent key
    assert new_partition_key() != new_partition_key() and len(new_partition_key()) == KEY_BYTES


def test_removing_or_adding_one_example_moves_no_other():
    before = _member_of_each_id(IDS, partition_indices(IDS, 7, KEY))
    removed = torch.cat([IDS[:500], IDS[501:]])
    after_removal = _member_of_each_id(removed, partition_indices(removed, 7, KEY))
    assert after_removal == {i: member for i, member in before.items() if i != int(IDS[500])}
    added = torch.cat([IDS[:500], torch.tensor([5]), IDS[500:]])  # a new example, in the middle
    after_addition = _member_of_each_id(added, partition_indices(added, 7, KEY))
    assert {i: member for i, member in after_addition.items() if i != 5} == before
    shuffled = IDS[torch.randperm(len(IDS), generator=torch.Generator().manual_seed(0))]
    assert _member_of_each_id(shuffled, partition_indices(shuffled, 7, KEY)) == before  # order does not matter


def test_replacing_one_example_keeps_every_membership():
    rng = np.random.default_rng(0)
    images, labels = rng.random((40, 4, 4)), np.arange(40) % 3
    ids = np.arange(40) * 3
    original = from_arrays("toy", images, labels, images[:4], labels[:4], "test", ids_train=ids)
    images, labels = images.copy(), labels.copy()
    images[17], labels[17] = rng.random((4, 4)), (labels[17] + 1) % 3  # same id, new image and label
    replaced = from_arrays("toy", images, labels, images[:4], labels[:4], "test", ids_train=ids)
    assert not torch.equal(original.x_train, replaced.x_train) and not torch.equal(original.y_train, replaced.y_train)
    assert all(torch.equal(a, b) for a, b in zip(partition_indices(original.ids_train, 4, KEY),
                                                 partition_indices(replaced.ids_train, 4, KEY)))


def test_an_id_is_hashed_as_eight_bytes_under_the_key():
    expected = int.from_bytes(hashlib.blake2b((1234).to_bytes(8, "little"), key=KEY).digest(), "little") % 9
    assert keyed_members(torch.tensor([1234]), 9, KEY).tolist() == [expected]
    with pytest.raises(ValueError, match="32 bytes"):
        keyed_members(IDS, 9, b"short")


def _largest_class_share(parts):
    return sum(torch.bincount(LABELS[part], minlength=10).max().item() / len(part) for part in parts) / len(parts)


def test_dirichlet_partitions_are_disjoint_and_skewed_by_alpha():
    skewed, mild = (dirichlet_partition_indices(LABELS, 5, alpha, seed=0) for alpha in (0.1, 100.0))
    _check_disjoint_cover(skewed)
    _check_disjoint_cover(mild)
    assert _largest_class_share(skewed) > 0.3  # a few classes dominate each client
    assert _largest_class_share(mild) < 0.14  # close to the 0.1 of a balanced split


@pytest.mark.parametrize("parts, message", [(0, "at least 1"), (1001, "cannot fill")])
def test_impossible_keyed_partitions_are_refused(parts, message):
    with pytest.raises(ConfigError, match=message):
        partition_indices(IDS, parts, KEY)


def test_a_keyed_partition_left_too_small_is_refused_before_training():
    ids = torch.arange(10)  # enough for 5 partitions of 2 on average, but hashing is uneven
    assert torch.bincount(keyed_members(ids, 5, bytes(KEY_BYTES)), minlength=5).min() < 2
    with pytest.raises(ConfigError, match=r"left partition \d with [01] of at least 2 examples; use fewer partitions"):
        partition_indices(ids, 5, bytes(KEY_BYTES))


@pytest.mark.parametrize("parts, alpha, message", [(0, 1.0, "at least 1"), (1001, 1.0, "cannot fill"),
                                                    (5, 0.0, "positive"), (900, 0.001, "Dirichlet")])
def test_impossible_dirichlet_partitions_are_refused(parts, alpha, message):
    with pytest.raises(ConfigError, match=message):
        dirichlet_partition_indices(LABELS, parts, alpha, seed=0)


def test_without_ids_of_its_own_removing_an_example_moves_no_other_between_members():
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (200, 4, 4), dtype=np.uint8)
    images[7] = images[3]  # two identical examples: each its own copy's id
    labels = np.arange(200) % 5
    whole = from_arrays("mine", images, labels, images[:5], labels[:5], "test")
    fewer = from_arrays("mine", np.delete(images, 11, axis=0), np.delete(labels, 11), images[:5], labels[:5], "test")
    key = new_partition_key()
    before = _member_of_each_id(whole.ids_train, partition_indices(whole.ids_train, 4, key))
    after = _member_of_each_id(fewer.ids_train, partition_indices(fewer.ids_train, 4, key))
    removed = int(whole.ids_train[11])
    assert removed not in after and {id_: member for id_, member in before.items() if id_ != removed} == after
    assert len(set(whole.ids_train.tolist())) == 200 and whole.ids_source != "given"
