"""What DP-SGD and DPDFD's direct training share as methods: the student trained on the private data itself by a
trainer of training/private.py (Poisson-sampled steps, one ledger charge per step, epoch checkpoints), the
baseline that transcription is compared to. Each is a `PrivateTrainingMethod` (methods/dpsgd.py,
dpdfd_direct.py)."""

from __future__ import annotations

import dataclasses
import time
import warnings
from pathlib import Path
from typing import Any, ClassVar

from dpdistill.data import load_dataset
from dpdistill.errors import ConfigError, Note
from dpdistill.methods.base import Job, Method, Needs, Outcome, Source, data_read
from dpdistill.methods.teachers import classifier_meta
from dpdistill.privacy.ledger import Release, UncoveredRead, reproducible_noise_read
from dpdistill.privacy.selection import with_selection
from dpdistill.progress import Progress
from dpdistill.reporting.private_training import private_training_markdown
from dpdistill.reporting.report import PRIVATE_DIR
from dpdistill.runs import release_state, saved_config
from dpdistill.reporting.report import save_accuracy_curve
from dpdistill.training.distributed import Group
from dpdistill.training.private import (TRAINERS, PrivatePlan, PrivateTrainingConfig, plan_private_training,
                                       public_train_size, student_change, training_selection_notes,
                                       with_public_size)

PUBLIC_START = "; its starting encoder saw public images only"


TRAINING_FIGURE = "training.png"  # test accuracy after each epoch


class PrivateTrainingMethod(Method):
    """A student trained on the private data with the trainer of the same name."""

    needs = Needs.PRIVATE_DATA
    command = "train-private"
    covers: ClassVar[str]  # what the guarantee covers when the noise is secret
    student_read: ClassVar[UncoveredRead | None] = None  # the student's own unprotected read of the private data

    def plan(self, source: Source, config: PrivateTrainingConfig, out_dir: Path,
             progress: Progress | None) -> "PrivateTrainingJob":
        return PrivateTrainingJob(self, config, out_dir, progress)

    def config_record(self, source: Source, config: PrivateTrainingConfig) -> dict[str, Any]:
        return config.to_dict()

    def interrupted(self, out_dir: Path) -> tuple[None, PrivateTrainingConfig] | None:
        """Resumable after its first epoch checkpoint (the trainer's state)."""
        saved = saved_config(out_dir)
        if saved is None or not release_state(out_dir).exists():
            return None
        return None, PrivateTrainingConfig.from_dict(saved)

    def markdown(self, report: dict[str, Any]) -> str:
        return private_training_markdown(report)


class PrivateTrainingJob(Job):
    """The trainer planned on the private data: the plan is refused before any write if it would overspend."""

    def __init__(self, method: PrivateTrainingMethod, config: PrivateTrainingConfig, out_dir: Path,
                 progress: Progress | None) -> None:
        self.dataset = load_dataset(config.dataset)
        config = with_public_size(config, self.dataset)  # a noisy count where the data declare no size
        train_size = public_train_size(config, self.dataset)
        config = config.fitted(train_size)  # what runs, and what config.json keeps
        self.method, self.config = method, config
        started = time.perf_counter()
        self.private_plan = plan_private_training(config, train_size)
        self.planning_seconds = time.perf_counter() - started
        share_plan(config, self.private_plan)
        # builds the student and, for DP-SGD, passes two blank inputs through its per-example path: a student that
        # cannot be trained is refused here, before any ledger entry
        self.trainer = TRAINERS[config.method](config, self.dataset, self.private_plan, out_dir / PRIVATE_DIR,
                                               progress)
        for change in self.trainer.fixes:
            warnings.warn(student_change(change), Note)
        self.uncovered = reproducible_noise_read(config.reproducible_noise) + (
            [] if method.student_read is None else [method.student_read])
        # the data set's ledger records every step, under replace-one; a total it would exceed refuses the run here
        self.planned = self.private_plan.replace_one_release(config.delta)
        self.data_set = data_read(self.dataset, config.dataset)
        count = self.private_plan.count  # released with config.json, before the first step
        if count is not None:
            self.released_first = Release(count.dp_event(), config.delta, count.epsilon)

    def asked(self) -> bool:
        """Whether a step began: a run that fails before it released nothing but its noisy count (if any)."""
        return self.trainer.ledger.answered > 0

    def run(self, resume: bool) -> Outcome:
        config, dataset, method = self.config, self.dataset, self.method
        result = self.trainer.run(resume)
        meta = classifier_meta(config.student_arch, dataset.input_shape, dataset.class_names, config.dataset,
                               config.student_init)
        report = {"dataset": config.dataset,
                  "data": {key: value for key, value in dataset.describe().items() if key != "n_train"},
                  "accuracy": {"student": result.history[-1]["test_accuracy"]},
                  "measured_on": self.trainer.measured_on,
                  # the training's wall time grows with the private count: the private record's
                  "timing": {"planning_seconds": self.planning_seconds, "processes": config.processes},
                  "history": result.history,
                  "notes": [student_change(fix) for fix in result.fixes]}
        privacy = with_selection({**result.privacy, "formal_guarantee": True},  # stated either way in this report
                                 training_selection_notes(config, dataset.digest))
        return Outcome(
            report=report, privacy=privacy,
            covers=method.covers + (PUBLIC_START if config.student_init else ""),
            models={"student": (result.model, {**meta, "opacus_fixed": bool(result.fixes)})},
            private_record=lambda: {**result.private_figures, "timing": {"wall_seconds": result.wall_seconds}},
            confusion=result.confusion,
            write_files=lambda out_dir, written: save_accuracy_curve(written["history"], "epoch",
                                                                     out_dir / TRAINING_FIGURE))


def share_plan(config: PrivateTrainingConfig, plan: PrivatePlan) -> None:
    """On several processes (training/distributed.py), rank 0 tells the others what runs: the settings and the
    plan it made, the one the accountant composes."""
    group = Group.current()
    if group.size == 1:
        return
    if config.processes != group.size:
        raise ConfigError(f"the run is planned for --processes {config.processes} and {group.size} processes were "
                          f"started (torchrun's processes per node times its nodes): give the same number")
    group.broadcast_json({"config": config.to_dict(), "plan": dataclasses.asdict(plan)})


def follow_plan(out_dir: Path) -> None:
    """A process of a run other than rank 0: its share of the training, on the plan rank 0 shares. It writes
    nothing (rank 0 writes the run into `out_dir`)."""
    shared = Group.current().broadcast_json()
    config = PrivateTrainingConfig.from_dict(shared["config"])
    TRAINERS[config.method](config, load_dataset(config.dataset), PrivatePlan.from_dict(shared["plan"]),
                            out_dir / PRIVATE_DIR).run()
