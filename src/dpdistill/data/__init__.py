"""Data sources: built-in data sets (fmnist, mnist, digits) and a user's IDX folder or .npz file."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, NamedTuple

from dpdistill.data.base import ImageDataset, from_arrays
from dpdistill.paths import data_home
from dpdistill.data.sources import (DatasetStatus, digits_status, fmnist_status, load_digits, load_fmnist,
                                    load_idx_folder, load_mnist, load_npz, mnist_status)
from dpdistill.errors import DatasetError


class BuiltIn(NamedTuple):
    load: Callable[[], ImageDataset]
    status: Callable[[], DatasetStatus]


BUILT_IN: dict[str, BuiltIn] = {
    "fmnist": BuiltIn(load_fmnist, fmnist_status),
    "mnist": BuiltIn(load_mnist, mnist_status),
    "digits": BuiltIn(load_digits, digits_status),
}


def list_datasets() -> list[DatasetStatus]:
    """Each built-in data set, whether it is here, and where (or the command that fetches it)."""
    return [source.status() for source in BUILT_IN.values()]


def load_dataset(name_or_path: str) -> ImageDataset:
    """A built-in data set by name, or a user's: a folder of IDX files or an .npz file (named after its stem)."""
    if name_or_path in BUILT_IN:
        return BUILT_IN[name_or_path].load()
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return load_idx_folder(path, path.resolve().name, f"user IDX files in {path}, with their own train/test split")
    if path.is_file() and path.suffix == ".npz":
        return load_npz(path)
    if path.exists():
        raise DatasetError(f"{path} is neither a folder of IDX files nor an .npz file")
    raise DatasetError(f"unknown dataset {name_or_path!r}: choose one of {', '.join(BUILT_IN)}, "
                       f"or give a folder of IDX files or an .npz file")


__all__ = ["DatasetStatus", "ImageDataset", "data_home", "from_arrays", "list_datasets", "load_dataset"]
