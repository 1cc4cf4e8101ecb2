"""Every method's run in one place, as the demo, the audit, the benchmarks and scripts call them: each is the run
function that lives beside its method and goes through the one lifecycle (methods/lifecycle.py). The jobs that
make teachers are in jobs.py; the commands and the Python API are generated from the methods' declarations."""

from __future__ import annotations

from pathlib import Path

from dpdistill.federated.method import default_owners, run_federated as federated
from dpdistill.methods.config import TranscriptionConfig
from dpdistill.methods.datalens import run_synthesis as synthesize
from dpdistill.methods.dgd import run_dgd as dgd
from dpdistill.methods.dpsd_family import transcribe
from dpdistill.methods.dpsgd import train_private
from dpdistill.methods.pate import PATE, PateConfig, run_pate as pate
from dpdistill.methods.release import run_release as release
from dpdistill.methods.transcription import COVERS, uncovered_reads
from dpdistill.privacy.ledger import coverage as privacy_coverage

__all__ = ["coverage", "default_owners", "dgd", "federated", "interrupted_pate", "pate", "release", "synthesize",
           "train_private", "transcribe"]


def interrupted_pate(out_dir: Path) -> tuple[Path, PateConfig] | None:
    """The teacher and settings of the unfinished PATE run in `out_dir` (its answers released), if any."""
    saved = PATE().interrupted(out_dir)
    return None if saved is None else (saved[0].teacher, saved[1])


def coverage(config: TranscriptionConfig) -> str:
    """What the stated epsilon of a transcription with `config` covers (for a single teacher)."""
    return privacy_coverage(COVERS, uncovered_reads(config))["covered"]
