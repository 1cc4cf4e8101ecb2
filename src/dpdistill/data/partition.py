"""Disjoint partitions of a private training set, one per teacher of an ensemble.

An ensemble's sensitivity (one private example changes one member) needs more than disjointness: each example's
member must not depend on any other example. So IID membership is a keyed hash of the example's own stable id
(ImageDataset.ids_train), mod M: adding, removing or replacing (same id, new image or label) one example changes
its own member only. The key is secret and drawn from OS entropy, never from the run's seed, since an adversary
who knew it could predict membership; it lives only in the private ensemble directory (models/ensemble.py).

Non-IID partitions (each class spread over the partitions in Dirichlet(alpha) proportions, as in federated
benchmarks) are a function of every label: they simulate owners who hold their data apart, and carry no formal
guarantee for a central run.
"""

from __future__ import annotations

import hashlib
import secrets

import numpy as np
import torch
from torch import Tensor

from dpdistill.errors import ConfigError

MIN_PARTITION_SIZE = 2
DIRICHLET_TRIES = 100
KEY_BYTES = 32  # blake2b's largest key


def new_partition_key() -> bytes:
    """A fresh secret key from OS entropy: one per ensemble training, independent of every seed."""
    return secrets.token_bytes(KEY_BYTES)


def keyed_members(ids: Tensor, parts: int, key: bytes) -> Tensor:
    """Each id's member in 0..parts-1: keyed blake2b of the id (8 bytes, little-endian), as an integer, mod `parts`."""
    if len(key) != KEY_BYTES:
        raise ValueError(f"a partition key has {KEY_BYTES} bytes, got {len(key)}")
    members = [int.from_bytes(hashlib.blake2b(identity.to_bytes(8, "little", signed=True), key=key).digest(),
                              "little") % parts for identity in ids.tolist()]
    return torch.tensor(members, dtype=torch.int64)


def partition_indices(ids: Tensor, parts: int, key: bytes) -> list[Tensor]:
    """`parts` disjoint sets of positions covering `ids`, member m holding every id that `key` hashes to m.

    Sizes follow a binomial spread around len(ids) / parts, so a partition can come out nearly empty when there
    are few examples per partition; one below MIN_PARTITION_SIZE is refused before any training."""
    _check_parts(len(ids), parts)
    members = keyed_members(ids, parts, key)
    sizes = torch.bincount(members, minlength=parts)
    if sizes.min() < MIN_PARTITION_SIZE:
        raise ConfigError(f"the keyed split of {len(ids)} training examples left partition {int(sizes.argmin())} "
                          f"with {int(sizes.min())} of at least {MIN_PARTITION_SIZE} examples; use fewer partitions")
    return list(torch.split(torch.argsort(members, stable=True), sizes.tolist()))  # positions ascending in each


def dirichlet_partition_indices(labels: Tensor, parts: int, alpha: float, seed: int) -> list[Tensor]:
    """`parts` disjoint sets of positions covering `labels`, each class spread in Dirichlet(alpha) proportions.

    A simulation of owners who hold their data apart: the split depends on every label (one changed label moves
    others), so it is seeded rather than keyed. A draw that leaves a partition with fewer than MIN_PARTITION_SIZE
    examples is redrawn (small alpha and many parts make that likely); after DIRICHLET_TRIES draws the request
    is refused as impossible."""
    _check_parts(len(labels), parts)
    if not alpha > 0:
        raise ConfigError(f"the Dirichlet concentration alpha must be positive, got {alpha}")
    rng = np.random.default_rng(seed)
    classes = labels.cpu().numpy()
    for _ in range(DIRICHLET_TRIES):
        members: list[list[np.ndarray]] = [[] for _ in range(parts)]
        for label in np.unique(classes):
            index = rng.permutation(np.flatnonzero(classes == label))
            cuts = (np.cumsum(rng.dirichlet(np.full(parts, alpha)))[:-1] * len(index)).astype(int)
            for part, chunk in zip(members, np.split(index, cuts)):
                part.append(chunk)
        partitions = [np.sort(np.concatenate(part)) for part in members]
        if min(len(part) for part in partitions) >= MIN_PARTITION_SIZE:
            return [torch.from_numpy(part) for part in partitions]
    raise ConfigError(f"Dirichlet({alpha}) over {parts} partitions keeps leaving a partition with fewer than "
                      f"{MIN_PARTITION_SIZE} examples; raise alpha or use fewer partitions")


def _check_parts(count: int, parts: int) -> None:
    if parts < 1:
        raise ConfigError(f"the number of partitions must be at least 1, got {parts}")
    if count < parts * MIN_PARTITION_SIZE:
        raise ConfigError(f"{count} training examples cannot fill {parts} partitions of at least "
                          f"{MIN_PARTITION_SIZE}; use fewer partitions")
