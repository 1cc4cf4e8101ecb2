"""Disjoint partitions of a private training set, one per teacher of an ensemble.

Disjointness is what the ensembles' privacy rests on: one private example lives in exactly one partition, so it
can change only one teacher. Partitions are IID (a random permutation cut into near-equal parts) or non-IID
(each class spread over the partitions in Dirichlet(alpha) proportions, as in federated benchmarks).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from dpdistill.errors import ConfigError

MIN_PARTITION_SIZE = 2
DIRICHLET_TRIES = 100


def partition_indices(labels: Tensor, parts: int, alpha: float | None = None, seed: int = 0) -> list[Tensor]:
    """`parts` disjoint index sets covering `labels`: IID when `alpha` is None, else Dirichlet(alpha) per class.

    A Dirichlet draw that leaves a partition with fewer than MIN_PARTITION_SIZE examples is redrawn (small alpha
    and many parts make that likely); after DIRICHLET_TRIES draws the request is refused as impossible.
    """
    count = len(labels)
    if parts < 1:
        raise ConfigError(f"the number of partitions must be at least 1, got {parts}")
    if count < parts * MIN_PARTITION_SIZE:
        raise ConfigError(f"{count} training examples cannot fill {parts} partitions of at least "
                          f"{MIN_PARTITION_SIZE}; use fewer partitions")
    if alpha is not None and not alpha > 0:
        raise ConfigError(f"the Dirichlet concentration alpha must be positive, got {alpha}")
    rng = np.random.default_rng(seed)
    if alpha is None:
        return [torch.from_numpy(np.sort(part)) for part in np.array_split(rng.permutation(count), parts)]
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
