"""One in-memory form for every data set: float32 NCHW images in [-1, 1] and int64 labels."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dpdistill.errors import DatasetError

NORMALISATION = "[-1, 1] (x / max * 2 - 1)"


@dataclass(frozen=True)
class ImageDataset:
    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    source: str  # where the data came from and how it was split; shown in reports

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            images, labels = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            if images.dtype != torch.float32 or images.dim() != 4:
                raise DatasetError(f"{self.name}: x_{split} must be float32 (N, C, H, W), got {images.dtype} "
                                   f"{tuple(images.shape)}")
            if labels.dtype != torch.int64 or labels.shape != (len(images),):
                raise DatasetError(f"{self.name}: y_{split} must be int64 of length {len(images)}, got "
                                   f"{labels.dtype} {tuple(labels.shape)}")
            if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
                raise DatasetError(f"{self.name}: y_{split} has labels outside [0, {self.num_classes})")
        if self.x_train.shape[1:] != self.x_test.shape[1:]:
            raise DatasetError(f"{self.name}: train images {tuple(self.x_train.shape[1:])} and test images "
                               f"{tuple(self.x_test.shape[1:])} differ in shape")

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.x_train.shape[1:])

    def describe(self) -> dict:
        return {"name": self.name, "input_shape": list(self.input_shape), "num_classes": self.num_classes,
                "n_train": len(self.y_train), "n_test": len(self.y_test), "source": self.source,
                "normalisation": NORMALISATION}


def _images_to_tensor(name: str, field: str, images: np.ndarray) -> torch.Tensor:
    """uint8 0..255 or floats in [0, 1], as (N,H,W), (N,H,W,C) or (N,C,H,W) -> float32 NCHW in [-1, 1]."""
    if images.dtype == object or not (np.issubdtype(images.dtype, np.integer) or np.issubdtype(images.dtype, np.floating)):
        raise DatasetError(f"{name}: {field} has dtype {images.dtype}; expected uint8 or float images")
    if images.ndim == 3:
        images = images[:, None]
    elif images.ndim == 4 and images.shape[-1] in (1, 3) and images.shape[1] not in (1, 3):
        images = images.transpose(0, 3, 1, 2)
    elif not (images.ndim == 4 and images.shape[1] in (1, 3)):
        raise DatasetError(f"{name}: {field} has shape {images.shape}: expected (N, H, W), (N, H, W, C) or (N, C, H, W)")
    values = images.astype(np.float32)
    if np.issubdtype(images.dtype, np.integer):
        values /= 255.0
    if values.size and (values.min() < 0 or values.max() > 1):
        raise DatasetError(f"{name}: {field} values must be 0..255 integers or floats in [0, 1]")
    return torch.from_numpy(np.ascontiguousarray(values * 2 - 1))


def _labels_to_tensor(name: str, field: str, labels: np.ndarray) -> torch.Tensor:
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DatasetError(f"{name}: {field} must be a 1-D integer array, got {labels.dtype} {labels.shape}")
    if labels.size and labels.min() < 0:
        raise DatasetError(f"{name}: {field} has negative labels")
    return torch.from_numpy(labels.astype(np.int64))


def from_arrays(name: str, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
                source: str, num_classes: int | None = None) -> ImageDataset:
    """Build a dataset from numpy arrays, checking shapes, ranges and lengths with clear messages."""
    for field, images, labels in (("train", x_train, y_train), ("test", x_test, y_test)):
        if len(images) != len(labels):
            raise DatasetError(f"{name}: x_{field} has {len(images)} images but y_{field} has {len(labels)} labels")
        if len(images) == 0:
            raise DatasetError(f"{name}: the {field} split is empty")
    train_labels, test_labels = _labels_to_tensor(name, "y_train", y_train), _labels_to_tensor(name, "y_test", y_test)
    if num_classes is None:
        num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    return ImageDataset(name, _images_to_tensor(name, "x_train", x_train), train_labels,
                        _images_to_tensor(name, "x_test", x_test), test_labels, num_classes, source)
