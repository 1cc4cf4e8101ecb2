"""DPSD: differentially private synthetic distillation (seed 000, Algorithm 1).

Teacher, student and generator learn together. Each iteration: the generator turns trainable latent vectors
into a batch of synthetic images; the teacher's knowledge about them is released only through a privacy
mechanism (data- or label-sensitive annotation); the student learns from those noisy targets; the generator
and its latent vectors then learn with the (updated) student as discriminator. The private data is never read,
and with the student as discriminator the generator only ever sees noisy releases, so the released student and
generator are post-processing of the mechanism's outputs.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor, nn

from dpdistill.data.base import ImageDataset
from dpdistill.errors import ConfigError
from dpdistill.evaluation.metrics import accuracy
from dpdistill.losses.distillation import inverse_class_frequency, soft_cross_entropy
from dpdistill.losses.generator import activation_loss, information_entropy_loss, one_hot_loss
from dpdistill.methods.annotation import (
    Annotator,
    DistillationGradient,
    OutputGradientAnnotator,
    RandomizedResponseAnnotator,
    TeacherAnnotator,
)
from dpdistill.methods.config import TranscriptionConfig
from dpdistill.methods.state import load_state, save_state
from dpdistill.models.base import Classifier
from dpdistill.models.registry import build_classifier, build_generator
from dpdistill.privacy.accounting import PrivacyLedger
from dpdistill.privacy.budget import PrivacyPlan, plan_privacy

ProgressCallback = Callable[[dict], None]


@dataclass
class TranscriptionResult:
    """What a run produced: the released models, what it spent, and how it went."""

    student: Classifier
    generator: nn.Module
    latents: Tensor
    plan: PrivacyPlan
    answered: int
    history: list[dict]
    wall_seconds: float
    phase_seconds: dict[str, float] = field(default_factory=dict)

    def privacy_summary(self) -> dict:
        return self.plan.summary(self.answered)


class DPSDTranscriber:
    """Runs Algorithm 1. `test_set` is used only to report accuracy, never to train."""

    def __init__(self, config: TranscriptionConfig, teacher: Classifier, in_shape: tuple[int, int, int],
                 num_classes: int, test_set: ImageDataset | None = None, work_dir: Path | None = None,
                 progress: ProgressCallback | None = None) -> None:
        config.validate(num_classes)
        self.config = config
        self.device = torch.device(config.device)
        self.in_shape = in_shape
        self.num_classes = num_classes
        self.teacher = teacher.to(self.device).eval()
        for parameter in self.teacher.parameters():
            parameter.requires_grad_(False)
        self.test_set = test_set
        self.work_dir = work_dir
        self.progress = progress
        self.plan = plan_privacy(config.privacy, num_classes, config.batch_size, config.iterations)

        torch.manual_seed(config.seed)
        self.student = build_classifier(config.student_arch, in_shape, num_classes).to(self.device)
        self.generator = build_generator(config.latent_dim, in_shape, config.generator_width).to(self.device)
        self.latents = torch.randn(config.batch_size, config.latent_dim, device=self.device, requires_grad=True)
        self.student_optimizer = torch.optim.Adam(self.student.parameters(), lr=config.student_lr)
        self.generator_optimizer = torch.optim.Adam([*self.generator.parameters(), self.latents], lr=config.generator_lr)
        self.noise_generator = torch.Generator().manual_seed(config.seed + 1)
        self.ledger = self.plan.ledger()
        self.annotator = self._make_annotator(self.ledger)
        self.iteration = 0
        self.history: list[dict] = []

    def _make_annotator(self, ledger: PrivacyLedger | None) -> Annotator:
        config, plan = self.config, self.plan
        if config.privacy.mode == "none":
            return TeacherAnnotator(config.temperature)
        if config.privacy.mode == "data":
            gradient = DistillationGradient(config.distill_loss, config.dkd_alpha, config.dkd_beta, config.temperature)
            return OutputGradientAnnotator(gradient, ledger, config.privacy.beta, plan.sigma, config.top_k,
                                           config.target_step, self.noise_generator, config.gradient_operation)
        if config.top_k is None or config.top_k < 2:
            raise ConfigError("label mode needs --top-k of at least 2 (the candidate set size)")
        return RandomizedResponseAnnotator(ledger, plan.epsilon0, config.top_k, self.noise_generator)

    # --- one iteration -------------------------------------------------------------------------------------

    def step(self, timings: dict[str, float]) -> dict:
        """One iteration of Algorithm 1; returns its losses."""
        config = self.config
        clock = time.perf_counter()
        self.generator.train()
        if config.latents == "fresh":
            with torch.no_grad():
                self.latents.normal_()
        images = self.generator(self.latents)
        detached = images.detach()
        with torch.no_grad():
            teacher_logits = self.teacher(detached)
        clock = _lap(timings, "generate+teacher", clock)

        self.student.train()
        student_logits = self.student(detached)
        targets = self.annotator.annotate(teacher_logits, student_logits)
        clock = _lap(timings, "annotate", clock)

        weights = inverse_class_frequency(targets) if config.class_balanced else torch.ones(len(targets), device=self.device)

        def fit_to_targets(logits: Tensor) -> Tensor:
            """L_s of Eq. 7, optionally class-balanced: the student's and the generator's shared term."""
            return (soft_cross_entropy(logits, targets) * weights).mean()

        student_loss = fit_to_targets(student_logits)
        for repeat in range(config.student_steps):
            if repeat:
                student_loss = fit_to_targets(self.student(detached))
            self.student_optimizer.zero_grad(set_to_none=True)
            student_loss.backward()
            self.student_optimizer.step()
        clock = _lap(timings, "student", clock)

        self.student.eval()
        self.student.requires_grad_(False)
        discriminator = self.teacher if config.discriminator == "teacher" else self.student
        features = discriminator.features(images)
        logits = discriminator.classify(features)
        student_logits = logits if discriminator is self.student else self.student(images)
        generator_terms = {
            "student": config.generator_student_weight * fit_to_targets(student_logits),
            "one_hot": config.one_hot_weight * one_hot_loss(logits),
            "entropy": config.entropy_weight * information_entropy_loss(logits),
            "activation": config.activation_weight * activation_loss(features),
        }
        generator_loss = sum(generator_terms.values())
        self.generator_optimizer.zero_grad(set_to_none=True)
        generator_loss.backward()
        self.generator_optimizer.step()
        self.student.requires_grad_(True)
        _lap(timings, "generator", clock)
        return {"student_loss": student_loss.item(), "generator_loss": generator_loss.item(),
                **{f"g_{name}": value.item() for name, value in generator_terms.items()}}

    # --- the run -------------------------------------------------------------------------------------------

    def run(self, resume: bool = False) -> TranscriptionResult:
        if resume:
            self._restore()
        timings: dict[str, float] = defaultdict(float)
        started = time.perf_counter()
        while self.iteration < self.config.iterations:
            losses = self.step(timings)
            self.iteration += 1
            record = {"iteration": self.iteration, **losses, "queries": self._answered()}
            if self.iteration % self.config.eval_every == 0 or self.iteration == self.config.iterations:
                clock = time.perf_counter()
                record["student_accuracy"] = self.evaluate()
                _lap(timings, "evaluate", clock)
            self.history.append(record)
            if self.progress:
                self.progress(record)
            if self.work_dir and (self.iteration % self.config.checkpoint_every == 0):
                self._checkpoint()
        wall = time.perf_counter() - started
        return TranscriptionResult(self.student.eval(), self.generator.eval(), self.latents.detach(), self.plan,
                                   self._answered(), self.history, wall, dict(timings))

    def evaluate(self) -> float | None:
        if self.test_set is None:
            return None
        return accuracy(self.student, self.test_set.x_test, self.test_set.y_test, device=self.device)

    def _answered(self) -> int:
        return self.ledger.answered if self.ledger else self.iteration * self.config.batch_size

    # --- resumable state -----------------------------------------------------------------------------------

    def _checkpoint(self) -> None:
        save_state(self.work_dir / "resume", {
            "iteration": self.iteration,
            "answered": self._answered(),
            "student": self.student.state_dict(),
            "generator": self.generator.state_dict(),
            "latents": self.latents,
            "student_optimizer": self.student_optimizer.state_dict(),
            "generator_optimizer": self.generator_optimizer.state_dict(),
            "noise_rng": self.noise_generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "history": self.history,
        })

    def _restore(self) -> None:
        """Continue from the last checkpoint: same weights, optimizers, random streams and spent budget."""
        state = load_state(self.work_dir / "resume")
        self.student.load_state_dict(state["student"])
        self.generator.load_state_dict(state["generator"])
        with torch.no_grad():
            self.latents.copy_(state["latents"])
        self.student_optimizer.load_state_dict(state["student_optimizer"])
        self.generator_optimizer.load_state_dict(state["generator_optimizer"])
        self.noise_generator.set_state(state["noise_rng"])
        torch.set_rng_state(state["torch_rng"])
        self.iteration = state["iteration"]
        self.history = state["history"]
        if self.ledger is not None:
            self.ledger.answered = state["answered"]


def _lap(timings: dict[str, float], phase: str, since: float) -> float:
    now = time.perf_counter()
    timings[phase] += now - since
    return now
