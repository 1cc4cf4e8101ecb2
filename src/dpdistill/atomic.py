"""Atomic file writes: a crash mid-write leaves the previous files intact and no partial file under a real name."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


def write_atomically(writers: dict[Path, Callable[[Path], None]]) -> None:
    """Call each writer on a temporary name next to its target, then rename every file into place."""
    temporaries = {path: path.with_name(path.name + ".tmp") for path in writers}
    try:
        for path, write in writers.items():
            write(temporaries[path])
    except BaseException:
        for temporary in temporaries.values():
            temporary.unlink(missing_ok=True)
        raise
    for path, temporary in temporaries.items():
        os.replace(temporary, path)
