"""A run's --out, for every command that writes one: refuse an unusable or occupied --out before any work (or, with
--overwrite, remove the previous run's outputs and nothing else), hold the --out lock, tell a resume from a fresh
start, keep the configuration. The lifecycle of a method's run on top of these is methods/lifecycle.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

from dpdistill.errors import ConfigError
from dpdistill.models.ensemble import ENSEMBLE_FILE, PARTITION_KEY_FILE
from dpdistill.privacy.ledger import LEDGER_FILE, LOCK_FILE, OWN, ReleaseLedger
from dpdistill.reporting.report import PRIVATE_DIR, write_json

CONFIG_FILE = "config.json"
REPORT_FILE = "report.json"
RUN_LOCK = ".lock"
ENSEMBLE_STATE = "resume"  # an ensemble's resumable state, beside its members (its members are its outputs)
# Every name a dpdistill run writes into its --out: --overwrite removes these and refuses anything else
RUN_OUTPUTS = re.compile(r"(report\.(json|md)|config\.json|meta\.json|samples\.png|training\.png|answers\.png|confusion\.png|scores\.png|inversion\.png|route|teacher|"
                         r"(latents|answers)\.safetensors|synthetic\.npz|(model|student|generator|encoder|heads)\.(safetensors|json)|"
                         rf"{re.escape(ENSEMBLE_FILE)}|{re.escape(PARTITION_KEY_FILE)}|{PRIVATE_DIR}|{ENSEMBLE_STATE}|"
                         rf"{re.escape(LEDGER_FILE)}|{re.escape(LOCK_FILE)}|"
                         r"member-\d{3,}|code)(\.tmp)?")


def release_state(out_dir: Path) -> Path:
    """Where a release run keeps what it needs to resume (checkpoints, raw answers): private, never published."""
    return out_dir / PRIVATE_DIR / "resume"


def check_out_dir(out_dir: Path) -> None:
    """Refuse an --out that cannot hold a run's files before any work: a file, a path through a file, or a folder
    (or, when it does not exist yet, its nearest existing parent) this process may not write to."""
    existing = next(path for path in (out_dir, *out_dir.parents) if path.exists())
    if not existing.is_dir():
        where = "is a file" if existing == out_dir else f"is inside {existing}, which is a file"
        raise ConfigError(f"--out {out_dir} {where}: give a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out_dir}: {existing} is not writable by this user; choose another --out")


@contextlib.contextmanager
def exclusive(out_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on `out_dir` so that two runs never write the same checkpoints. The lock file goes
    when the run ends, and a run that fails before writing anything (a refused budget) leaves behind none of the
    directories it created."""
    check_out_dir(out_dir)
    created = [directory for directory in (out_dir, *out_dir.parents) if not directory.exists()]  # deepest first
    out_dir.mkdir(parents=True, exist_ok=True)
    lock_path = out_dir / RUN_LOCK
    with open(lock_path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(lock.fileno()).st_ino != os.stat(lock_path).st_ino:  # locked a file a finishing run removed
                raise BlockingIOError
        except (BlockingIOError, FileNotFoundError):
            raise ConfigError(f"another dpdistill run is writing to {out_dir}; wait for it or choose another --out") from None
        try:
            yield
        finally:
            lock_path.unlink(missing_ok=True)  # still held: a run starting now waits for nothing it could clash with
            if not any(out_dir.iterdir()):
                for directory in created:
                    with contextlib.suppress(OSError):  # not empty: something else was put there meanwhile
                        directory.rmdir()


def refuse_finished_resume(out_dir: Path, resumable: bool) -> None:
    """`--resume` on a run that finished: say so, rather than fail on the state it no longer has."""
    if not resumable and (out_dir / REPORT_FILE).exists():
        raise ConfigError(f"the run in {out_dir} has finished: there is nothing to resume (to run it again, drop "
                          f"--resume and pass --overwrite)")


def keep_previous() -> None:
    """Nothing of an earlier run to remove: a fresh folder, or a run that continues."""


def claim_out_dir(out_dir: Path, resume: bool, overwrite: bool, resumable: bool, what: str) -> Callable[[], None]:
    """Decide, under the lock, what a run may do with `out_dir`: continue an unfinished run (`resume`), replace the
    previous run's outputs (`overwrite`), or start in an empty folder. Anything else is refused before any work.
    Returns what clears the previous run's outputs: the caller calls it once its own checks have passed, just before
    its first write, so that a refused run (a bad data set, an overspending plan) loses nothing."""
    if resume:
        refuse_finished_resume(out_dir, resumable)
        if not resumable:
            raise ConfigError(f"nothing to resume in {out_dir}: no interrupted {what} there (start one without --resume)")
        return keep_previous
    occupied = sorted(entry.name for entry in out_dir.iterdir() if entry.name != RUN_LOCK) if out_dir.exists() else []
    if not occupied:
        return keep_previous
    if not overwrite:
        if resumable:
            raise ConfigError(f"{out_dir} holds an unfinished run: pass --resume to continue it, --overwrite to start "
                              f"again, or choose another --out")
        held = "a finished run" if (out_dir / REPORT_FILE).exists() else f"{len(occupied)} file(s)"
        raise ConfigError(f"--out {out_dir} is not empty (it holds {held}): pass --overwrite to replace it, or choose "
                          f"another --out")
    check_removable(out_dir, occupied)
    return lambda: remove_run_outputs(out_dir, occupied)


def check_removable(out_dir: Path, names: list[str]) -> None:
    """Refuse to replace a folder that holds anything a dpdistill run does not write, or a teacher's release ledger
    that records releases made from it (the only record of what they spent; a DP run's ledger that holds only the
    release its model is goes with the model)."""
    if (LEDGER_FILE in names or LOCK_FILE in names) and not holds_only_its_own_release(out_dir):
        raise ConfigError(f"--out {out_dir} holds the release ledger of the teacher there ({LEDGER_FILE}): it is the "
                          f"only record of what its releases spent, so --overwrite will not replace that teacher; "
                          f"choose another --out")
    foreign = [name for name in names if not RUN_OUTPUTS.fullmatch(name)]
    if foreign:
        raise ConfigError(f"--out {out_dir} holds files a dpdistill run does not write ({', '.join(foreign[:5])}"
                          f"{', ...' if len(foreign) > 5 else ''}): --overwrite removes only a run's outputs; choose "
                          f"another --out")


def holds_only_its_own_release(directory: Path) -> bool:
    """Whether the release ledger in `directory` records nothing but the release the model there is (no total set,
    no release made from the model)."""
    state = ReleaseLedger(directory).read()
    return state.total is None and all(entry.status == OWN for entry in state.entries)


def remove_run_outputs(out_dir: Path, names: list[str]) -> None:
    """Remove what an earlier run wrote into `out_dir` (checked by `check_removable`), so that none of it survives
    mixed with the new run's outputs."""
    for name in names:
        path = out_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def write_config(out_dir: Path, record: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / CONFIG_FILE, record)


def saved_config(out_dir: Path) -> dict[str, Any] | None:
    """The configuration an earlier run kept in `out_dir`, if any."""
    path = out_dir / CONFIG_FILE
    return json.loads(path.read_text()) if path.exists() else None
