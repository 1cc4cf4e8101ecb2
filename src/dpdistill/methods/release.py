"""One release for the user who holds the private data: a DP teacher, transcribed at no further cost into a student
of any architecture, a generator and a synthetic set (`dpdistill release`).

1. Teach: DP-SGD on the private data (the `train-private` route) into OUT/teacher, a cnn by default, at all but
   `statistics_share` of the budget.
2. Picture the data: one Gaussian release, at that share, of the means and variances of the inputs of the teacher's
   normalisation layers over the private data, and of each class's images at coarse cells
   (training/feature_statistics.py), kept in OUT/teacher beside it: what BatchNorm would have kept and a DP-SGD
   model, normalised per example, does not, and each class's blurred form.
3. Transcribe: the data-free engine (methods/engine.py) reads the teacher without noise, its generator matching the
   released statistics. Both are DP releases, so every read of them is post-processing: the student, the generator,
   its latent vectors and the synthetic set carry their guarantee, the two composed (basic composition: epsilons
   and deltas add up to the requested budget), and the teacher's ledger records the transcription as free.

Nothing but the teacher's DP-SGD steps and the statistics' release reads the private data; the test split only
measures accuracy.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpdistill.data import load_dataset
from dpdistill.errors import ConfigError
from dpdistill.methods.base import Job, Method, Needs, Outcome, Source, data_read
from dpdistill.methods.config import NOISY_ANSWER_SETTINGS, RELEASE_LOOP, TranscriptionConfig, build_config
from dpdistill.methods.dpsgd import DPSGD
from dpdistill.methods.lifecycle import execute, reserve_all
from dpdistill.methods.synthetic import SynthesisMethod, given_settings
from dpdistill.methods.transcription import TranscriptionJob
from dpdistill.models.registry import build_classifier
from dpdistill.options import (OVERWRITE_OPTION, SEED_HELP, SETTINGS, CommandSpec, Option, dataset_help, out_option,
                               resume_option, set_option)
from dpdistill.privacy.ledger import Release, ReleaseLedger, reproducible_noise_read
from dpdistill.methods.teachers import read_teacher
from dpdistill.privacy.accounting import REPLACE_ONE
from dpdistill.privacy.individuals import DatasetLedger
from dpdistill.privacy.provenance import ADD_REMOVE
from dpdistill.privacy.randomness import noise_source
from dpdistill.privacy.selection import FASHION_MNIST, MNIST_SET, Selection, selection_notes, with_selection
from dpdistill.training.feature_statistics import (CLIP, CLIP_OVER_MEDIAN, NORM_SHARE, RESOLUTION, STATISTICS_FILE,
                                                   STATISTICS_METHOD, StatisticsPlan, load_statistics,
                                                   noisy_norm_median, plan_statistics, release_statistics,
                                                   save_statistics, statistic_layers)
from dpdistill.progress import Progress, in_phase
from dpdistill.reporting.transcription import WITH_TEACHER, release_markdown
from dpdistill.runs import REPORT_FILE, release_state, saved_config
from dpdistill.settings import parse_assignments
from dpdistill.training.private import (RELEASE_TEACHER_SCHEDULE, PrivateTrainingConfig, plan_private_training,
                                       public_train_size, with_public_size)

TEACHER_DIR = "teacher"  # OUT/teacher: the DP teacher's own run
TEACHER_ARCH = "cnn"  # a cnn teacher transcribes into a cnn far better than a scattering one (docs/methods/release.md)
STATISTICS_SHARE = 0.1  # of the budget (epsilon and delta), for the released statistics: at 14 x 14 cells, each
# cell's noise that of 7 x 7 at 0.05, where the statistics' noise cost nothing measurable (docs/methods/release.md)
STATISTICS_KEY = "statistics"  # the key of the statistics' entries in the ledgers: OUT/statistics
CELLS = f"the released class statistics' {RESOLUTION} x {RESOLUTION} cells and share of {STATISTICS_SHARE:g}"
CELLS_SETTINGS = {"resolution": RESOLUTION, "share": STATISTICS_SHARE}
CELLS_SELECTIONS = (  # chosen on the proxy, then the whole release measured on Fashion-MNIST's test split
    Selection(CELLS, CELLS_SETTINGS, "the MNIST set (transcriptions of its DP-SGD teacher)", MNIST_SET),
    Selection(CELLS, CELLS_SETTINGS, "Fashion-MNIST (releases scored on its test split)", FASHION_MNIST))
STUDENT_ARCH = "cnn"
SYNTHETIC_SIZE = 60000  # as many images as Fashion-MNIST's training split, as DataLens and its successors release
TEACHER_PHASE, TRANSCRIPTION_PHASE = "DP teacher (DP-SGD)", "transcription"  # the progress display's names


@dataclass(frozen=True)
class ReleaseConfig:
    """The two runs of a release: the DP teacher's training and its transcription (privacy mode none)."""

    teacher: PrivateTrainingConfig
    transcription: TranscriptionConfig
    statistics_epsilon: float = 0.0  # the released statistics' budget, beside the teacher's (0: none released)
    statistics_delta: float = 0.0
    statistics_resolution: int = 0  # their class part's cells a side (0: none; training/feature_statistics.py)
    statistics_clip: float | None = None  # the per-example bound of the teacher's layer moments in them (None:
    # chosen from their norms' noisy median, training/feature_statistics.py)

    def __post_init__(self) -> None:
        if (self.statistics_epsilon > 0) != (self.transcription.statistics_weight > 0):
            raise ConfigError("the transcription matches released feature statistics (statistics_weight) exactly "
                              "when the release makes them (--statistics-share above 0)")
        if self.teacher.method != DPSGD.name:
            raise ConfigError(f"a release's teacher is trained with dpsgd (covered), not {self.teacher.method}")
        if self.transcription.privacy.mode != "none":
            raise ConfigError("a release transcribes its DP teacher without noise: post-processing costs nothing, "
                              "noise would only lose accuracy")

    @property
    def seed(self) -> int:
        return self.transcription.seed

    @property
    def statistics_share(self) -> float:
        """The share of the budget the statistics were given (rounded: the two parts are products of it)."""
        return round(self.statistics_epsilon / (self.statistics_epsilon + self.teacher.epsilon), 9)

    def to_dict(self) -> dict[str, Any]:
        return {"method": PrivateRelease.name, "teacher": self.teacher.to_dict(),
                "transcription": self.transcription.to_dict(), "statistics_epsilon": self.statistics_epsilon,
                "statistics_delta": self.statistics_delta, "statistics_resolution": self.statistics_resolution,
                "statistics_clip": self.statistics_clip}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ReleaseConfig":
        return cls(PrivateTrainingConfig.from_dict(values["teacher"]),
                   TranscriptionConfig.from_dict(values["transcription"]), values.get("statistics_epsilon", 0.0),
                   values.get("statistics_delta", 0.0), values.get("statistics_resolution", 0),
                   values.get("statistics_clip", CLIP))  # saved before the bound could be drawn: the fixed one


class PrivateRelease(Method):
    name = "release"
    summary = ("the private data -> a DP-SGD teacher and a DP picture of the data, transcribed for no further budget "
               "into a student of any architecture, a generator and a synthetic set")
    needs = Needs.PRIVATE_DATA
    paper = ("post-processing of two DP releases (DP-SGD: Abadi et al. 2016; Gaussian feature and class statistics) "
             "through the data-free engine of seed 000 (DPSD)")
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
        self.dataset = load_dataset(config.teacher.dataset)
        # the teacher's public training-set size; a noisy count drawn here is released (and charged) only by the
        # teacher's own run, which keeps it in OUT/teacher/config.json
        self.teacher_config = with_public_size(config.teacher, self.dataset)
        plan_private_training(self.teacher_config, public_train_size(self.teacher_config, self.dataset))
        # cells no finer than the images' pixels (a shape, public): finer ones repeat pixels, each under its noise
        resolution = min(config.statistics_resolution, *self.dataset.input_shape[1:])
        self.statistics = (None if config.statistics_epsilon == 0 else
                           plan_statistics(config.statistics_epsilon, config.statistics_delta, config.teacher.relation,
                                           resolution, config.statistics_clip))
        config.transcription.validate(self.dataset.num_classes)
        # a bad name, or statistics the teacher cannot give, fail now, not after the teacher's training
        teacher = build_classifier(config.teacher.student_arch, self.dataset.input_shape, self.dataset.num_classes)
        build_classifier(config.transcription.student_arch, self.dataset.input_shape, self.dataset.num_classes)
        if self.statistics is not None:
            statistic_layers(teacher, f"--teacher-arch {config.teacher.student_arch}",
                             ": give --statistics-share 0 (no released statistics) or another teacher")

    def run(self, resume: bool) -> Outcome:
        started = time.perf_counter()
        teacher = self._teach()
        self._release_statistics()
        transcription = TranscriptionJob(self.teacher_dir, self.config.transcription, self.out_dir,
                                         self.config.teacher.dataset, self.progress, TRANSCRIPTION_PHASE)
        self.uncovered = transcription.uncovered  # none, unless the teacher's own run has no guarantee
        self.own = transcription.own  # the teacher's release and its statistics', where it made them
        outcome = transcription.run(resume=release_state(self.out_dir).exists())
        ledger = ReleaseLedger(self.teacher_dir)  # the transcription, recorded in the teacher's ledger: free
        free = Release.post_processing(self.config.teacher.delta).with_reads(self.uncovered)  # unless it read more
        outcome.privacy["ledger"] = ledger.standing(ledger.settle(self.out_dir, PrivateRelease.name, free))
        outcome.report["teacher"] = {"path": str(self.teacher_dir), "arch": self.config.teacher.student_arch,
                                     "accuracy": teacher["accuracy"]["student"]}
        if self.statistics is not None:
            outcome.report["statistics"] = {"path": str(self.teacher_dir / STATISTICS_FILE),
                                            **self.statistics.figures()}
            chosen = {"resolution": self.config.statistics_resolution, "share": self.config.statistics_share}
            outcome.privacy = with_selection(outcome.privacy, selection_notes(CELLS_SELECTIONS, chosen,
                                                                              self.dataset.digest))
        if not resume:  # one process ran it all (a resumed release's earlier parts took a time no report holds);
            whole = time.perf_counter() - started  # the teacher's training grows with the private count: private
            transcribed = outcome.private_record
            outcome.private_record = lambda: {**transcribed(), "timing": {WITH_TEACHER: whole}}
        return outcome

    def _release_statistics(self) -> None:
        """The released picture of the data, once: reserved in the teacher's ledger and the data set's (under
        replace-one, as they compose), drawn, saved, then settled. A resumed release whose statistics are saved
        uses them; one interrupted before they were saved published nothing, and draws them afresh."""
        path = self.teacher_dir / STATISTICS_FILE
        if self.statistics is not None and path.exists():  # with the bound it was drawn at
            self.statistics = StatisticsPlan.of_figures(load_statistics(path)[1])
        if self.statistics is None or path.exists():
            return
        config = self.teacher_config  # debugging noise from the seed: recorded as unbounded, as the teacher's run
        key = self.out_dir / STATISTICS_KEY
        release = self.statistics.release(REPLACE_ONE).with_reads(reproducible_noise_read(config.reproducible_noise))
        reservations = [(ReleaseLedger(self.teacher_dir), release),
                        (DatasetLedger(*data_read(self.dataset, self.config.teacher.dataset)), release)]
        reserve_all(reservations, key, STATISTICS_METHOD, resume=True)
        teacher, _meta = read_teacher(self.teacher_dir)
        noise = noise_source(config.reproducible_noise, config.seed)
        if self.statistics.clip is None:
            self.statistics = self.statistics.with_clip(noisy_norm_median(teacher, self.dataset.x_train,
                                                                          self.statistics, noise, config.device,
                                                                          self.progress))
        statistics = release_statistics(teacher, self.dataset.x_train, self.dataset.y_train,
                                        public_train_size(config, self.dataset), self.statistics,
                                        self.dataset.num_classes, noise, config.device, self.progress)
        save_statistics(path, statistics, self.statistics.figures())
        for ledger, reserved in reservations:
            ledger.settle(key, STATISTICS_METHOD, reserved)

    def _teach(self) -> dict[str, Any]:
        """The teacher's report: its run finished already (a resumed release), continued, or trained now."""
        if (self.teacher_dir / REPORT_FILE).exists():
            return json.loads((self.teacher_dir / REPORT_FILE).read_text())
        method = DPSGD()
        resumable = method.interrupted(self.teacher_dir) is not None
        return execute(method, Source(), self.teacher_config, self.teacher_dir, resume=resumable,
                       overwrite=not resumable,
                       progress=in_phase(self.progress, TEACHER_PHASE, self.config.teacher.epochs))


CHOSEN_CLIP = "auto"  # --statistics-clip's value for a bound chosen from the norms' noisy median


def build_release_config(dataset: str, epsilon: float, delta: float = 1e-5, relation: str = ADD_REMOVE,
                         teacher_arch: str = TEACHER_ARCH, student_arch: str = STUDENT_ARCH,
                         synthetic_size: int = SYNTHETIC_SIZE, preset: str | None = None, seed: int = 0,
                         device: str = "cpu", teacher_options: dict[str, Any] | None = None,
                         transcription_options: dict[str, Any] | None = None,
                         statistics_share: float = STATISTICS_SHARE,
                         statistics_resolution: int = RESOLUTION, statistics_clip: float | str = CHOSEN_CLIP
                         ) -> ReleaseConfig:
    """A release's configurations from the command's options: the teacher's are `train-private`'s (its defaults for
    `teacher_arch`, the cnn's schedule for the default cnn, then `teacher_options`) at all but `statistics_share` of
    (epsilon, delta), the transcription's the engine's (the `dp-teacher` preset with the release's longer loop
    unless `preset` names others, then `transcription_options`), matching the statistics released at that share;
    all share the seed and the device. `statistics_clip` "auto": chosen from the data (CHOSEN_CLIP)."""
    if not 0 <= statistics_share < 0.5:
        raise ConfigError(f"--statistics-share must be in [0, 0.5), got {statistics_share}")
    if statistics_resolution < 0:
        raise ConfigError(f"--statistics-resolution must be 0 (no class statistics) or more, got "
                          f"{statistics_resolution}")
    clip = statistics_bound(statistics_clip)
    unread = sorted(NOISY_ANSWER_SETTINGS & set(transcription_options or {}))
    if unread:
        raise ConfigError(f"{', '.join(name.replace('_', '-') for name in unread)}: a setting of a teacher's noisy "
                          f"answers, which a release never uses (it reads its DP teacher without noise)")
    schedule = RELEASE_TEACHER_SCHEDULE if teacher_arch == TEACHER_ARCH else {}
    teacher = PrivateTrainingConfig(**{"dataset": dataset, "method": DPSGD.name,
                                       "epsilon": epsilon * (1 - statistics_share),
                                       "delta": delta * (1 - statistics_share), "relation": relation,
                                       "student_arch": teacher_arch, "seed": seed, "device": device, **schedule,
                                       **(teacher_options or {})})
    transcription = build_config(preset, {**({} if preset else RELEASE_LOOP), "method": "dpsd",
                                          "student_arch": student_arch,
                                          "synthetic_size": synthetic_size, "seed": seed, "device": device,
                                          "statistics_weight": 1.0 if statistics_share else 0.0,
                                          **(transcription_options or {})},
                                 {"mode": "none", "delta": delta}, dp_teacher=True)
    return ReleaseConfig(teacher, transcription, epsilon * statistics_share, delta * statistics_share,
                         statistics_resolution if statistics_share else 0, clip)


def statistics_bound(value: float | str) -> float | None:
    """--statistics-clip's value: a positive bound, or None for CHOSEN_CLIP; anything else a one-line error."""
    if value == CHOSEN_CLIP:
        return None
    try:
        bound = float(value)
    except (TypeError, ValueError):
        bound = math.nan
    if not 0 < bound < math.inf:
        raise ConfigError(f"--statistics-clip must be a positive number or {CHOSEN_CLIP}, got {value}")
    return bound


class TeacherGuided(SynthesisMethod, PrivateRelease):
    """The release as a synthesiser (`synthesize --method teacher-guided`), beside DataLens and DP-MERF: the same
    teacher, released statistics, generator and synthetic set, its budget under replace-one as theirs. The
    transcription's knobs are --set's; the teacher's and the statistics' are `release`'s own options."""

    name = "teacher-guided"
    summary = ("a DP-SGD teacher and a DP picture of the data guide a generator (the release's): its synthetic set, "
               "and a classifier trained on it alone")
    command = "synthesize"
    config_type = ReleaseConfig
    # the options the release takes itself; every other value given is the transcription's
    release_options = {"dataset", "epsilon", "delta", "synthetic_size", "seed", "device", "reproducible_noise"}

    @property
    def settings_type(self) -> type:
        return TranscriptionConfig

    def build_config(self, preset: str | None, values: dict[str, Any]) -> ReleaseConfig:
        """synthesize's options: the budget, size, seed and device as `release` takes them; --steps the
        transcription's iterations, --batch-size its samples an iteration; any other a ConfigError."""
        given = given_settings(self.name, values, self.release_options | {"steps"} | {
            field.name for field in dataclasses.fields(TranscriptionConfig)}, "the teacher's and the statistics' "
            "settings are `dpdistill release`'s options (docs/methods/release.md)")
        transcription = {key: value for key, value in given.items() if key not in self.release_options}
        if "steps" in transcription:
            transcription["iterations"] = transcription.pop("steps")
        teacher = {"reproducible_noise": True} if given.get("reproducible_noise") else {}
        return build_release_config(given["dataset"], given["epsilon"], given.get("delta", 1e-5), REPLACE_ONE,
                                    synthetic_size=given.get("synthetic_size", SYNTHETIC_SIZE), preset=preset,
                                    seed=given.get("seed", 0), device=given.get("device", "cpu"),
                                    teacher_options=teacher, transcription_options=transcription)

    def config_record(self, source: Source, config: ReleaseConfig) -> dict[str, Any]:
        return {**config.to_dict(), "method": self.name}  # what --resume reads back as this synthesiser's


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
                                values["preset"], values["seed"], values["device"], teacher, transcription,
                                values["statistics_share"], values["statistics_resolution"],
                                values["statistics_clip"])


COMMAND = CommandSpec(
    name="release", help="Train a DP teacher and transcribe it for free.\n\nFrom the private data, one release under "
                         "one epsilon: a DP-SGD teacher, transcribed at no further budget into a student of any "
                         "architecture, a generator and a synthetic set.",
    options=(Option("dataset", str, help=dataset_help("the private data"),
                    field=False),
             out_option("directory for the student, the generator, synthetic.npz and the report; the DP teacher "
                        "goes to OUT/teacher"),
             Option("epsilon", float, help="the whole release's budget: the DP teacher's and its released "
                                           "statistics' (its transcription is post-processing and costs nothing)",
                    field=False),
             Option("delta", float, 1e-5, "delta of (epsilon, delta)-DP", field=False),
             Option("relation", str, ADD_REMOVE, "the neighbouring relation of the budget: add-remove (Opacus', the "
                                                 "default) or replace-one (as the teacher routes; more noise)",
                    show_default=False, field=False),
             Option("student_arch", str, STUDENT_ARCH, "the student's architecture: any registered one, or "
                                                       "module:callable", field=False),
             Option("synthetic_size", int, SYNTHETIC_SIZE, "synthetic images to release, classes balanced (0: none)",
                    min=0, field=False),
             Option("teacher_arch", str, TEACHER_ARCH, "the DP-SGD teacher's architecture (the cnn with its own "
                                                       "schedule; any other with the defaults of train-private)",
                    field=False),
             Option("statistics_share", float, STATISTICS_SHARE, "the share of --epsilon and --delta spent on the "
                                                                 "teacher's released feature statistics, the "
                                                                 "generator's picture of the data (0: none)",
                    field=False),
             Option("statistics_resolution", int, RESOLUTION, "the cells a side at which each class's images are "
                                                              "released with them, the generator's picture of each "
                                                              "class's form, at most the image's side (0: none)",
                    min=0, field=False),
             Option("statistics_clip", str, CHOSEN_CLIP, "the per-example L2 bound of the teacher's layer moments "
                                                         "in those statistics: above their norms, or the statistics "
                                                         f"shrink; the noise grows with it. {CHOSEN_CLIP}: "
                                                         f"{CLIP_OVER_MEDIAN:g} times their median, drawn within "
                                                         "the statistics' budget (their noise "
                                                         f"+{1 / math.sqrt(1 - NORM_SHARE) - 1:.1%}; "
                                                         "docs/methods/release.md)", field=False),
             Option("dataset_size", int | None, None, "the training split's size as you publish it [default: the "
                                                      "data set's declared size, else a noisy count of it at 1% of "
                                                      "--epsilon]", min=1, field=False),
             Option("preset", str | None, None, "the transcription's engine settings [default: dp-teacher, with "
                                               "600 iterations of 8 student steps]",
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
