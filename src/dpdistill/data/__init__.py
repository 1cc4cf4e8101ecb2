"""Data sources: built-in data sets (fmnist, mnist, digits) and a user's folder of images by class, IDX folder or
.npz file."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, NamedTuple

from dpdistill.data.base import ImageDataset, from_arrays
from dpdistill.data.folders import is_image_folder, read_image_folder
from dpdistill.paths import data_home
from dpdistill.data.sources import (DatasetStatus, digits_status, fmnist_status, idx_files, load_digits, load_fmnist,
                                    load_idx_folder, load_mnist, load_npz, mnist_status)
from dpdistill.errors import DatasetError
from dpdistill.reporting.report import describe_classes


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


ACCEPTED = ("a folder of images (FOLDER/train/CLASS/*.png and FOLDER/test/CLASS/*.png), a folder of IDX files, or "
            "an .npz file (x_train, y_train, x_test, y_test)")


def load_dataset(name_or_path: str) -> ImageDataset:
    """A built-in data set by name, or a user's: a folder of images by class, a folder of IDX files or an .npz file
    (named after its folder or stem)."""
    if name_or_path in BUILT_IN:
        return BUILT_IN[name_or_path].load()
    path = Path(name_or_path).expanduser()
    if path.is_dir() and is_image_folder(path):
        return load_image_folder(path)
    if path.is_dir() and any(idx_files(path)):
        return load_idx_folder(path, path.resolve().name, f"user IDX files in {path}, with their own train/test split")
    if path.is_file() and path.suffix == ".npz":
        return load_npz(path)
    if path.exists():
        raise DatasetError(f"{path} is not a data set dpdistill reads: give {ACCEPTED}")
    if path.suffix or len(path.parts) > 1:  # written as a path: say it is missing
        raise DatasetError(f"no such file or folder: {path}")
    raise DatasetError(f"unknown dataset {name_or_path!r}: choose one of {', '.join(BUILT_IN)}, or give {ACCEPTED}")


def load_image_folder(folder: Path) -> ImageDataset:
    """A folder of images by class, read as it is (one size, grey or RGB): `data import` resizes."""
    arrays, classes = read_image_folder(folder)
    return from_arrays(folder.resolve().name, **arrays, class_names=classes,
                       source=f"user images in {folder}, with their own train/test split; classes "
                              f"{describe_classes(classes)}")


__all__ = ["DatasetStatus", "ImageDataset", "data_home", "from_arrays", "list_datasets", "load_dataset"]
