"""The one lifecycle of a method's run, written once: the --out lock and its checks (runs.py), the configuration
kept, the planned release reserved in every ledger it enters before the first query and settled after, the public
models saved with their provenance, the report (report.json, report.md) and the private record written, the
resumable state removed. A method (base.py) supplies only what is its own: its plan, its loop, its report section.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from dpdistill import __version__
from dpdistill.errors import ConfigError
from dpdistill.methods.base import Method, Source
from dpdistill.methods.teachers import model_class_names, released_data_set
from dpdistill.models.checkpoint import CLASS_NAMES, STUDENT, save_model
from dpdistill.privacy.individuals import DatasetLedger
from dpdistill.privacy.ledger import Release, ReleaseLedger, coverage
from dpdistill.privacy.provenance import Provenance
from dpdistill.privacy.selection import SELECTION
from dpdistill.progress import Progress, announce_start
from dpdistill.reporting.report import (CONFUSION_FIGURE, classes_section, confusion_section, save_confusion_matrix,
                                       selection_section,
                                       write_private_record, write_report)
from dpdistill.runs import claim_out_dir, exclusive, release_state, write_config


def reserve_all(reservations: list[tuple[ReleaseLedger, Release]], out_dir: Path, method: str, resume: bool) -> None:
    """Reserve each planned release in its ledger, or none: a refusal withdraws those already taken."""
    for index, (ledger, release) in enumerate(reservations):
        try:
            ledger.reserve(out_dir, method, release, resume)
        except BaseException:
            if not resume:
                for taken, _ in reservations[:index]:
                    taken.withdraw(out_dir)
            raise


def execute(method: Method, source: Source, config: Any, out_dir: Path, resume: bool = False,
            overwrite: bool = False, progress: Progress | None = None) -> dict[str, Any]:
    """Run `method` on `source` into `out_dir`; with `resume`, the unfinished run there continues with the settings
    (and, where it saved it, the source) it started with."""
    if source.teacher is not None and out_dir.resolve() == source.teacher.resolve():
        raise ConfigError(f"--out {out_dir} is the teacher's own directory: choose another --out")
    with exclusive(out_dir):
        saved = method.interrupted(out_dir)
        clear_previous = claim_out_dir(out_dir, resume, overwrite, saved is not None, f"{method.name} run")
        if resume:
            source, config = saved[0] or source, saved[1]
        job = method.plan(source, config, out_dir, progress)  # refuses a bad or overspending plan before any write
        config = job.config
        ledger = None if job.ledger_dir is None else ReleaseLedger(job.ledger_dir)
        data = None if job.data_set is None else DatasetLedger(*job.data_set)
        planned = None if job.planned is None else job.planned.with_reads(job.uncovered)
        reservations = [(chosen, planned) for chosen in (ledger, data) if chosen is not None] + [
            (ReleaseLedger(directory), release) for directory, release in job.also_reads]
        reserve_all(reservations, out_dir, method.name, resume)
        clear_previous()
        write_config(out_dir, method.config_record(source, config))
        announce_start(progress)
        try:
            outcome = job.run(resume)
        except BaseException:
            if not resume and not job.asked():  # it failed before its first query: nothing more was released
                for reserved, _ in reservations:
                    if job.released_first is None:
                        reserved.withdraw(out_dir)
                    else:
                        reserved.settle(out_dir, method.name, job.released_first)
            raise
        privacy = {**outcome.privacy, **coverage(outcome.covers, job.uncovered)}
        released = planned if outcome.release is None else outcome.release.with_reads(job.uncovered)
        settled = {reserved: reserved.settle(out_dir, method.name, released if reserved in (ledger, data) else release)
                   for reserved, release in reservations}
        if ledger is not None:
            privacy["ledger"] = ledger.standing(settled[ledger])
        # the data whose examples the models' release read: this run's, or its DP teacher's (shown, not charged)
        data_set = job.data_set or (None if job.inherits is None else released_data_set(job.inherits))
        if data is not None:
            privacy["data_set_ledger"] = data.standing(settled[data])
        elif data_set is not None:
            shown = DatasetLedger(*data_set)
            privacy["data_set_ledger"] = shown.standing(shown.read())
        # a covered run's models are DP releases: their provenance travels with them, so any of them can be a
        # teacher transcribed at no further cost, and their own ledger starts with the release they are; the
        # provenance binds each model's weights and the privacy section (final now) that the report, written after
        # the models, states
        provenance = Provenance.of_run(method.name, privacy, str(out_dir.resolve()))
        for name, (model, meta) in outcome.models.items():
            save_model(out_dir, model, meta, name=name, provenance=provenance)
        if provenance is not None:
            inherited = job.own or (None if job.inherits is None else ReleaseLedger(job.inherits).own())
            ReleaseLedger(out_dir).record_own(method.name, inherited or (
                provenance.as_release() if job.inherits is not None else released))
        report = {"method": method.name, **outcome.report, "privacy": privacy, "config": config.to_dict(),
                  "seed": config.seed, "dpdistill_version": __version__}
        class_names = model_class_names(outcome.models[STUDENT][1], None)  # the released student's, by label
        report[CLASS_NAMES] = list(class_names)
        markdown = method.markdown(report) + classes_section(class_names)
        if outcome.confusion is not None:
            report["confusion"] = outcome.confusion.tolist()
            save_confusion_matrix(outcome.confusion, out_dir / CONFUSION_FIGURE, class_names)
            markdown += confusion_section()
        markdown += selection_section(privacy.get(SELECTION, []))
        outcome.write_files(out_dir, report)
        write_report(out_dir, report, markdown)
        write_private_record(out_dir, {**outcome.private_record(),
                                       **({} if data_set is None else {"data_set": list(data_set)})})
        shutil.rmtree(release_state(out_dir), ignore_errors=True)
        return report
