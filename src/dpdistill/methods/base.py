"""The one interface every method implements, so that one lifecycle (lifecycle.py) runs them all.

A method says what it needs (a single teacher, an ensemble, or the private data), which paper it comes from and
which presets it has; it plans a run (the release it will make, known before the first query) and runs it,
handing back an `Outcome`: the public models, the report's figures, what its guarantee covers and what it read
without protection. Locking, resuming, the ledger, saving and reporting are the lifecycle's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

from torch import Tensor, nn

from dpdistill.data.base import ImageDataset
from dpdistill.privacy.individuals import DatasetLedger
from dpdistill.privacy.ledger import Release, UncoveredRead
from dpdistill.progress import Progress

class Needs(str, Enum):
    """What a method learns from: the release it protects is made from this."""

    TEACHER = "a teacher (or a teacher ensemble)"
    SINGLE_TEACHER = "a single teacher"
    ENSEMBLE = "a teacher ensemble on disjoint partitions"
    PRIVATE_DATA = "the private data"


def data_read(dataset: ImageDataset, name: str) -> tuple[str, str]:
    """`Job.data_set` for a release that reads `dataset`'s training examples: its digest and name, with its
    examples' content ids kept in the ledger of individuals (once), so that its releases meet those of any other
    data holding the same examples."""
    DatasetLedger.of(dataset.digest, name, lambda: dataset.example_ids.numpy())
    return dataset.digest, name


@dataclass(frozen=True)
class Source:
    """What a run reads: a teacher directory (None for the methods that read the private data) and the data set that
    measures accuracy when the configuration does not name it (None: the teacher's own)."""

    teacher: Path | None = None
    dataset: str | None = None


def no_files(out_dir: Path, report: dict[str, Any]) -> None:
    """A method whose public outputs are its models only."""


@dataclass
class Outcome:
    """What a finished run hands the lifecycle."""

    report: dict[str, Any]  # the report's method-specific figures (dataset, accuracy, timing, history...)
    privacy: dict[str, Any]  # the report's `privacy` section, before coverage and ledger are added
    covers: str  # what the guarantee covers when nothing was read without protection
    models: dict[str, tuple[nn.Module, dict[str, Any]]]  # public checkpoints: name -> (model, meta)
    # figures computed without noise from private data or the teacher, read after the release is settled (they
    # are kept private, so no read of the teacher for them counts as an answer)
    private_record: Callable[[], dict[str, Any]]
    release: Release | None = None  # what the run released from the teacher, settled in its ledger
    write_files: Callable[[Path, dict[str, Any]], None] = no_files  # further public outputs (samples, answers)
    # the released student's predictions on the images its accuracy is measured on (evaluation.metrics.
    # confusion_counts): public like the accuracy, drawn and reported by the lifecycle
    confusion: Tensor | None = None


class Job(ABC):
    """A planned run: the release it will make is known (and reserved) before it asks anything."""

    config: Any  # the settings it runs with (as saved and reported)
    ledger_dir: Path | None = None  # the teacher whose ledger records the release (None: no teacher is asked)
    planned: Release | None = None
    uncovered: Sequence[UncoveredRead] = ()  # the reads no mechanism protects, known when planned; the most sweeping first
    # other models the run reads, each with what it releases from them, recorded in their own ledgers as the
    # teacher's (DGD's baseline, read without noise by its generator)
    also_reads: Sequence[tuple[Path, Release]] = ()
    # the data set the release reads (`data_read`: its digest and name; None: not known): the ledger of the
    # individuals in the data records the release for each of its examples
    data_set: tuple[str, str] | None = None
    # the DP teacher whose release the run's models are (a free transcription: post-processing), None: their own
    inherits: Path | None = None
    # the release the run's models are where it is not the inherited teacher's alone (a release's teacher and its
    # released statistics), set by the run
    own: Release | None = None
    # what the run releases before its first query (a noisy count of the training set, in config.json): a run
    # that fails before it asks anything is still charged this, in the ledgers of its reservations
    released_first: Release | None = None

    @abstractmethod
    def run(self, resume: bool) -> Outcome:
        """Run (or continue) the method; the lifecycle saves and reports what it returns."""

    def asked(self) -> bool:
        """Whether the run may have released anything from its teacher: its first query began. A run that fails
        before that keeps no reservation (beyond `released_first`). True unless the job knows better."""
        return True


class Method(ABC):
    """One paper's method: its name, its needs, its seed paper and presets, its plan and its report section."""

    name: ClassVar[str]
    summary: ClassVar[str]  # one line: what it does
    needs: ClassVar[Needs]
    paper: ClassVar[str]  # the paper it implements (seed file where there is one)
    presets: ClassVar[tuple[str, ...]] = ()
    command: ClassVar[str]  # the `dpdistill` command that runs it

    @abstractmethod
    def plan(self, source: Source, config: Any, out_dir: Path, progress: Progress | None) -> Job:
        """Load what the run needs from `source` and fix its mechanism; refuse a bad plan before any write."""

    @abstractmethod
    def config_record(self, source: Source, config: Any) -> dict[str, Any]:
        """What config.json keeps, so that `interrupted` can continue the run."""

    @abstractmethod
    def interrupted(self, out_dir: Path) -> tuple[Source | None, Any] | None:
        """The source (None: the caller's) and settings of the unfinished run of this method in `out_dir`, if
        there is one."""

    @abstractmethod
    def markdown(self, report: dict[str, Any]) -> str:
        """The report a person reads."""

    def describe(self) -> dict[str, str]:
        return {"name": self.name, "description": self.summary, "needs": self.needs.value, "paper": self.paper,
                "command": self.command, "presets": ", ".join(self.presets)}
