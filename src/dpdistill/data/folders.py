"""Image folders as a data source: `DIR/train/CLASS/*.png|jpg|...` and `DIR/test/CLASS/*`, torchvision's
ImageFolder layout per split, read with Pillow. The class folders' names, sorted, give the label order and the
classes' names, so they are part of what a model publishes; both splits must name the same classes (a folder in one
split only is most often a misspelling, which would become a class of its own).

Every image of a folder must have one size unless a size is asked for (`size`: each image resized to it); the
channels are one (grey) where every image is grey, else three (RGB, with a warning where grey and colour images
mix: a few colour images would triple the cost of a grey data set), unless asked for. Reading tens of thousands
of files takes a while: `dpdistill data import FOLDER --out data.npz` reads them once into an .npz that every
command then loads in a second."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from dpdistill.errors import DatasetError
from dpdistill.reporting.report import list_classes

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
SPLIT_FOLDERS = ("train", "test")
GREY_MODES = ("1", "L", "I", "I;16", "F")  # Pillow's single-channel modes


def is_image_folder(folder: Path) -> bool:
    """Whether `folder` holds the two split folders of the ImageFolder layout."""
    return all((folder / split).is_dir() for split in SPLIT_FOLDERS)


def class_names(folder: Path) -> list[str]:
    """The classes: the class folders both splits hold, sorted (hidden folders aside); a class folder in one split
    only is refused, naming it and the other split's classes."""
    held = {split: {entry.name for entry in (folder / split).iterdir()
                    if entry.is_dir() and not entry.name.startswith(".")} for split in SPLIT_FOLDERS}
    alone = _in_one_split_only(folder, held)
    if alone:
        raise DatasetError(f"class folders in one split only: {'; '.join(alone)}. Both splits must name the same "
                           f"classes (a misspelt folder would otherwise be a class of its own): rename or remove them")
    names = held[SPLIT_FOLDERS[0]]
    if len(names) < 2:
        raise DatasetError(f"{folder} has {len(names)} class folder(s) under train/ and test/: an image folder needs "
                           f"at least two, as {folder}/train/CLASS/*.png and {folder}/test/CLASS/*.png")
    return sorted(names)


def _in_one_split_only(folder: Path, held: dict[str, set[str]]) -> list[str]:
    """Each split's class folders the other split lacks, with the other split's classes."""
    found = []
    for split, other in zip(SPLIT_FOLDERS, reversed(SPLIT_FOLDERS)):
        extra = sorted(held[split] - held[other])
        if extra:
            classes = (f"whose classes are {list_classes(sorted(held[other]))}" if held[other]
                       else "which holds no class folder")
            found.append(f"{', '.join(str(folder / split / name) for name in extra)} (not in {other}/, {classes})")
    return found


def _image_files(folder: Path, split: str, classes: list[str]) -> list[tuple[Path, int]]:
    files = [(path, label) for label, name in enumerate(classes) for path in sorted((folder / split / name).iterdir())
             if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        raise DatasetError(f"{folder / split} holds no images ({', '.join(IMAGE_SUFFIXES)}) in its class folders")
    return files


def read_image_folder(folder: Path, size: tuple[int, int] | None = None, channels: int | None = None
                      ) -> tuple[dict[str, np.ndarray], list[str]]:
    """x_train, y_train, x_test, y_test as uint8 arrays (N, H, W, C) and the class names; `size` (height, width)
    resizes every image, `channels` (1 or 3) converts it."""
    from PIL import Image, UnidentifiedImageError

    classes = class_names(folder)
    files = {split: _image_files(folder, split, classes) for split in SPLIT_FOLDERS}
    if channels is None:
        channels = _channels(folder, [path for split in SPLIT_FOLDERS for path, _ in files[split]])
    if channels not in (1, 3):
        raise DatasetError(f"channels must be 1 (grey) or 3 (RGB), got {channels}")
    arrays: dict[str, np.ndarray] = {}
    for split in SPLIT_FOLDERS:
        images = []
        for path, _ in files[split]:
            try:
                with Image.open(path) as image:
                    image = image.convert("L" if channels == 1 else "RGB")
                    if size is not None and image.size != (size[1], size[0]):
                        image = image.resize((size[1], size[0]), Image.Resampling.BILINEAR)
                    images.append(np.asarray(image, dtype=np.uint8).reshape(image.size[1], image.size[0], channels))
            except (OSError, UnidentifiedImageError) as error:
                raise DatasetError(f"cannot read {path} as an image ({error}): remove or replace it") from error
        shapes = {image.shape[:2] for image in images}
        if len(shapes) > 1:
            sizes = ", ".join(f"{h}x{w}" for h, w in sorted(shapes)[:4]) + (", ..." if len(shapes) > 4 else "")
            raise DatasetError(f"{folder / split} holds images of several sizes ({sizes}): resize them all to one "
                               f"with `dpdistill data import {folder} --size HxW --out data.npz`")
        arrays[f"x_{split}"] = np.stack(images)
        arrays[f"y_{split}"] = np.array([label for _, label in files[split]], dtype=np.int64)
    if arrays["x_train"].shape[1:] != arrays["x_test"].shape[1:]:
        raise DatasetError(f"{folder}: train images are {_size(arrays['x_train'])} and test images "
                           f"{_size(arrays['x_test'])}: give both splits one size (`dpdistill data import {folder} "
                           f"--size HxW --out data.npz`)")
    return arrays, classes


def _channels(folder: Path, paths: list[Path]) -> int:
    """1 where every image is grey, else 3; a mix is warned about, with its counts and the way to one channel."""
    grey = sum(_mode(path) in GREY_MODES for path in paths)
    colour = len(paths) - grey
    if grey and colour:
        warnings.warn(f"{folder} holds {colour:,} colour and {grey:,} grey images, so every image is read as RGB: a "
                      f"3-channel model, slower, with 3 times the feature cache of grey; if the data are grey, "
                      f"convert the colour ones to grey, or read the folder as grey with `dpdistill data "
                      f"import {folder} --channels 1 --out data.npz`", stacklevel=3)
    return 1 if not colour else 3


def _mode(path: Path) -> str:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return image.mode
    except (OSError, UnidentifiedImageError) as error:
        raise DatasetError(f"cannot read {path} as an image ({error}): remove or replace it") from error


def _size(images: np.ndarray) -> str:
    return f"{images.shape[1]}x{images.shape[2]}"


def parse_size(text: str) -> tuple[int, int]:
    """`HxW` (or one number for a square) as (height, width)."""
    parts = text.lower().split("x")
    try:
        height, width = (int(parts[0]), int(parts[0])) if len(parts) == 1 else (int(parts[0]), int(parts[1]))
    except ValueError:
        raise DatasetError(f"--size must be HxW (e.g. 32x32), got {text!r}") from None
    if len(parts) > 2 or height < 1 or width < 1:
        raise DatasetError(f"--size must be HxW with positive sides (e.g. 32x32), got {text!r}")
    return height, width
