"""IDX files: round trips and clear errors on files the tests write."""

from pathlib import Path

import numpy as np
import pytest

from dpdistill.data.idx import read_idx, write_idx
from dpdistill.errors import DatasetError


@pytest.mark.parametrize("name", ["images.idx", "images.idx.gz"])
def test_round_trip(tmp_path: Path, name: str):
    array = np.random.default_rng(0).integers(0, 256, (5, 4, 3), dtype=np.uint8)
    write_idx(tmp_path / name, array)
    assert (tmp_path / name).read_bytes()[:2] == (b"\x1f\x8b" if name.endswith(".gz") else b"\0\0")
    assert np.array_equal(read_idx(tmp_path / name), array)
    assert np.array_equal(read_idx(str(tmp_path / name)), array)


def test_gzip_is_recognised_by_content_not_name(tmp_path: Path):
    write_idx(tmp_path / "labels.gz", np.arange(7, dtype=np.uint8))
    (tmp_path / "labels.gz").rename(tmp_path / "labels")
    assert read_idx(tmp_path / "labels").tolist() == list(range(7))


@pytest.mark.parametrize("content, message", [
    (b"\x01\x02\x08\x01abc", "bad magic"),
    (b"\0\0", "bad magic"),
    (b"", "bad magic"),
    (bytes([0, 0, 0x0D, 1, 0, 0, 0, 1]) + b"\0\0\0\0", r"0x0d is not supported"),
    (bytes([0, 0, 0x08, 3, 0, 0, 0, 2]), "truncated"),
    (bytes([0, 0, 0x08, 2, 0, 0, 0, 2, 0, 0, 0, 3]) + b"\0" * 5, "holds 5 data bytes, its header announces 6"),
    (bytes([0, 0, 0x08, 1, 0, 0, 0, 2]) + b"\0" * 3, "holds 3 data bytes"),
])
def test_corrupt_files_are_errors_naming_the_file(tmp_path: Path, content: bytes, message: str):
    path = tmp_path / "broken-idx"
    path.write_bytes(content)
    with pytest.raises(DatasetError, match=message) as caught:
        read_idx(path)
    assert str(path) in str(caught.value)


def test_truncated_and_corrupt_gzip(tmp_path: Path):
    write_idx(tmp_path / "a.gz", np.zeros((50, 50), dtype=np.uint8))
    data = (tmp_path / "a.gz").read_bytes()
    (tmp_path / "short.gz").write_bytes(data[: len(data) // 2])
    (tmp_path / "garbled.gz").write_bytes(data[:10] + b"\xff" * (len(data) - 10))
    for name in ("short.gz", "garbled.gz"):
        with pytest.raises(DatasetError, match=f"cannot read IDX file .*{name}"):
            read_idx(tmp_path / name)


def test_missing_file(tmp_path: Path):
    with pytest.raises(DatasetError, match="absent"):
        read_idx(tmp_path / "absent")


def test_write_refuses_what_it_cannot_store(tmp_path: Path):
    with pytest.raises(DatasetError, match="uint8"):
        write_idx(tmp_path / "x", np.full(3, 300))
