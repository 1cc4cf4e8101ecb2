"""What DPSD, DPDFD and SRR share as methods: a teacher transcribed data-free by one engine (methods/engine.py)
into a student and a generator. Each of the three is a `TranscriptionMethod` with its paper's settings
(methods/dpsd.py, dpdfd.py, srr.py); the presets of config.py apply to all three."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any, Callable, ClassVar, NamedTuple, Sequence

import dp_accounting
import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from dpdistill import __version__
from dpdistill.errors import ConfigError
from dpdistill.data.base import ImageDataset
from dpdistill.evaluation.fidelity import scattering_frechet
from dpdistill.evaluation.metrics import predict
from dpdistill.methods.base import Job, Method, Needs, Outcome, Source
from dpdistill.methods.config import DP_TEACHER_SELECTION, PRESETS, RELEASE_LOOP_SELECTION, TranscriptionConfig
from dpdistill.methods.engine import TranscriptionEngine, TranscriptionResult
from dpdistill.methods.synthetic import (CLASSIFIER_STATE, EVALUATION_BATCH, EVALUATION_LR, SYNTHETIC_FILE,
                                         SYNTHETIC_STATE, StudentSettings, balanced_draw, evaluate_synthetic,
                                         synthetic_files)
from dpdistill.methods.teachers import (classifier_meta, data_digest, evaluation_set, model_class_names,
                                       read_teacher, teacher_accuracy, teacher_data_set)
from dpdistill.models.checkpoint import saved_class_names
from dpdistill.models.ensemble import TeacherEnsemble, partition_reads
from dpdistill.privacy.accounting import REPLACE_ONE, epsilon_key
from dpdistill.privacy.ledger import Release, ReleaseLedger, UncoveredRead, reproducible_noise_read
from dpdistill.privacy.provenance import Provenance
from dpdistill.privacy.selection import selection_notes, with_selection
from dpdistill.progress import Progress, in_phase
from dpdistill.reporting.report import PRIVATE_DIR, save_image_grid, save_training_curve
from dpdistill.reporting.transcription import transcription_markdown
from dpdistill.runs import release_state, saved_config
from dpdistill.training.feature_statistics import (STATISTICS_FILE, STATISTICS_METHOD, Statistics, StatisticsPlan,
                                                   load_statistics)
from dpdistill.training.state import STATE_SKELETON, load_state, save_state

FIDELITY_PHASE = "synthetic set's Fréchet distance"  # the progress display's name for its feature passes
COVERS = "the student, the generator and its latent vectors (post-processing of the noisy releases)"
DP_TEACHER_COVERS = ("the student, the generator, its latent vectors and the synthetic set (post-processing of the "
                     "teacher's own DP release: nothing else private was read)")
STATISTICS_COVERS = ("the student, the generator, its latent vectors and the synthetic set (post-processing of the "
                     "teacher's own DP release and of its released feature statistics: nothing else private was read)")
STATISTICS_SCOPE = "the teacher's own DP release and its released feature statistics (post-processing)"
SOURCE_COVERS = ("the student (post-processing of the sample source's release and the noisy answers; epsilon is "
                 "their composition)")
NO_PRIVACY = UncoveredRead("the teacher's answers, without noise (privacy mode none)", "nothing")
GENERATOR_READS_TEACHER = UncoveredRead(
    "the teacher, without noise, by the generator",
    "NO formal guarantee for the student or the generator: the synthetic inputs depend on the non-private teacher "
    "(teacher as discriminator, generator pretrained on the teacher, or adversarial term); the stated epsilon "
    "covers only the teacher's answers given those inputs")


def uncovered_reads(config: TranscriptionConfig, teacher: Provenance | None = None) -> list[UncoveredRead]:
    """The reads of the teacher that no mechanism protects, the most sweeping first. A teacher that is itself a DP
    release (`teacher` its provenance) may be read freely: every read of it is post-processing."""
    if teacher is not None:
        return []
    reads = [NO_PRIVACY] if config.privacy.mode == "none" else []
    reads += reproducible_noise_read(config.reproducible_noise)
    if config.generator_sees_teacher:
        reads.append(GENERATOR_READS_TEACHER)
    return reads


class StatisticsRead(NamedTuple):
    """What a transcription that matches a DP teacher's released statistics reads, and what it then releases."""

    statistics: Statistics | None
    provenance: Provenance | None  # the teacher's release and the statistics' together
    own: Release | None  # the same, as its models' own ledger records it
    figures: dict[str, Any] | None  # the statistics' release, as its file states it


def released_statistics(teacher_dir: Path, config: TranscriptionConfig, provenance: Provenance | None
                        ) -> StatisticsRead:
    """The DP teacher's released feature statistics, where the transcription weighs them, and the release the
    transcription then post-processes: the teacher's and the statistics' together (basic composition: their
    epsilons and deltas add), as its report states it and as its models' own ledger records it (under
    replace-one). A release writes them beside its teacher and records them in its ledgers (methods/release.py)."""
    if config.statistics_weight == 0:
        return StatisticsRead(None, provenance, None, None)
    path = teacher_dir / STATISTICS_FILE
    if not path.exists():
        raise ConfigError(f"statistics-weight matches a DP teacher's released feature statistics, and {teacher_dir} "
                          f"holds none ({STATISTICS_FILE}, written by dpdistill release): set it to 0")
    statistics, figures = load_statistics(path)
    if provenance is None or not figures["noise_multiplier"] > 0:  # a teacher without a guarantee, or statistics
        return StatisticsRead(statistics, None, None, figures)  # without noise: nothing read is covered
    released = StatisticsPlan.of_figures(figures).release(REPLACE_ONE)
    ledger = ReleaseLedger(teacher_dir)
    if not any(entry.method == STATISTICS_METHOD and math.isclose(entry.release.epsilon, released.epsilon)
               for entry in ledger.read().entries):
        raise ConfigError(f"the statistics in {path} are not the release {ledger.path} records ({STATISTICS_METHOD}): "
                          f"altered, or written by something else; release them again with dpdistill release")
    teacher = ledger.own() or provenance.as_release()
    own = Release(dp_accounting.ComposedDpEvent([teacher.event, released.event]), teacher.delta + released.delta,
                  teacher.epsilon + released.epsilon)
    replace_one = (None if provenance.epsilon_replace_one is None
                   else provenance.epsilon_replace_one + figures["epsilon_replace_one"])
    return StatisticsRead(statistics, dataclasses.replace(
        provenance, epsilon=provenance.epsilon + figures[epsilon_key(provenance.relation)],
        delta=provenance.delta + figures["delta"], epsilon_replace_one=replace_one,
        covers=f"{provenance.covers}, with its released feature statistics ({STATISTICS_FILE})"), own, figures)


class TranscriptionMethod(Method):
    """A data-free transcription: the engine with the paper's settings (`defaults`, applied before any preset)."""

    needs = Needs.TEACHER
    command = "transcribe"
    presets = tuple(PRESETS)
    defaults: ClassVar[dict[str, Any]] = {}  # where the paper's loop differs from DPSD's
    paper_settings: ClassVar[dict[str, Any]] = {}  # what the paper states, applied by the `paper` preset
    protects: ClassVar[str | None] = None  # the one privacy mode the paper defines (None: both)

    def check(self, config: TranscriptionConfig) -> None:
        """Refuse a privacy mode the paper does not define."""
        if self.protects is not None and config.privacy.mode not in (self.protects, "none"):
            raise ConfigError(f"{self.name} protects {self.protects} only: use --privacy {self.protects} (or none), "
                              f"or --method dpsd")

    def plan(self, source: Source, config: TranscriptionConfig, out_dir: Path,
             progress: Progress | None) -> "TranscriptionJob":
        return TranscriptionJob(source.teacher, config, out_dir, source.dataset, progress)

    def config_record(self, source: Source, config: TranscriptionConfig) -> dict[str, Any]:
        return config.to_dict()

    def interrupted(self, out_dir: Path) -> tuple[None, TranscriptionConfig] | None:
        """A transcription keeps its settings from its start: the teacher and data set are the caller's."""
        saved = saved_config(out_dir)
        if saved is None or not (out_dir / PRIVATE_DIR / "resume").exists():
            return None
        return None, TranscriptionConfig.from_dict(saved)

    def markdown(self, report: dict[str, Any]) -> str:
        return transcription_markdown(report)


class TranscriptionJob(Job):
    """The engine planned on a teacher: its release is the plan's every answer."""

    def __init__(self, teacher_dir: Path, config: TranscriptionConfig, out_dir: Path, dataset_name: str | None,
                 progress: Progress | None, phase: str | None = None) -> None:
        """`phase`: the engine's loop as a named phase of a longer run (a release's), not the run's own count."""
        self.teacher, self.meta = read_teacher(teacher_dir)
        self.provenance = Provenance.of_meta(self.meta)  # None: a teacher trained without DP
        if isinstance(self.teacher, TeacherEnsemble):  # the mechanism aggregates the members' answers
            config = dataclasses.replace(config, privacy=dataclasses.replace(config.privacy,
                                                                             teachers=len(self.teacher)))
        self.config = config
        self.in_shape, num_classes = tuple(self.meta["in_shape"]), int(self.meta["num_classes"])
        self.dataset_name = dataset_name or self.meta.get("dataset")
        self.dataset = (evaluation_set(self.dataset_name, self.in_shape, num_classes, saved_class_names(self.meta))
                        if self.dataset_name else None)
        self.class_names = model_class_names(self.meta, self.dataset)  # the student's: the teacher's classes
        self.progress, self.out_dir = progress, out_dir
        read = released_statistics(teacher_dir, config, self.provenance)
        self.provenance, self.own, self.statistics_figures = read.provenance, read.own, read.figures
        self.engine = TranscriptionEngine(config, self.teacher, self.in_shape, num_classes, self.dataset,
                                          out_dir / PRIVATE_DIR,
                                          progress if phase is None else in_phase(progress, phase, config.iterations),
                                          statistics=read.statistics)
        self.engine.plan.refuse_near_random()
        self.ledger_dir = teacher_dir
        self.source = self.engine.samples
        if self.provenance is not None and self.source is not None:
            raise ConfigError(f"the teacher in {teacher_dir} is itself a DP release, and a sample source is another "
                              f"release from the private data: their composition under one relation is not "
                              f"implemented; transcribe the teacher with its own generator (drop --sample-source)")
        self.planned = self._run_release(self._answers(self.engine.plan.planned_queries))
        self.partition: dict[str, Any] = {}  # what the partition assumes, for the report's privacy section
        self.uncovered = ((self.source.uncovered if self.source else [])
                          + partition_reads(self.partition, self.meta.get("ensemble"))
                          + uncovered_reads(config, self.provenance))
        # a teacher trained here on a data set: that data set's ledger records the release too (a DP teacher's
        # transcription spends nothing more)
        self.data_set = None if self.provenance is not None else teacher_data_set(self.meta)
        self.inherits = None if self.provenance is None else teacher_dir  # the models are its release

    def _answers(self, count: int) -> Release:
        """The release of `count` answers; from a DP teacher without noise, none (post-processing)."""
        if self.provenance is not None and self.engine.plan.query is None:
            return Release.post_processing(self.provenance.delta)
        return Release.of_plan(self.engine.plan, count)

    def _run_release(self, route: Release) -> Release:
        """What the teacher's ledger records: the answers' release, composed with the sample source's."""
        return route if self.source is None else self.source.composed(route)

    def run(self, resume: bool) -> Outcome:
        config, result = self.config, self.engine.run(resume=resume)
        route = self._answers(result.answered)
        privacy = {**result.privacy_summary(), **self.partition}
        if self.source is not None:
            privacy = self.source.privacy(privacy, route)
        if self.provenance is not None:
            privacy = inherited_privacy(privacy, self.provenance)
        if self.statistics_figures is not None:
            epsilon = self.statistics_figures[epsilon_key(privacy["relation"])]  # under the report's relation
            privacy.update(released_statistics={**self.statistics_figures, "epsilon": epsilon},
                           epsilon_scope=STATISTICS_SCOPE)
        privacy = with_selection(privacy, selection_notes((DP_TEACHER_SELECTION, RELEASE_LOOP_SELECTION),
                                                          dataclasses.asdict(config),
                                                          data_digest(self.meta, self.dataset)))
        report, models, write_files = transcription_release(result, config, self.in_shape, self.class_names,
                                                            self.dataset_name, self.source is None, self.dataset,
                                                            self._labeller(), self.progress,
                                                            release_state(self.out_dir))
        report["resumed"] = resume  # its wall time is then this process's part only
        if self.source is not None:
            report["samples"] = f"drawn uniformly from {self.source.description}; no generator was trained"
        if self.provenance is not None:  # a DP release's accuracy on public test images is public
            report["accuracy"]["teacher"] = self._teacher_accuracy()
        covers = (SOURCE_COVERS if self.source is not None else COVERS if self.provenance is None
                  else DP_TEACHER_COVERS if self.statistics_figures is None else STATISTICS_COVERS)
        return Outcome(
            report=report, privacy=privacy, covers=covers, models=models,
            private_record=lambda: {} if self.provenance is not None else {
                "accuracy": {"teacher": self._teacher_accuracy()}},
            release=self._run_release(route), write_files=write_files)

    def asked(self) -> bool:
        return self.engine.started

    def _teacher_accuracy(self) -> float | None:
        return teacher_accuracy(self.teacher, self.meta, self.dataset, self.dataset_name, self.config.device)

    def _labeller(self) -> tuple[nn.Module, str] | None:
        """Who may label the synthetic set: the teacher where reading it is free, else (None) the student."""
        if self.provenance is not None:
            return self.teacher, "the teacher (a DP release: free to read)"
        if self.config.privacy.mode == "none":
            return self.teacher, "the teacher (no privacy)"
        return None


MECHANISM_FIGURES = ("epsilon", "epsilon_rdp", "epsilon_replace_one", "epsilon_add_remove", "relation",
                     "relation_note", "guarantee", "accountant", "paper_epsilon", "paper_epsilon_label")


def inherited_privacy(summary: dict[str, Any], teacher: Provenance) -> dict[str, Any]:
    """The `privacy` section of a transcription of a DP teacher: the teacher's guarantee, which post-processing
    keeps whatever the engine does with it; a noisy mode's own figures (charged to the teacher's ledger as usual)
    follow as the answers' epsilon."""
    mechanism = {key: value for key, value in summary.items() if key not in MECHANISM_FIGURES}
    if summary["mode"] != "none":
        mechanism["route_epsilon"] = summary["epsilon"]
    return {**mechanism, **teacher.privacy()}


def transcription_release(result: TranscriptionResult, config: TranscriptionConfig, in_shape: tuple[int, ...],
                          class_names: Sequence[str], dataset_name: str | None, trained_generator: bool = True,
                          dataset: ImageDataset | None = None, labeller: tuple[nn.Module, str] | None = None,
                          progress: Progress | None = None, state_dir: Path | None = None
                          ) -> tuple[dict[str, Any], dict[str, Any], Callable[[Path, dict[str, Any]], None]]:
    """What a finished engine releases, wherever its teacher was: the report's accuracy, timing and history, the
    student (and a trained generator), its synthetic set (`config.synthetic_size` images labelled by `labeller`, a
    model and what it is, where reading it is free; else by the student) measured on `dataset`, and the files beside
    them. The synthetic set's drawing, its classifier and its fidelity are phases of `progress`; the set, once
    drawn, and its classifier under way are kept in the run's resume directory `state_dir`."""
    queries = max(result.answered, 1)
    report = {"privacy_mode": config.privacy.mode, "dataset": dataset_name,
              "accuracy": {"student": result.history[-1].get("student_accuracy") if result.history else None},
              "timing": {"wall_seconds": result.wall_seconds,
                         "samples_per_second": queries / max(result.wall_seconds, 1e-9),
                         "phases": result.phase_seconds},
              "history": result.history}
    num_classes = len(class_names)
    models = {"student": (result.student, classifier_meta(config.student_arch, in_shape, class_names, dataset_name))}
    synthetic = None
    if config.synthetic_size and trained_generator:
        started = time.perf_counter()
        synthetic = synthetic_set(result.generator, result.latents, config, num_classes,
                                  labeller or (result.student, "the student"), progress, state_dir)
        report["synthetic"], classifier_accuracy = measure_synthetic(*synthetic, num_classes, config, dataset,
                                                                     progress, state_dir)
        report["accuracy"]["synthetic"] = classifier_accuracy
        report["timing"]["synthetic_seconds"] = time.perf_counter() - started  # drawn, measured
    if trained_generator:
        models["generator"] = (result.generator, {
            "kind": "generator", "latent_dim": config.latent_dim, "out_shape": list(in_shape),
            "width": list(config.generator_width), "dataset": dataset_name, "dpdistill_version": __version__})

    def write_files(out_dir: Path, _report: dict[str, Any]) -> None:
        """The latent vectors (of a trained generator), the synthetic set and its grid, or else 64 samples titled
        with the student's classes, and the training curve."""
        if trained_generator:
            save_file({"latents": result.latents.cpu().contiguous()}, out_dir / "latents.safetensors")
        if synthetic is not None:
            synthetic_files(*synthetic[:2], class_names)(out_dir, _report)
        elif trained_generator:
            with torch.no_grad():
                samples = result.generator(result.latents[:64])
            labels = predict(result.student, samples, device=config.device).tolist()
            save_image_grid(samples, out_dir / "samples.png", titles=[class_names[label] for label in labels])
        save_training_curve(result.history, out_dir / "training.png")

    return report, models, write_files


def synthetic_set(generator: nn.Module, latents: Tensor, config: TranscriptionConfig, num_classes: int,
                  labeller: tuple[nn.Module, str], progress: Progress | None = None, state_dir: Path | None = None
                  ) -> tuple[Tensor, Tensor, str]:
    """`config.synthetic_size` images from `generator`, classes balanced by the labeller's argmax: its images,
    labels and who labelled them. Fresh latent vectors for a generator trained on fresh ones; for learnt latent
    vectors (DPSD's `latents`), draws from the Gaussian fitted to them. Kept in `state_dir` once drawn (minutes for
    60,000 images), where a resumed run finds it."""
    model, labelled_by = labeller
    kept = None if state_dir is None else state_dir / SYNTHETIC_STATE
    if kept is not None and (kept / STATE_SKELETON).exists():
        saved = load_state(kept)
        return saved["images"], saved["labels"], labelled_by
    device = torch.device(config.device)
    if config.latents == "fresh":
        mean, std = torch.zeros(config.latent_dim), torch.ones(config.latent_dim)
    else:
        mean, std = latents.mean(0).cpu(), latents.std(0).cpu()
    draws = torch.Generator().manual_seed(config.seed)
    generator = generator.eval()

    def generate(count: int) -> Tensor:
        drawn = mean + std * torch.randn(count, config.latent_dim, generator=draws)
        return generator(drawn.to(device))

    images, labels = balanced_draw(generate, lambda batch: predict(model, batch, device=device),
                                   config.synthetic_size, num_classes, progress=progress)
    if kept is not None:
        save_state(kept, {"images": images, "labels": labels})
    return images, labels, labelled_by


def measure_synthetic(images: Tensor, labels: Tensor, labelled_by: str, num_classes: int,
                      config: TranscriptionConfig, dataset: ImageDataset | None, progress: Progress | None = None,
                      state_dir: Path | None = None) -> tuple[dict[str, Any], float | None]:
    """The synthetic set's report entry, and the accuracy on the real test split of a classifier trained on the set
    alone (DataLens' protocol, final model) and the set's Fréchet distance to that split; without a data set to test
    on, only what the set is."""
    entry: dict[str, Any] = {"file": SYNTHETIC_FILE, "images": len(labels),
                             "labelled_by": f"the argmax of {labelled_by}",
                             "per_class": torch.bincount(labels, minlength=num_classes).tolist()}
    if dataset is None:
        return entry, None
    _, evaluation, seconds = evaluate_synthetic(dataset, images, labels, "transcription", StudentSettings(
        config.synthetic_classifier, config.synthetic_epochs, EVALUATION_LR, EVALUATION_BATCH, config.seed,
        config.device, every_epoch=False), progress, None if state_dir is None else state_dir / CLASSIFIER_STATE)
    entry.update(classifier=config.synthetic_classifier, classifier_epochs=config.synthetic_epochs,
                 measured_on=evaluation["measured_on"], classifier_seconds=seconds,
                 fidelity=scattering_frechet(images, dataset.x_test, config.device,
                                             in_phase(progress, FIDELITY_PHASE)))
    return entry, evaluation["accuracy"]["student"]
