"""One in-memory form for every data set: float32 NCHW images in [-1, 1] and int64 labels."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from dpdistill.errors import DatasetError

NORMALISATION = "[-1, 1] (x / max * 2 - 1)"
CONTENT_IDS = "digests of each example's content"
SPLITS = ("train", "test")


@dataclass(frozen=True)
class ImageDataset:
    """A train/test pair that every model, method and report can rely on without re-checking.

    `ids_train` names each training example for good: an ensemble assigns an example to its member by a keyed
    hash of its id (data/partition.py), so an example's id must not depend on the others. Without ids of its own
    a data set's are digests of each example's content (its image and label, and which copy it is where several
    are identical): adding, removing or replacing one example moves no other (`ids_source` says which).
    """

    name: str
    x_train: torch.Tensor  # float32, (N, C, H, W), values in [-1, 1]
    y_train: torch.Tensor  # int64, (N,), values in [0, num_classes)
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    source: str  # where the data came from and how it was split, one sentence; shown in reports
    ids_train: torch.Tensor | None = None  # int64 (N,), unique; None becomes digests of each example's content
    # the training split's size as a public figure: a built-in data set's documented size, or what an .npz declares
    # (`declared_size`); None: unknown, and nothing released may be computed from the exact count
    declared_size: int | None = None
    ids_source: str = "given"  # where the ids come from: the data's own ("given"), or CONTENT_IDS
    # each label's name, in label order, published with every model like num_classes (a folder's class folders, an
    # .npz's class_names, a built-in set's documented names); () becomes the labels themselves: "0", "1", ...
    class_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.num_classes, int) or self.num_classes < 1:
            raise DatasetError(f"{self.name}: num_classes must be a positive integer, got {self.num_classes!r}")
        object.__setattr__(self, "class_names", checked_class_names(self.name, self.class_names, self.num_classes))
        for split in SPLITS:
            images, labels = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            if images.dtype != torch.float32 or images.dim() != 4:
                raise DatasetError(f"{self.name}: x_{split} must be float32 (N, C, H, W), got {images.dtype} "
                                   f"{tuple(images.shape)}; build data sets with from_arrays")
            if labels.dtype != torch.int64 or labels.shape != (len(images),):
                raise DatasetError(f"{self.name}: y_{split} must be int64 of shape ({len(images)},) to match "
                                   f"x_{split}, got {labels.dtype} {tuple(labels.shape)}")
            if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
                raise DatasetError(f"{self.name}: y_{split} has labels outside [0, {self.num_classes}): "
                                   f"relabel the classes as 0..{self.num_classes - 1} or raise num_classes")
        if self.x_train.shape[1:] != self.x_test.shape[1:]:
            raise DatasetError(f"{self.name}: train images {tuple(self.x_train.shape[1:])} and test images "
                               f"{tuple(self.x_test.shape[1:])} differ in shape; give both splits the same size")
        if self.ids_train is None:
            object.__setattr__(self, "ids_train", content_ids(self.x_train, self.y_train))
            object.__setattr__(self, "ids_source", CONTENT_IDS)
        ids = self.ids_train
        if ids.dtype != torch.int64 or ids.shape != (len(self.y_train),):
            raise DatasetError(f"{self.name}: ids_train must be int64 of shape ({len(self.y_train)},), one id per "
                               f"training image, got {ids.dtype} {tuple(ids.shape)}")
        repeated = len(ids) - len(torch.unique(ids))
        if repeated:
            raise DatasetError(f"{self.name}: ids_train repeats {repeated} ids: give each training image its own id")

    @functools.cached_property
    def digest(self) -> str:
        """A digest of the training split's images and labels: the key of the data set's release ledger. The same
        images and labels give the same digest whatever the name or file; a subset, a superset or a changed copy
        another."""
        digest = hashlib.blake2b(digest_size=16)
        for tensor in (self.x_train, self.y_train):
            digest.update(str(tuple(tensor.shape)).encode())
            digest.update(tensor.contiguous().numpy().tobytes())
        return digest.hexdigest()

    @functools.cached_property
    def example_ids(self) -> torch.Tensor:
        """Each training example's content id (`content_ids`), whatever `ids_train` holds: what the ledger of the
        individuals in the data (privacy/individuals.py) keys a release by, so that a shuffled copy, a subset or a
        merge of these data meets the releases made from them."""
        return self.ids_train if self.ids_source == CONTENT_IDS else content_ids(self.x_train, self.y_train)

    def train_subset(self, index: torch.Tensor | slice) -> ImageDataset:
        """The training examples at positions `index` with their ids (which dataclasses.replace on the images
        alone would leave behind), and the same test split."""
        return dataclasses.replace(self, x_train=self.x_train[index], y_train=self.y_train[index],
                                   ids_train=self.ids_train[index])

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W): what a model is built for."""
        channels, height, width = (int(size) for size in self.x_train.shape[1:])
        return channels, height, width

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary for reports, so a reader knows exactly which data a result is about."""
        return {"name": self.name, "input_shape": list(self.input_shape), "num_classes": self.num_classes,
                "class_names": list(self.class_names), "n_train": len(self.y_train), "n_test": len(self.y_test),
                "source": self.source, "normalisation": NORMALISATION}


def checked_class_names(name: str, class_names: Sequence[str], num_classes: int) -> tuple[str, ...]:
    """One distinct, non-empty name a class (the labels themselves where none are given), refused otherwise."""
    if not class_names:
        return label_names(num_classes)
    names = tuple(class_names)
    if len(names) != num_classes:
        raise DatasetError(f"{name}: {len(names)} class names for {num_classes} classes: give one name a class, in "
                           f"label order")
    if not all(isinstance(class_name, str) and class_name for class_name in names) or len(set(names)) < len(names):
        raise DatasetError(f"{name}: class names must be distinct, non-empty strings, got {list(names)[:12]}")
    return names


def label_names(num_classes: int) -> tuple[str, ...]:
    """The names of classes that have none but their labels: "0", "1", ..."""
    return tuple(str(label) for label in range(num_classes))


def class_label(label: int, class_names: Sequence[str]) -> str:
    """A class as a message names it: its label, with its name where it has one other than the label itself."""
    name = class_names[label] if 0 <= label < len(class_names) else str(label)
    return str(label) if name == str(label) else f"{label} ({name})"


def content_ids(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """One id per example from its content alone: a 63-bit digest of its image, its label and which copy of that
    pair it is (identical examples get the ids of their first, second, ... copy), so that no example's id depends
    on another's position."""
    copies: dict[bytes, int] = {}
    ids = []
    pixels = images.contiguous().numpy().reshape(len(images), -1)
    for row, label in zip(pixels, labels.tolist()):
        content = row.tobytes() + label.to_bytes(8, "little")
        copy = copies.get(content, 0)
        copies[content] = copy + 1
        digest = hashlib.blake2b(content + copy.to_bytes(8, "little"), digest_size=8).digest()
        ids.append(int.from_bytes(digest, "little") >> 1)
    return torch.tensor(ids, dtype=torch.int64)


def images_to_tensor(name: str, field: str, images: Any) -> torch.Tensor:
    """uint8 0..255 or floats in [0, 1], as (N,H,W), (N,H,W,C) or (N,C,H,W) -> float32 NCHW in [-1, 1]."""
    images = np.asarray(images)
    if images.dtype.kind not in "iuf":
        raise DatasetError(f"{name}: {field} has dtype {images.dtype}: expected uint8 (0..255) or float (0..1) images")
    if images.ndim == 3:
        images = images[:, None]
    elif images.ndim == 4 and images.shape[-1] in (1, 3) and images.shape[1] not in (1, 3):
        images = images.transpose(0, 3, 1, 2)
    elif not (images.ndim == 4 and images.shape[1] in (1, 3)):
        raise DatasetError(f"{name}: {field} has shape {images.shape}: expected (N, H, W), (N, H, W, C) or "
                           f"(N, C, H, W) with C in {{1, 3}}")
    if images.dtype.kind in "iu":
        scale, allowed = 255.0, "integers in 0..255"
    else:
        scale, allowed = 1.0, "floats in [0, 1]"
    if images.dtype.kind == "f" and images.size and not np.isfinite(images).all():
        bad = int((~np.isfinite(images)).reshape(len(images), -1).any(1).sum())
        what = "NaN" if np.isnan(images).any() else "infinite values"
        raise DatasetError(f"{name}: {field} holds {what} in {bad} image(s): remove or repair them")
    if images.size and not (images.min() >= 0 and images.max() <= scale):
        raise DatasetError(f"{name}: {field} has values outside {allowed} (min {images.min()}, max {images.max()}): "
                           f"rescale the images")
    values = images.astype(np.float32, order="C")  # also makes an NHWC input contiguous NCHW
    values /= scale  # exact at 0 and at the maximum, so the range is exactly [-1, 1]
    values *= 2
    values -= 1
    return torch.from_numpy(values)


def _labels_to_tensor(name: str, field: str, labels: Any) -> torch.Tensor:
    """Integer class indices >= 0 as int64."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise DatasetError(f"{name}: {field} must be a 1-D integer array of class indices, got {labels.dtype} "
                           f"{labels.shape}")
    if labels.size and labels.min() < 0:
        raise DatasetError(f"{name}: {field} has negative labels (min {labels.min()}): classes must be 0, 1, ...")
    return torch.from_numpy(labels.astype(np.int64))


def _ids_to_tensor(name: str, ids: Any) -> torch.Tensor:
    """Integer example ids as int64 (their uniqueness and length are checked by ImageDataset)."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise DatasetError(f"{name}: ids_train must be a 1-D integer array, one stable id per training image, got "
                           f"{ids.dtype} {ids.shape}")
    return torch.from_numpy(ids.astype(np.int64))


def from_arrays(name: str, x_train: Any, y_train: Any, x_test: Any, y_test: Any, source: str,
                num_classes: int | None = None, ids_train: Any = None, declared_size: Any = None,
                class_names: Sequence[str] = ()) -> ImageDataset:
    """Build a dataset from numpy arrays, so every source shares one set of checks and one normalisation.

    num_classes defaults to the number of class names where they are given, else to the largest test label + 1
    (the public labels: it is published with every model); ids_train (each training example's stable id, see
    ImageDataset) to digests of each example's content.
    """
    images = {split: images_to_tensor(name, f"x_{split}", x) for split, x in zip(SPLITS, (x_train, x_test))}
    labels = {split: _labels_to_tensor(name, f"y_{split}", y) for split, y in zip(SPLITS, (y_train, y_test))}
    for split in SPLITS:
        if len(images[split]) != len(labels[split]):
            raise DatasetError(f"{name}: x_{split} has {len(images[split])} images but y_{split} has "
                               f"{len(labels[split])} labels; give one label per image")
        if len(images[split]) == 0:
            raise DatasetError(f"{name}: the {split} split is empty; give it at least one image")
    if num_classes is None and class_names:
        num_classes = len(class_names)
    if num_classes is None:  # from the public labels only: a class only the private labels hold stays private
        num_classes = int(labels["test"].max()) + 1
        if int(labels["train"].max()) >= num_classes:
            raise DatasetError(f"{name}: y_train holds class {int(labels['train'].max())}, which no test label holds: "
                               f"the number of classes is published with every model, so it must not come from the "
                               f"private labels; declare it (num_classes or class_names in the .npz), or relabel")
    names = checked_class_names(name, class_names, num_classes)
    check_classes(name, labels["train"], names)
    ids = None if ids_train is None else _ids_to_tensor(name, ids_train)
    return ImageDataset(name, images["train"], labels["train"], images["test"], labels["test"], num_classes, source,
                        ids, None if declared_size is None else _declared_size(name, declared_size),
                        class_names=names)


def check_classes(name: str, y_train: torch.Tensor, class_names: Sequence[str]) -> None:
    """Refuse training data of one class (nothing to tell apart: any model is "100%" on it); warn of a class with
    no training example (a model can never predict it: often labels not numbered 0..K-1). Classes are named by
    label and name."""
    present = torch.unique(y_train)
    if len(present) < 2:
        raise DatasetError(f"{name}: every training image is of class {class_label(int(present[0]), class_names)}: "
                           f"a classifier needs at least two classes")
    missing = sorted(set(range(len(class_names))) - set(present.tolist()))
    if missing:
        shown = ", ".join(class_label(label, class_names) for label in missing[:10]) + (
            ", ..." if len(missing) > 10 else "")
        warnings.warn(f"{name}: class(es) {shown} of {len(class_names)} have no training image, so no model learns "
                      f"them; if the labels are not numbered 0..K-1, relabel them", stacklevel=2)


def _declared_size(name: str, value: Any) -> int:
    """A declared training-set size: one positive integer."""
    value = np.asarray(value)
    if value.ndim != 0 or value.dtype.kind not in "iu" or int(value) < 1:
        raise DatasetError(f"{name}: declared_size must be one positive integer (the training split's size as you "
                           f"publish it), got {value!r}")
    return int(value)
