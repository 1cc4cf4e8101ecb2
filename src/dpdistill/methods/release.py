"""One release for the user who holds the private data: a DP teacher, transcribed at no further cost into a student
of any architecture, a generator and a synthetic set (`dpdistill release`).

1. Teach: the best private route the data allows, DP-SGD on scattering features (`scatter-linear`, the
   `train-private` route), into OUT/teacher. Its epsilon is the whole release's.
2. Transcribe: the data-free engine (methods/engine.py) reads that teacher without noise. The teacher is itself a
   DP release, so every read of it is post-processing: the student, the generator, its latent vectors and the
   synthetic set carry the teacher's guarantee, and the teacher's ledger records the transcription as free.

Nothing but the teacher's DP-SGD steps reads the private data; the test split only measures accuracy.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpdistill.data import load_dataset
from dpdistill.errors import ConfigError
from dpdistill.methods.base import Job, Method, Needs, Outcome, Source
from dpdistill.methods.config import TranscriptionConfig, build_config
from dpdistill.methods.dpsgd import DPSGD
from dpdistill.methods.lifecycle import execute
from dpdistill.methods.transcription import TranscriptionJob
from dpdistill.models.registry import build_classifier
from dpdistill.options import (OVERWRITE_OPTION, SEED_HELP, SETTINGS, CommandSpec, Option, dataset_help, out_option,
                               resume_option, set_option)
from dpdistill.privacy.ledger import Release, ReleaseLedger
from dpdistill.privacy.provenance import ADD_REMOVE
from dpdistill.progress import Progress, in_phase
from dpdistill.reporting.transcription import WITH_TEACHER, release_markdown
from dpdistill.runs import REPORT_FILE, release_state, saved_config
from dpdistill.settings import parse_assignments
from dpdistill.training.private import (PrivateTrainingConfig, plan_private_training, public_train_size,
                                       with_public_size)

TEACHER_DIR = "teacher"  # OUT/teacher: the DP teacher's own run
TEACHER_ARCH = "scatter-linear"  # Tramer & Boneh's route: the best measured at a small epsilon (BENCHMARKS.md)
STUDENT_ARCH = "cnn"
SYNTHETIC_SIZE = 60000  # as many images as Fashion-MNIST's training split, as DataLens and its successors release
TEACHER_PHASE, TRANSCRIPTION_PHASE = "DP teacher (DP-SGD)", "transcription"  # the progress display's names


@dataclass(frozen=True)
class ReleaseConfig:
    """The two runs of a release: the DP teacher's training and its transcription (privacy mode none)."""

    teacher: PrivateTrainingConfig
    transcription: TranscriptionConfig

    def __post_init__(self) -> None:
        if self.teacher.method != DPSGD.name:
            raise ConfigError(f"a release's teacher is trained with dpsgd (covered), not {self.teacher.method}")
        if self.transcription.privacy.mode != "none":
            raise ConfigError("a release transcribes its DP teacher without noise: post-processing costs nothing, "
                              "noise would only lose accuracy")

    @property
    def seed(self) -> int:
        return self.transcription.seed

    def to_dict(self) -> dict[str, Any]:
        return {"method": PrivateRelease.name, "teacher": self.teacher.to_dict(),
                "transcription": self.transcription.to_dict()}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ReleaseConfig":
        return cls(PrivateTrainingConfig.from_dict(values["teacher"]),
                   TranscriptionConfig.from_dict(values["transcription"]))


class PrivateRelease(Method):
    name = "release"
    summary = ("the private data -> a DP-SGD teacher on scattering features, transcribed for no further budget into "
               "a student of any architecture, a generator and a synthetic set")
    needs = Needs.PRIVATE_DATA
    paper = ("post-processing of a DP release (DP-SGD on scattering features: Abadi et al. 2016, Tramer & Boneh "
             "2021) through the data-free engine of seed 000 (DPSD)")
    command = "release"

    def plan(self, source: Source, config: ReleaseConfig, out_dir: Path, progress: Progress | None) -> "ReleaseJob":
        return ReleaseJob(config, out_dir, progress)

    def config_record(self, source: Source, config: ReleaseConfig) -> dict[str, Any]:
        return config.to_dict()

    def interrupted(self, out_dir: Path) -> tuple[None, ReleaseConfig] | None:
        """Resumable until its report is written: the teacher's run and the transcription each continue."""
        saved = saved_config(out_dir)
        if saved is None or saved.get("method") != self.name or (out_dir / REPORT_FILE).exists():
            return None
        return None, ReleaseConfig.from_dict(saved)

    def markdown(self, report: dict[str, Any]) -> str:
        return release_markdown(report)


class ReleaseJob(Job):
    """Both runs checked before any write: the teacher's noise is calibrated (a budget it cannot meet is refused
    here) and the transcription's settings validated."""

    def __init__(self, config: ReleaseConfig, out_dir: Path, progress: Progress | None) -> None:
        self.config, self.out_dir, self.progress = config, out_dir, progress
        self.teacher_dir = self.inherits = out_dir / TEACHER_DIR  # its models are the DP teacher's release
        dataset = load_dataset(config.teacher.dataset)
        # the teacher's public training-set size; a noisy count drawn here is released (and charged) only by the
        # teacher's own run, which keeps it in OUT/teacher/config.json
        self.teacher_config = with_public_size(config.teacher, dataset)
        plan_private_training(self.teacher_config, public_train_size(self.teacher_config, dataset))
        config.transcription.validate(dataset.num_classes)
        for arch in (config.teacher.student_arch, config.transcription.student_arch):  # a bad name fails now, not
            build_classifier(arch, dataset.input_shape, dataset.num_classes)  # after the teacher's training

    def run(self, resume: bool) -> Outcome:
        started = time.perf_counter()
        teacher = self._teach()
        transcription = TranscriptionJob(self.teacher_dir, self.config.transcription, self.out_dir,
                                         self.config.teacher.dataset, self.progress, TRANSCRIPTION_PHASE)
        self.uncovered = transcription.uncovered  # none, unless the teacher's own run has no guarantee
        outcome = transcription.run(resume=release_state(self.out_dir).exists())
        ledger = ReleaseLedger(self.teacher_dir)  # the transcription, recorded in the teacher's ledger: free
        free = Release.post_processing(self.config.teacher.delta).with_reads(self.uncovered)  # unless it read more
        outcome.privacy["ledger"] = ledger.standing(ledger.settle(self.out_dir, PrivateRelease.name, free))
        outcome.report["teacher"] = {"path": str(self.teacher_dir), "arch": self.config.teacher.student_arch,
                                     "accuracy": teacher["accuracy"]["student"]}
        if not resume:  # one process ran it all (a resumed release's earlier parts took a time no report holds);
            whole = time.perf_counter() - started  # the teacher's training grows with the private count: private
            transcribed = outcome.private_record
            outcome.private_record = lambda: {**transcribed(), "timing": {WITH_TEACHER: whole}}
        return outcome

    def _teach(self) -> dict[str, Any]:
        """The teacher's report: its run finished already (a resumed release), continued, or trained now."""
        if (self.teacher_dir / REPORT_FILE).exists():
            return json.loads((self.teacher_dir / REPORT_FILE).read_text())
        method = DPSGD()
        resumable = method.interrupted(self.teacher_dir) is not None
        return execute(method, Source(), self.teacher_config, self.teacher_dir, resume=resumable,
                       overwrite=not resumable,
                       progress=in_phase(self.progress, TEACHER_PHASE, self.config.teacher.epochs))


def build_release_config(dataset: str, epsilon: float, delta: float = 1e-5, relation: str = ADD_REMOVE,
                         teacher_arch: str = TEACHER_ARCH, student_arch: str = STUDENT_ARCH,
                         synthetic_size: int = SYNTHETIC_SIZE, preset: str | None = None, seed: int = 0,
                         device: str = "cpu", teacher_options: dict[str, Any] | None = None,
                         transcription_options: dict[str, Any] | None = None) -> ReleaseConfig:
    """A release's two configurations from the command's options: the teacher's are `train-private`'s (its defaults
    for `teacher_arch`, then `teacher_options`), the transcription's the engine's (the `dp-teacher` preset unless
    `preset` names others, then `transcription_options`); both share the seed and the device."""
    teacher = PrivateTrainingConfig(**{"dataset": dataset, "method": DPSGD.name, "epsilon": epsilon, "delta": delta,
                                       "relation": relation, "student_arch": teacher_arch, "seed": seed,
                                       "device": device, **(teacher_options or {})})
    transcription = build_config(preset, {"method": "dpsd", "student_arch": student_arch,
                                          "synthetic_size": synthetic_size, "seed": seed, "device": device,
                                          **(transcription_options or {})},
                                 {"mode": "none", "delta": delta}, dp_teacher=True)
    return ReleaseConfig(teacher, transcription)


def run_release(config: ReleaseConfig | None, out_dir: Path, resume: bool = False, progress: Progress | None = None,
                overwrite: bool = False) -> dict[str, Any]:
    """A DP teacher trained on the private data, transcribed for no further budget: the student, generator and
    synthetic set in `out_dir`, the teacher in `out_dir/teacher`. With `resume`, the run saved in `out_dir`
    continues (its teacher's run, then its transcription) with its saved settings."""
    return execute(PrivateRelease(), Source(), None if resume else config, out_dir, resume, overwrite, progress)


TEACHER_PREFIX = "teacher_"  # the Python API's `teacher_epochs=160`: the teacher's train-private settings


def _configure(values: dict[str, Any]) -> ReleaseConfig | None:
    """A fresh release's two configurations from the options, --set (the transcription's), --teacher-set (the
    teacher's) or the API's keywords; a resumed one's saved settings."""
    if values["resume"]:
        saved = PrivateRelease().interrupted(Path(values["out"]))
        return None if saved is None else saved[1]
    given = values.get(SETTINGS, {})
    teacher = {**({} if values["dataset_size"] is None else {"dataset_size": values["dataset_size"]}),
               **parse_assignments(values["teacher_set"], PrivateTrainingConfig),
               **{name.removeprefix(TEACHER_PREFIX): value for name, value in given.items()
                  if name.startswith(TEACHER_PREFIX)}}
    transcription = {**parse_assignments(values["set_"], TranscriptionConfig),
                     **{name: value for name, value in given.items() if not name.startswith(TEACHER_PREFIX)},
                     **({} if values["iterations"] is None else {"iterations": values["iterations"]})}
    return build_release_config(values["dataset"], values["epsilon"], values["delta"], values["relation"],
                                values["teacher_arch"], values["student_arch"], values["synthetic_size"],
                                values["preset"], values["seed"], values["device"], teacher, transcription)


COMMAND = CommandSpec(
    name="release", help="Train a DP teacher and transcribe it for free.\n\nFrom the private data, one release under "
                         "one epsilon: a DP-SGD teacher, transcribed at no further budget into a student of any "
                         "architecture, a generator and a synthetic set.",
    options=(Option("dataset", str, help=dataset_help("the private data"),
                    field=False),
             out_option("directory for the student, the generator, synthetic.npz and the report; the DP teacher "
                        "goes to OUT/teacher"),
             Option("epsilon", float, help="the whole release's budget: the DP teacher's (its transcription is "
                                           "post-processing and costs nothing)", field=False),
             Option("delta", float, 1e-5, "delta of (epsilon, delta)-DP", field=False),
             Option("relation", str, ADD_REMOVE, "the neighbouring relation of the budget: add-remove (Opacus', the "
                                                 "default) or replace-one (as the teacher routes; more noise)",
                    show_default=False, field=False),
             Option("student_arch", str, STUDENT_ARCH, "the student's architecture: any registered one, or "
                                                       "module:callable", field=False),
             Option("synthetic_size", int, SYNTHETIC_SIZE, "synthetic images to release, classes balanced (0: none)",
                    min=0, field=False),
             Option("teacher_arch", str, TEACHER_ARCH, "the DP-SGD teacher's architecture", field=False),
             Option("dataset_size", int | None, None, "the training split's size as you publish it [default: the "
                                                      "data set's declared size, else a noisy count of it at 1% of "
                                                      "--epsilon]", min=1, field=False),
             Option("preset", str | None, None, "the transcription's engine settings [default: dp-teacher]",
                    field=False),
             Option("iterations", int | None, None, "the transcription's iterations [default: the preset's]",
                    field=False),
             set_option("any transcription knob, KEY=VALUE (repeatable)"),
             Option("teacher_set", list[str], [], "any train-private knob of the teacher, KEY=VALUE (repeatable), "
                                                  "e.g. epochs=160", flags=("--teacher-set",), field=False),
             Option("seed", int, 0, SEED_HELP, field=False), Option("device", str, "cpu", "cpu or cuda", field=False),
             resume_option("continue the interrupted release in --out with its saved settings: its teacher's run, "
                           "then its transcription"), OVERWRITE_OPTION),
    configure=_configure,
    run=lambda values, config, progress: run_release(config, Path(values["out"]), values["resume"], progress,
                                                     values["overwrite"]),
    progress_of=lambda values, config: (None, f"release on {values['dataset']}"),  # each phase counts its own
    positional=("dataset", "out"), settable=(TranscriptionConfig,),
    prefixed=((TEACHER_PREFIX, PrivateTrainingConfig),))
