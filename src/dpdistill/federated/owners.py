"""Simulated data owners: the training split divided among `clients` owners, each training its own teachers.

In a real federation each owner trains on the data it holds, on its own machine, and starts a SuperNode that can
read its teacher directory (README: "Across machines"). Here one machine plays every owner: the holdings are an
even keyed split (each example's owner a keyed hash of its id, the key secret) or, with `dirichlet_alpha`, a seeded
Dirichlet split per class as in federated benchmarks. The latter depends on every label, so it simulates owners
who already hold their data apart; it is not a partition a single holder could make without changing the
sensitivity. Within an owner, members (for PATE) are keyed partitions of the owner's own examples, so one private
example changes one member of one owner.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import Tensor

from dpdistill.data import load_dataset
from dpdistill.data.partition import dirichlet_partition_indices, new_partition_key, partition_indices
from dpdistill.errors import ConfigError
from dpdistill.federated.config import FederatedConfig
from dpdistill.models.ensemble import is_ensemble, read_partition_key, write_partition_key
from dpdistill.progress import Progress
from dpdistill.reporting.report import write_json

OWNERS_FILE = "owners.json"


def owner_directory(root: Path, index: int) -> Path:
    return root / f"owner-{index:03d}"


def owner_directories(root: Path) -> list[Path]:
    """The owners prepared in `root` (none: it holds no owners)."""
    path = root / OWNERS_FILE
    if not path.is_file():
        return []
    return [owner_directory(root, index) for index in range(int(json.loads(path.read_text())["owners"]))]


def owners_spec(config: FederatedConfig) -> dict[str, Any]:
    """What fixes the owners: the same spec in the same directory means the same owners (and their ledger)."""
    return {"dataset": config.dataset, "owners": config.clients, "dirichlet_alpha": config.dirichlet_alpha,
            "members": config.members,
            "teacher": {key: value for key, value in config.teacher_config().__dict__.items() if key != "device"}}


def check_owners(root: Path, config: FederatedConfig) -> None:
    """Refuse owners prepared for another federation before any work."""
    path = root / OWNERS_FILE
    if path.exists() and json.loads(path.read_text()) != json.loads(json.dumps(owners_spec(config))):
        raise ConfigError(f"{root} holds data owners prepared with other settings ({path}): choose another --owners")


def prepare_owners(root: Path, config: FederatedConfig, progress: Progress | None = None) -> list[Path]:
    """Each owner's teacher directory, training the owners that have none yet (an interrupted preparation
    continues where it stopped, with the same holdings)."""
    from dpdistill.jobs import interrupted_ensemble, train_teacher_ensemble

    check_owners(root, config)
    root.mkdir(parents=True, exist_ok=True)
    if not (root / OWNERS_FILE).exists():
        if config.dirichlet_alpha is None:
            write_partition_key(root, new_partition_key())
        write_json(root / OWNERS_FILE, owners_spec(config))
    holdings = _holdings(root, config)
    directories = []
    for index, holding in enumerate(holdings):
        directory = owner_directory(root, index)
        if not is_ensemble(directory):
            resume = directory.exists() and interrupted_ensemble(directory) is not None
            train_teacher_ensemble(config.dataset, directory, config.teacher_config(), config.members,
                                   resume=resume, overwrite=directory.exists() and not resume, holding=holding)
        if progress:
            progress({"owner": index + 1, "total": len(holdings), "examples": len(holding)})
        directories.append(directory)
    return directories


def _holdings(root: Path, config: FederatedConfig) -> list[Tensor]:
    dataset = load_dataset(config.dataset)
    if config.dirichlet_alpha is None:
        return partition_indices(dataset.ids_train, config.clients, read_partition_key(root))
    return dirichlet_partition_indices(dataset.y_train, config.clients, config.dirichlet_alpha, config.seed)
