"""IDX files (the MNIST format): 2 zero bytes, a type byte, a dims byte, big-endian uint32 dims, raw data."""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

from dpdistill.errors import DatasetError

UNSIGNED_BYTE = 0x08
GZIP_MAGIC = b"\x1f\x8b"


def read_idx(path: str | Path) -> np.ndarray:
    """Read a raw or gzipped IDX file of unsigned bytes; anything malformed is a DatasetError naming the file.

    Gzip is recognised by its magic bytes, not the file name, so a renamed file still loads.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
        if raw.startswith(GZIP_MAGIC):
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as error:  # gzip.BadGzipFile is an OSError
        raise DatasetError(f"cannot read IDX file {path}: {error}; fetch it again") from error
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[3] == 0:
        raise DatasetError(f"{path} is not an IDX file (bad magic number {raw[:4].hex() or 'none'})")
    if raw[2] != UNSIGNED_BYTE:
        raise DatasetError(f"{path}: IDX data type 0x{raw[2]:02x} is not supported (only unsigned bytes, 0x08); "
                           f"convert the data to uint8 or give an .npz file")
    dims = raw[3]
    header = 4 + 4 * dims
    if len(raw) < header:
        raise DatasetError(f"{path} is truncated: its header announces {dims} dimensions but the file ends first")
    shape = struct.unpack(f">{dims}I", raw[4:header])
    expected = int(np.prod(shape))
    if len(raw) - header != expected:
        raise DatasetError(f"{path} holds {len(raw) - header} data bytes, its header announces {expected} "
                           f"(shape {shape}): the file is truncated or corrupt; fetch it again")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write unsigned bytes as IDX, gzipped when the name ends in .gz (used by tests and to export data)."""
    path = Path(path)
    if array.dtype != np.uint8 or array.ndim == 0:
        raise DatasetError(f"write_idx writes uint8 arrays of at least one dimension, got {array.dtype} "
                           f"{array.shape}: convert with np.asarray(array, dtype=np.uint8) first")
    array = np.ascontiguousarray(array)
    raw = bytes([0, 0, UNSIGNED_BYTE, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()
    path.write_bytes(gzip.compress(raw) if path.suffix == ".gz" else raw)
