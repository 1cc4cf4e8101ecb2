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

from helpers import write_image_folder


def test_an_image_folder_is_a_data_set_with_sorted_class_names_as_labels(tmp_path: Path):
    dataset = load_dataset(str(write_image_folder(tmp_path / "pets")))
    assert dataset.input_shape == (3, 12, 10) and dataset.num_classes == 3
    assert len(dataset.y_train) == 18 and len(dataset.y_test) == 6
    assert "classes 0 cat, 1 dog, 2 emu" in dataset.source and dataset.class_names == ("cat", "dog", "emu")
    for label in range(3):  # cat (level 40) is label 0, dog 1, emu 2: brighter with the label
        mean = dataset.x_train[dataset.y_train == label].mean().item()
        assert abs((mean + 1) / 2 * 255 - 40 * (label + 1)) < 3


def test_grey_images_give_one_channel(tmp_path: Path):
    assert load_dataset(str(write_image_folder(tmp_path / "grey", mode="L"))).input_shape == (1, 12, 10)


def test_a_class_folder_in_one_split_only_is_refused_naming_it_and_the_other_splits_classes(tmp_path: Path):
    root = write_image_folder(tmp_path / "pets")
    (root / "test" / "dgo").mkdir()
    Image.fromarray(np.zeros((12, 10, 3), dtype=np.uint8)).save(root / "test" / "dgo" / "0.png")
    with pytest.raises(DatasetError) as refused:
        load_dataset(str(root))
    assert str(refused.value) == (f"class folders in one split only: {root / 'test' / 'dgo'} (not in train/, whose "
                                  f"classes are cat, dog, emu). Both splits must name the same classes (a misspelt "
                                  f"folder would otherwise be a class of its own): rename or remove them")
    (root / "train" / "owl").mkdir()
    with pytest.raises(DatasetError, match=r"train/owl \(not in test/, whose classes are cat, dgo, dog, emu\); "
                                           r".*test/dgo \(not in train/, whose classes are cat, dog, emu, owl\)"):
        load_dataset(str(root))


def test_grey_and_colour_images_mixed_are_read_as_rgb_with_a_warning_naming_the_counts(tmp_path: Path):
    root = write_image_folder(tmp_path / "scans", mode="L")
    Image.fromarray(np.zeros((12, 10, 3), dtype=np.uint8)).save(root / "train" / "cat" / "colour.png")
    with pytest.warns(UserWarning) as warned:
        dataset = load_dataset(str(root))
    assert dataset.input_shape == (3, 12, 10)
    assert [str(warning.message) for warning in warned] == [
        f"{root} holds 1 colour and 24 grey images, so every image is read as RGB: a 3-channel model, slower, with "
        f"3 times the feature cache of grey; if the data are grey, convert the colour ones to grey, or read the "
        f"folder as grey with `dpdistill data import {root} --channels 1 --out data.npz`"]
    result = CliRunner().invoke(app, ["data", "import", str(root), "--out", str(tmp_path / "grey.npz"),
                                      "--channels", "1"])
    assert result.exit_code == 0 and "warning" not in result.stderr  # a channel count asked for is not warned about
    assert load_dataset(str(tmp_path / "grey.npz")).input_shape == (1, 12, 10)


def test_images_of_several_sizes_are_refused_with_the_import_that_resizes_them(tmp_path: Path):
    root = write_image_folder(tmp_path / "mixed")
    Image.fromarray(np.zeros((20, 20, 3), dtype=np.uint8)).save(root / "train" / "cat" / "big.png")
    with pytest.raises(DatasetError, match=r"several sizes \(12x10, 20x20\): resize them all to one with "
                                           r"`dpdistill data import .* --size HxW --out data.npz`"):
        load_dataset(str(root))


def test_an_unreadable_image_is_named(tmp_path: Path):
    root = write_image_folder(tmp_path / "broken")
    (root / "test" / "dog" / "bad.png").write_bytes(b"not a png")
    with pytest.raises(DatasetError, match=r"cannot read .*dog/bad.png as an image"):
        load_dataset(str(root))


def test_a_class_without_training_images_is_warned_about(tmp_path: Path):
    root = write_image_folder(tmp_path / "pets")
    for path in (root / "train" / "emu").iterdir():
        path.unlink()
    with pytest.warns(UserWarning, match=r"class\(es\) 2 \(emu\) of 3 have no training image"):
        dataset = load_dataset(str(root))
    assert dataset.num_classes == 3  # the test split's emu keeps its class


def test_data_import_resizes_into_an_npz_that_keeps_the_class_names(tmp_path: Path):
    root = write_image_folder(tmp_path / "pets")
    out = tmp_path / "pets.npz"
    runner = CliRunner()
    result = runner.invoke(app, ["data", "import", str(root), "--out", str(out), "--size", "8x8", "--channels", "1"])
    assert result.exit_code == 0, result.output
    assert "18 train and 6 test images of shape 8x8x1, 3 classes (cat, dog, emu)" in " ".join(result.stderr.split())
    imported, direct = load_dataset(str(out)), load_dataset(str(root))
    assert imported.input_shape == (1, 8, 8) and imported.num_classes == 3
    assert "classes 0 cat, 1 dog, 2 emu" in imported.source and imported.class_names == ("cat", "dog", "emu")
    assert torch.equal(imported.y_train, direct.y_train)
    again = runner.invoke(app, ["data", "import", str(root), "--out", str(out)])
    assert again.exit_code == 2 and again.stderr.startswith("error: --out") and "--overwrite" in again.stderr
    not_a_folder = runner.invoke(app, ["data", "import", str(root / "train"), "--out", str(tmp_path / "x.npz")])
    assert not_a_folder.exit_code == 2 and "is not a folder of images by class" in not_a_folder.stderr
    bad_size = runner.invoke(app, ["data", "import", str(root), "--out", str(tmp_path / "y.npz"), "--size", "3y"])
    assert bad_size.stderr == "error: --size must be HxW (e.g. 32x32), got '3y'\n"
    assert not (tmp_path / "x.npz").exists() and not (tmp_path / "y.npz").exists()


def test_data_import_declares_the_training_set_size_the_user_publishes(tmp_path: Path):
    root = write_image_folder(tmp_path / "pets")
    runner = CliRunner()
    result = runner.invoke(app, ["data", "import", str(root), "--out", str(tmp_path / "pets.npz"), "--dataset-size",
                                 "20"])
    assert result.exit_code == 0, result.output
    assert "3 classes (cat, dog, emu), declared training-set size 20" in " ".join(result.stderr.split())
    assert load_dataset(str(tmp_path / "pets.npz")).declared_size == 20  # not the 18 images it holds
    assert load_dataset(str(root)).declared_size is None  # the folder itself declares none
    with np.load(tmp_path / "pets.npz") as archive:
        assert int(archive["declared_size"]) == 20
    refused = runner.invoke(app, ["data", "import", str(root), "--out", str(tmp_path / "zero.npz"),
                                  "--dataset-size", "0"])
    assert refused.exit_code == 2 and not (tmp_path / "zero.npz").exists()
