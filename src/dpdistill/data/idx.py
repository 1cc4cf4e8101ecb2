"""IDX files (the MNIST format): 2 zero bytes, a type byte, a dims byte, big-endian uint32 dims, raw data."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from dpdistill.errors import DatasetError

UNSIGNED_BYTE = 0x08


def read_idx(path: Path) -> np.ndarray:
    """Read a (gzipped) IDX file of unsigned bytes; anything malformed is a DatasetError naming the file."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as error:
        raise DatasetError(f"cannot read IDX file {path}: {error}") from error
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DatasetError(f"{path} is not an IDX file (bad magic number)")
    if raw[2] != UNSIGNED_BYTE:
        raise DatasetError(f"{path}: IDX data type 0x{raw[2]:02x} is not supported (only unsigned bytes, 0x08)")
    dims = raw[3]
    header = 4 + 4 * dims
    if len(raw) < header:
        raise DatasetError(f"{path} is truncated (header)")
    shape = struct.unpack(f">{dims}I", raw[4:header])
    expected = int(np.prod(shape))
    if len(raw) - header != expected:
        raise DatasetError(f"{path} holds {len(raw) - header} data bytes, its header announces {expected}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write unsigned bytes as IDX (gzipped when the name ends in .gz)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    raw = bytes([0, 0, UNSIGNED_BYTE, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()
    path.write_bytes(gzip.compress(raw) if path.suffix == ".gz" else raw)
