"""A method's run by name, as the CLI, the demo and the Python API call it: each resolves its method in the registry
and runs it through the one lifecycle (methods/lifecycle.py). The jobs that make teachers are in jobs.py."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpdistill.federated.method import default_owners
from dpdistill.federated.method import run_federated as federated
from dpdistill.methods.base import Source
from dpdistill.methods.datalens import synthesize
from dpdistill.methods.dgd import run_dgd as dgd
from dpdistill.methods.release import run_release as release
from dpdistill.methods.dpsgd import train_private
from dpdistill.methods.pate import run_pate as pate
from dpdistill.methods.config import TranscriptionConfig
from dpdistill.methods.lifecycle import execute
from dpdistill.methods.transcription import COVERS, uncovered_reads
from dpdistill.privacy.ledger import coverage as privacy_coverage
from dpdistill.progress import Progress
from dpdistill.runs import saved_config

if TYPE_CHECKING:
    from dpdistill.methods.pate import PateConfig


def transcribe(teacher_dir: Path, config: TranscriptionConfig, out_dir: Path, dataset_name: str | None = None,
               resume: bool = False, progress: Progress | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Convert the teacher in `teacher_dir` into a private student and generator in `out_dir` with the data-free
    method `config.method` (dpsd, dpdfd or srr).

    The dataset is read only for its test split, to report accuracies. With `resume`, the configuration saved
    in `out_dir` is used and the run continues from its last checkpoint with the budget it had spent.
    """
    from dpdistill.registry import transcription_method

    method = transcription_method(_saved_method(out_dir, resume, config.method))
    return execute(method, Source(teacher_dir, dataset_name), config, out_dir, resume, overwrite, progress)


def _saved_method(out_dir: Path, resume: bool, given: str) -> str:
    """A resumed run continues with the method it started with, whatever the call names."""
    saved = saved_config(out_dir) if resume and out_dir.is_dir() else None
    return saved.get("method", given) if saved else given


def interrupted_pate(out_dir: Path) -> "tuple[Path, PateConfig] | None":
    """The teacher and settings of the unfinished PATE run in `out_dir` (its answers released), if any."""
    from dpdistill.registry import method_named

    saved = method_named("pate").interrupted(out_dir)
    return None if saved is None else (saved[0].teacher, saved[1])


def coverage(config: TranscriptionConfig) -> str:
    """What the stated epsilon of a transcription with `config` covers (for a single teacher)."""
    return privacy_coverage(COVERS, uncovered_reads(config))["covered"]
