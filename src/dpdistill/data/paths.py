"""Where data lives on this machine: one place for the cache folder and the Fashion-MNIST folder."""

from __future__ import annotations

import os
from pathlib import Path

FMNIST_DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")


def data_home() -> Path:
    """Folder for fetched data: $DPDISTILL_HOME/data, with DPDISTILL_HOME defaulting to ~/.cache/dpdistill.

    An environment variable rather than a fixed path, so tests and shared machines can point elsewhere.
    """
    home = os.environ.get("DPDISTILL_HOME") or Path.home() / ".cache" / "dpdistill"
    return Path(home).expanduser() / "data"


def fmnist_dir() -> Path:
    """The Debian package's folder, or $DPDISTILL_FMNIST_DIR for a copy elsewhere."""
    return Path(os.environ.get("DPDISTILL_FMNIST_DIR") or FMNIST_DEFAULT_DIR).expanduser()
