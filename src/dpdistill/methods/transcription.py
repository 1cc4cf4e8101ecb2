"""What DPSD, DPDFD and SRR share as methods: a teacher transcribed data-free by one engine (methods/engine.py)
into a student and a generator. Each of the three is a `TranscriptionMethod` with its paper's settings
(methods/dpsd.py, dpdfd.py, srr.py); the presets of config.py apply to all three."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch
from safetensors.torch import save_file

from dpdistill import __version__
from dpdistill.errors import ConfigError
from dpdistill.evaluation.metrics import predict
from dpdistill.methods.base import Job, Method, Needs, Outcome, Progress, Source
from dpdistill.methods.config import PRESETS, TranscriptionConfig
from dpdistill.methods.engine import TranscriptionEngine, TranscriptionResult
from dpdistill.methods.teachers import classifier_meta, evaluation_set, read_teacher, teacher_accuracy
from dpdistill.models.ensemble import TeacherEnsemble, partition_reads
from dpdistill.privacy.ledger import Release, UncoveredRead, reproducible_noise_read
from dpdistill.reporting.report import PRIVATE_DIR, save_image_grid, save_training_curve, transcription_markdown
from dpdistill.runs import saved_config

COVERS = "the student, the generator and its latent vectors (post-processing of the noisy releases)"
SOURCE_COVERS = ("the student (post-processing of the sample source's release and the noisy answers; epsilon is "
                 "their composition)")
NO_PRIVACY = UncoveredRead("the teacher's answers, without noise (privacy mode none)", "nothing")
GENERATOR_READS_TEACHER = UncoveredRead(
    "the teacher, without noise, by the generator",
    "NO formal guarantee for the student or the generator: the synthetic inputs depend on the non-private teacher "
    "(teacher as discriminator, generator pretrained on the teacher, or adversarial term); the stated epsilon "
    "covers only the teacher's answers given those inputs")


def uncovered_reads(config: TranscriptionConfig) -> list[UncoveredRead]:
    """The reads of the teacher that no mechanism protects, the most sweeping first."""
    reads = [NO_PRIVACY] if config.privacy.mode == "none" else []
    reads += reproducible_noise_read(config.reproducible_noise)
    if config.generator_sees_teacher:
        reads.append(GENERATOR_READS_TEACHER)
    return reads


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
                 progress: Progress | None) -> None:
        self.teacher, self.meta = read_teacher(teacher_dir)
        if isinstance(self.teacher, TeacherEnsemble):  # the mechanism aggregates the members' answers
            config = dataclasses.replace(config, privacy=dataclasses.replace(config.privacy,
                                                                             teachers=len(self.teacher)))
        self.config = config
        self.in_shape, num_classes = tuple(self.meta["in_shape"]), int(self.meta["num_classes"])
        self.dataset_name = dataset_name or self.meta.get("dataset")
        self.dataset = evaluation_set(self.dataset_name, self.in_shape, num_classes) if self.dataset_name else None
        self.engine = TranscriptionEngine(config, self.teacher, self.in_shape, num_classes, self.dataset,
                                          out_dir / PRIVATE_DIR, progress)
        self.ledger_dir = teacher_dir
        self.source = self.engine.samples
        self.planned = self._run_release(Release.of_plan(self.engine.plan, self.engine.plan.planned_queries))
        self.partition: dict[str, Any] = {}  # what the partition assumes, for the report's privacy section
        self.uncovered = ((self.source.uncovered if self.source else [])
                          + partition_reads(self.partition, self.meta.get("ensemble")) + uncovered_reads(config))

    def _run_release(self, route: Release) -> Release:
        """What the teacher's ledger records: the answers' release, composed with the sample source's."""
        return route if self.source is None else self.source.composed(route)

    def run(self, resume: bool) -> Outcome:
        config, result = self.config, self.engine.run(resume=resume)
        route = Release.of_plan(result.plan, result.answered)
        privacy = {**result.privacy_summary(), **self.partition}
        if self.source is not None:
            privacy = self.source.privacy(privacy, route)
        report, models, write_files = transcription_release(result, config, self.in_shape,
                                                            int(self.meta["num_classes"]), self.dataset_name,
                                                            trained_generator=self.source is None)
        if self.source is not None:
            report["samples"] = f"drawn uniformly from {self.source.description}; no generator was trained"
        return Outcome(
            report=report, privacy=privacy, covers=COVERS if self.source is None else SOURCE_COVERS, models=models,
            private_record=lambda: {"accuracy": {"teacher": teacher_accuracy(
                self.teacher, self.meta, self.dataset, self.dataset_name, config.device)}},
            release=self._run_release(route), write_files=write_files)


def transcription_release(result: TranscriptionResult, config: TranscriptionConfig, in_shape: tuple[int, ...],
                          num_classes: int, dataset_name: str | None, trained_generator: bool = True
                          ) -> tuple[dict[str, Any], dict[str, Any], Callable[[Path, dict[str, Any]], None]]:
    """What a finished engine releases, wherever its teacher was: the report's accuracy, timing and history, the
    student (and a trained generator), and the files beside them."""
    queries = max(result.answered, 1)
    report = {"privacy_mode": config.privacy.mode, "dataset": dataset_name,
              "accuracy": {"student": result.history[-1].get("student_accuracy") if result.history else None},
              "timing": {"wall_seconds": result.wall_seconds,
                         "samples_per_second": queries / max(result.wall_seconds, 1e-9),
                         "phases": result.phase_seconds},
              "history": result.history}
    models = {"student": (result.student, classifier_meta(config.student_arch, in_shape, num_classes, dataset_name))}
    if trained_generator:
        models["generator"] = (result.generator, {
            "kind": "generator", "latent_dim": config.latent_dim, "out_shape": list(in_shape),
            "width": list(config.generator_width), "dataset": dataset_name, "dpdistill_version": __version__})

    def write_files(out_dir: Path, _report: dict[str, Any]) -> None:
        """The latent vectors, 64 samples titled with the student's classes (of a trained generator only), and
        the training curve."""
        if trained_generator:
            save_file({"latents": result.latents.cpu().contiguous()}, out_dir / "latents.safetensors")
            with torch.no_grad():
                samples = result.generator(result.latents[:64])
            labels = predict(result.student, samples, device=config.device).tolist()
            save_image_grid(samples, out_dir / "samples.png", labels=labels)
        save_training_curve(result.history, out_dir / "training.png")

    return report, models, write_files
