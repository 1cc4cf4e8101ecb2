"""Where dpdistill keeps things on this machine: the cache folder (fetched data, fixed transforms' features, the
data sets' ledgers) and the Fashion-MNIST folder."""

from __future__ import annotations

import os
from pathlib import Path

FMNIST_DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")


def dpdistill_home() -> Path:
    """$DPDISTILL_HOME, by default ~/.cache/dpdistill: an environment variable rather than a fixed path, so tests
    and shared machines can point elsewhere."""
    return Path(os.environ.get("DPDISTILL_HOME") or Path.home() / ".cache" / "dpdistill").expanduser()


def data_home() -> Path:
    """Folder for fetched data: $DPDISTILL_HOME/data."""
    return dpdistill_home() / "data"


def features_home() -> Path:
    """Folder for fixed transforms' outputs of data sets (scattering coefficients): $DPDISTILL_HOME/features.
    They are as private as the images they come from and stay beside them, never in a release."""
    return dpdistill_home() / "features"


def fmnist_dir() -> Path:
    """The Debian package's folder, or $DPDISTILL_FMNIST_DIR for a copy elsewhere."""
    return Path(os.environ.get("DPDISTILL_FMNIST_DIR") or FMNIST_DEFAULT_DIR).expanduser()


def ledgers_home() -> Path:
    """Folder of the data sets' release ledgers: $DPDISTILL_LEDGER_HOME, by default $DPDISTILL_HOME/ledgers (one
    folder per data set, named by its digest). A machine's record of what was released from each data set: keep it
    as long as the data."""
    return Path(os.environ.get("DPDISTILL_LEDGER_HOME") or dpdistill_home() / "ledgers").expanduser()
