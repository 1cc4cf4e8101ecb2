"""A folder of images by class (FOLDER/train/CLASS/*, FOLDER/test/CLASS/*) as a data set, and `data import`."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from dpdistill.cli.main import app
from dpdistill.data import load_dataset
from dpdistill.errors import DatasetError


def write_folder(root: Path, classes=("emu", "cat", "dog"), per_class=(6, 2), size=(12, 10), mode="RGB",
                 seed: int = 0) -> Path:
    """Random images, each class's pixels around its own grey level so that the labels can be checked."""
    rng = np.random.default_rng(seed)
    for split, count in zip(("train", "test"), per_class):
        for name in classes:
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            level = 40 * (sorted(classes).index(name) + 1)
            for index in range(count):
                pixels = np.clip(rng.normal(level, 5, (*size, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).convert(mode).save(folder / f"{index}.png")
    return root


def test_an_image_folder_is_a_data_set_with_sorted_class_names_as_labels(tmp_path: Path):
    dataset = load_dataset(str(write_folder(tmp_path / "pets")))
    assert dataset.input_shape == (3, 12, 10) and dataset.num_classes == 3
    assert len(dataset.y_train) == 18 and len(dataset.y_test) == 6
    assert "classes 0 cat, 1 dog, 2 emu" in dataset.source
    for label in range(3):  # cat (level 40) is label 0, dog 1, emu 2: brighter with the label
        mean = dataset.x_train[dataset.y_train == label].mean().item()
        assert abs((mean + 1) / 2 * 255 - 40 * (label + 1)) < 3


def test_grey_images_give_one_channel(tmp_path: Path):
    assert load_dataset(str(write_folder(tmp_path / "grey", mode="L"))).input_shape == (1, 12, 10)


def test_images_of_several_sizes_are_refused_with_the_import_that_resizes_them(tmp_path: Path):
    root = write_folder(tmp_path / "mixed")
    Image.fromarray(np.zeros((20, 20, 3), dtype=np.uint8)).save(root / "train" / "cat" / "big.png")
    with pytest.raises(DatasetError, match=r"several sizes \(12x10, 20x20\): resize them all to one with "
                                           r"`dpdistill data import .* --size HxW --out data.npz`"):
        load_dataset(str(root))


def test_an_unreadable_image_is_named(tmp_path: Path):
    root = write_folder(tmp_path / "broken")
    (root / "test" / "dog" / "bad.png").write_bytes(b"not a png")
    with pytest.raises(DatasetError, match=r"cannot read .*dog/bad.png as an image"):
        load_dataset(str(root))


def test_a_class_without_training_images_is_warned_about(tmp_path: Path):
    root = write_folder(tmp_path / "pets")
    for path in (root / "train" / "emu").iterdir():
        path.unlink()
    with pytest.warns(UserWarning, match=r"class\(es\) 2 of 3 have no training image"):
        dataset = load_dataset(str(root))
    assert dataset.num_classes == 3  # the test split's emu keeps its class


def test_data_import_resizes_into_an_npz_that_keeps_the_class_names(tmp_path: Path):
    root = write_folder(tmp_path / "pets")
    out = tmp_path / "pets.npz"
    runner = CliRunner()
    result = runner.invoke(app, ["data", "import", str(root), "--out", str(out), "--size", "8x8", "--channels", "1"])
    assert result.exit_code == 0, result.output
    assert "18 train and 6 test images of shape 8x8x1, 3 classes (cat, dog, emu)" in " ".join(result.stderr.split())
    imported, direct = load_dataset(str(out)), load_dataset(str(root))
    assert imported.input_shape == (1, 8, 8) and imported.num_classes == 3
    assert "classes 0 cat, 1 dog, 2 emu" in imported.source
    assert torch.equal(imported.y_train, direct.y_train)
    again = runner.invoke(app, ["data", "import", str(root), "--out", str(out)])
    assert again.exit_code == 2 and again.stderr.startswith("error: --out") and "--overwrite" in again.stderr
    not_a_folder = runner.invoke(app, ["data", "import", str(root / "train"), "--out", str(tmp_path / "x.npz")])
    assert not_a_folder.exit_code == 2 and "is not a folder of images by class" in not_a_folder.stderr
    bad_size = runner.invoke(app, ["data", "import", str(root), "--out", str(tmp_path / "y.npz"), "--size", "3y"])
    assert bad_size.stderr == "error: --size must be HxW (e.g. 32x32), got '3y'\n"
    assert not (tmp_path / "x.npz").exists() and not (tmp_path / "y.npz").exists()
