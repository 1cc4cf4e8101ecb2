"""Settings chosen by looking at a data set: a use of that data which no epsilon of a run on it covers.

Each choice names the data it was made on by its digest (ImageDataset.digest: the training images and labels), not
its name, so that a run on the same images and labels under any name or file (an IDX folder, an .npz) is told so,
and a run on other data is told that the settings are a fixed public choice for it. The notes go into the run's
`privacy` section (`selection`) and into the provenance of every model it releases, so that a transcription of
such a model repeats them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

SELECTION = "selection"  # the key of a report's `privacy` section (and of a provenance) that holds the notes
# ImageDataset.digest of the data sets settings were chosen on (tests/privacy/test_selection.py checks them)
FASHION_MNIST = "043303d0c1bb74d1950516957184232f"  # `fmnist`: Fashion-MNIST's 60,000 training images
MNIST_SET = "b548fcb0a07d3e9de0e63f29f03c863b"  # `mnist`: the 8,000 training images of the MNIST set


@dataclass(frozen=True)
class Selection:
    """Settings (`settings`, described as `what`) chosen by looking at the data whose digest is `digest` (`data`:
    which data, and how it was read)."""

    what: str
    settings: dict[str, Any]  # the values chosen; a run uses the choice where all of them hold
    data: str
    digest: str

    def used_by(self, values: dict[str, Any]) -> bool:
        return all(values.get(key) == value for key, value in self.settings.items())

    def note(self, digest: str | None) -> str:
        """What a run using these settings on the data of `digest` (None: unknown) must say."""
        chosen = f"{self.what} were chosen on {self.data}"
        if digest is None:
            return chosen
        if digest == self.digest:
            return f"{chosen}, which is this private data (same digest): a use of it that no epsilon here covers"
        return f"{chosen}: a fixed public choice for this data"


def selection_notes(selections: Iterable[Selection], values: dict[str, Any], digest: str | None) -> list[str]:
    """The notes of every choice among `selections` a run with settings `values` on the data of `digest` uses."""
    return [selection.note(digest) for selection in selections if selection.used_by(values)]


def with_selection(privacy: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """`privacy` with `notes` after the notes it holds already (a DP teacher's, inherited)."""
    kept = list(privacy.get(SELECTION, ())) + [note for note in notes if note not in privacy.get(SELECTION, ())]
    return {**privacy, SELECTION: kept} if kept else privacy
