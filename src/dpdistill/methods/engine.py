"""The data-free distillation engine that DPSD, DPDFD and SRR configure (methods/dpsd.py, dpdfd.py, srr.py).

It runs DPSD's Algorithm 1 (seed 000), of which the other two are settings. Teacher, student and generator learn
together. Each iteration: the generator turns trainable latent vectors
into a batch of synthetic images; the teacher's knowledge about them is released only through a privacy
mechanism (data- or label-sensitive annotation); the student learns from those noisy targets; the generator
and its latent vectors then learn with the (updated) student as discriminator. The private data is never read,
and with the student as discriminator the generator only ever sees noisy releases, so the released student and
generator are post-processing of the mechanism's outputs.

With `owners` (federated/transcription.py) the teacher is not here: data owners elsewhere answer each batch
through secure aggregation with their own noise (FedDPSD, seed 000's Algorithm 2), under a privacy plan the caller
calibrated for that mechanism.

With a sample source (`--sample-source`, data/sample_source.py) each batch is drawn from its synthetic images instead
of generated, and no generator is trained; the noise is calibrated so that the source's release and the answers
together stay within the budget.

The noise is secret (`privacy/randomness.py`): `--seed` fixes only the initialisation and the latent vectors. Every
answer is journaled before the student sees it, so a resumed run re-uses released answers instead of asking again.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from dpdistill.atomic import write_atomically
from dpdistill.data.augment import shift_and_flip
from dpdistill.data.base import ImageDataset
from dpdistill.data.sample_source import load_sample_source
from dpdistill.errors import CheckpointError, ConfigError
from dpdistill.evaluation.metrics import accuracy
from dpdistill.losses.distillation import inverse_class_frequency, kd_loss, soft_cross_entropy
from dpdistill.losses.generator import FeatureStatistics, data_free_terms, total_variation
from dpdistill.progress import Pace, Progress, in_phase
from dpdistill.training.annotation import (
    Annotator,
    CandidateSet,
    DistillationGradient,
    NoisyVoteAnnotator,
    OutputGradientAnnotator,
    RandomizedResponseAnnotator,
    RemoteAnnotator,
    TeacherAnnotator,
)
from dpdistill.methods.config import TranscriptionConfig
from dpdistill.training.feature_statistics import Statistics, class_targets, statistics_targets
from dpdistill.training.state import STATE_SKELETON, Checkpoints, load_state, save_state
from dpdistill.models.base import Classifier
from dpdistill.models.ensemble import TeacherEnsemble
from dpdistill.models.registry import build_classifier, build_generator, initialise
from dpdistill.privacy.accounting import PrivacyLedger
from dpdistill.privacy.budget import PrivacyPlan, plan_privacy
from dpdistill.privacy.randomness import NoiseSource, noise_source


PRETRAIN_PHASE = "generator pretraining"  # the progress display's name for DP-DFD's step 1


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
    noise: NoiseSource
    phase_seconds: dict[str, float] = field(default_factory=dict)

    def privacy_summary(self) -> dict:
        summary = self.plan.summary(self.answered)
        if self.plan.query is not None:
            summary["noise"] = self.noise.description
        return summary


class TranscriptionEngine:
    """Runs Algorithm 1 with the options of a `TranscriptionConfig`. `test_set` is used only to report accuracy, never to train."""

    def __init__(self, config: TranscriptionConfig, teacher: Classifier | TeacherEnsemble | None,
                 in_shape: tuple[int, int, int], num_classes: int, test_set: ImageDataset | None = None,
                 work_dir: Path | None = None, progress: Progress | None = None,
                 owners: RemoteAnnotator | None = None, privacy_plan: PrivacyPlan | None = None,
                 statistics: Statistics | None = None) -> None:
        """`statistics`: the teacher's released feature statistics (training/feature_statistics.py), which the
        generator's images are to match with weight `statistics_weight`."""
        config.validate(num_classes)
        if owners is None:
            _check_teacher(config, teacher)
        elif privacy_plan is None:
            raise ConfigError("data owners' answers need the privacy plan calibrated for their noise shares")
        else:
            check_remote_settings(config)
        self.config = config
        self.device = torch.device(config.device)
        self.in_shape = in_shape
        self.num_classes = num_classes
        self.owners = owners
        self.teacher = None if teacher is None else teacher.to(self.device).eval().requires_grad_(False)
        self.test_set = test_set
        self.work_dir = work_dir
        self.progress = progress
        self.samples = (None if config.sample_source is None
                        else load_sample_source(Path(config.sample_source), in_shape, num_classes))
        cost = (None if self.samples is None or config.privacy.mode == "none"
                else self.samples.cost(config.privacy.epsilon, config.privacy.delta))
        self.plan = privacy_plan or plan_privacy(config.privacy, num_classes, config.batch_size,
                                                 config.query_iterations(config.iterations), cost)
        # which source images each iteration asks about: uniform, from --seed, the same on a resumed run
        self.draws = None if self.samples is None else torch.randint(
            len(self.samples.labels), (config.iterations, config.batch_size),
            generator=torch.Generator().manual_seed(config.seed))
        self.trains_generator = config.generator_updates and self.samples is None

        torch.manual_seed(config.seed)
        self.student = initialise(build_classifier(config.student_arch, in_shape, num_classes), config.init
                                  ).to(self.device)
        self.generator = initialise(build_generator(config.latent_dim, in_shape, config.generator_width), config.init
                                    ).to(self.device)
        self.latents = torch.randn(config.batch_size, config.latent_dim, device=self.device, requires_grad=True)
        self.student_optimizer = torch.optim.Adam(self.student.parameters(), lr=config.student_lr)
        self.generator_optimizer = torch.optim.Adam([*self.generator.parameters(), self.latents], lr=config.generator_lr,
                                                    betas=(config.generator_beta1, 0.999))
        self.replay = ReplayBuffer(config.replay_size) if config.replay_size else None
        discriminators = {config.discriminator: self.teacher if config.discriminator == "teacher" else self.student}
        if config.generator_pretrain_steps:
            discriminators["teacher"] = self.teacher
        if config.batchnorm_weight > 0 and not any(isinstance(module, nn.BatchNorm2d) for model in discriminators.values()
                                                   for module in model.modules()):
            raise ConfigError(f"batchnorm-weight needs a discriminator with BatchNorm layers; the "
                              f"{' and '.join(discriminators)} ({', '.join(type(m).__name__ for m in discriminators.values())}) "
                              f"have none")
        if (statistics is None) != (config.statistics_weight == 0):
            raise ConfigError("statistics-weight weighs the teacher's released feature statistics: a release makes "
                              "them (dpdistill release); without them set it to 0")
        self.released_statistics = (None if statistics is None
                                    else statistics_targets(self.teacher, statistics, self.device))
        self.class_statistics = (None if statistics is None
                                 else class_targets(statistics, in_shape, num_classes, self.device))
        self.noise = noise_source(config.reproducible_noise, config.seed)
        self.ledger = self.plan.ledger()
        self.journal = AnswerJournal(work_dir / "resume" / "answers") if work_dir and self.ledger is not None else None
        self.annotator = None if owners is not None else self._make_annotator(self.ledger)
        # Without privacy the targets are the teacher's softmax at `temperature` (Hinton's KD): the student is then
        # compared at the same temperature. Private targets are probabilities at temperature 1.
        self.fit_temperature = config.temperature if config.privacy.mode == "none" else 1.0
        self.iteration = 0
        self.started = False  # whether the loop began: from then on the teacher may have been asked
        self.pretrained = 0  # generator pretraining steps done
        self.history: list[dict] = []

    def _make_annotator(self, ledger: PrivacyLedger | None) -> Annotator:
        config, plan = self.config, self.plan
        if config.privacy.mode == "none":
            return TeacherAnnotator(config.temperature)
        if config.privacy.mode == "data":
            gradient = DistillationGradient(config.distill_loss, config.dkd_alpha, config.dkd_beta, config.temperature,
                                            config.output_space)
            return OutputGradientAnnotator(gradient, ledger, config.privacy.beta, plan.sigma, config.top_k,
                                           config.target_step, self.noise, config.gradient_operation)
        if config.top_k is None or config.top_k < 2:
            raise ConfigError("label mode needs --top-k of at least 2 (the candidate set size)")
        candidates = CandidateSet(config.top_k, None if config.candidates == "top-k"
                                  else config.candidate_threshold or 1 / (2 * self.num_classes))
        if config.privacy.votes:
            return NoisyVoteAnnotator(ledger, plan.sigma, candidates, self.noise,
                                      config.vote_margin * plan.sigma)
        return RandomizedResponseAnnotator(ledger, plan.epsilon0, candidates, self.noise)

    # --- one iteration -------------------------------------------------------------------------------------

    def step(self, timings: dict[str, float]) -> dict:
        """One iteration of Algorithm 1; returns its losses. Between queries (`query_every` > 1) the student
        learns from replayed answers only and the generator from the student alone."""
        config = self.config
        queried = self.iteration % config.query_every == 0
        journaled = self._journaled() if queried else None
        clock = time.perf_counter()
        images = self._batch()
        detached = images.detach()
        teacher_view, teacher_logits = None, None
        if config.discriminator == "teacher":  # one teacher pass serves the annotation and the generator's loss
            teacher_view = self._discriminate(self.teacher, images)
            teacher_logits = teacher_view.logits.detach()
        elif queried and journaled is None and self.owners is None:
            teacher_logits = self._teacher_answers(detached)
        clock = _lap(timings, "generate+teacher", clock)

        self.student.train()
        targets, fresh_loss, answered = None, None, {}
        if queried:
            student_logits = self.student(detached)
            targets = journaled if journaled is not None else self._annotate(detached, teacher_logits,
                                                                             student_logits)
            labelled = targets.ne(0).any(1)  # the mechanism may decline to label uncertain samples (a row of zeros)
            answered = {"labelled": labelled.float().mean().item()}
            if labelled.any():
                fresh_loss = self._fit_to_targets(student_logits[labelled], targets[labelled])
                if self.replay is not None:
                    self.replay.add(detached[labelled], targets[labelled])
            clock = _lap(timings, "annotate", clock)

        self._set_student_lr()
        student_loss = torch.zeros(())
        for repeat in range(config.student_steps):
            if repeat == 0 and fresh_loss is not None:
                student_loss = fresh_loss
            elif self.replay is not None and self.replay.images is None:
                break  # nothing labelled yet
            else:
                student_loss = self._replay_loss(detached, targets)
            self.student_optimizer.zero_grad(set_to_none=True)
            student_loss.backward()
            self.student_optimizer.step()
        clock = _lap(timings, "student", clock)
        if not self.trains_generator:
            return {"student_loss": student_loss.item(), **answered}

        generator_terms = self._generator_terms(images, targets, teacher_view)
        generator_loss = sum(generator_terms.values())
        self.generator_optimizer.zero_grad(set_to_none=True)
        generator_loss.backward()
        self.generator_optimizer.step()
        self.student.requires_grad_(True)
        _lap(timings, "generator", clock)
        return {"student_loss": student_loss.item(), "generator_loss": generator_loss.item(), **answered,
                **{f"g_{name}": value.item() for name, value in generator_terms.items()}}

    def _batch(self) -> Tensor:
        """This iteration's samples: drawn from the sample source, or generated from the latent vectors."""
        if self.draws is not None:
            return self.samples.images[self.draws[self.iteration]].to(self.device)
        self.generator.train()
        if self.config.latents == "fresh":
            with torch.no_grad():
                self.latents.normal_()
        with torch.set_grad_enabled(self.config.generator_updates):
            return self.generator(self.latents)

    def _annotate(self, images: Tensor, teacher_logits: Tensor | None, student_logits: Tensor) -> Tensor:
        """The mechanism's answer (here, or the owners' through secure aggregation), journaled before the student
        sees it."""
        if self.owners is not None:
            targets = self.owners.annotate(images, student_logits.detach(), self.ledger)
        else:
            targets = self.annotator.annotate(teacher_logits, student_logits)
        if self.journal is not None:
            self.journal.write(self.iteration, targets, self.noise.state())
        return targets

    def _journaled(self) -> Tensor | None:
        """This iteration's answer if an interrupted run released it already: re-using it is post-processing,
        asking again would draw new noise for the same query."""
        if self.journal is None:
            return None
        targets = self.journal.targets(self.iteration)
        if targets is not None and targets.shape != (self.config.batch_size, self.num_classes):
            raise CheckpointError(f"the journaled answers of iteration {self.iteration} have shape "
                                  f"{tuple(targets.shape)}, the run asks {self.config.batch_size} x {self.num_classes}")
        return None if targets is None else targets.to(self.device)

    def _replay_loss(self, images: Tensor, targets: Tensor | None) -> Tensor:
        """The loss of an extra student step: on replayed samples (or the fresh batch again), augmented if asked.

        Without privacy the teacher labels the augmented images afresh; a private run keeps the released targets,
        so the extra steps stay post-processing."""
        config = self.config
        if self.replay is not None:
            images, targets = self.replay.sample(config.batch_size)
        augmented = config.augment_shift > 0 or config.augment_flip
        if augmented:
            images = shift_and_flip(images, config.augment_shift, config.augment_flip)
        logits = self.student(images)
        if augmented and config.privacy.mode == "none":
            targets = self.annotator.annotate(self._teacher_answers(images), logits.detach())
        return self._fit_to_targets(logits, targets)

    @torch.no_grad()
    def _teacher_answers(self, images: Tensor) -> Tensor:
        """The teacher's logits (n, classes), or each ensemble member's (members, n, classes)."""
        if isinstance(self.teacher, TeacherEnsemble):
            return self.teacher.member_logits(images)
        return self.teacher(images)

    def _fit_to_targets(self, logits: Tensor, targets: Tensor) -> Tensor:
        """L_s of Eq. 7, optionally class-balanced: the student's and the generator's shared term."""
        losses = soft_cross_entropy(logits / self.fit_temperature, targets)
        if self.config.class_balanced:
            losses = losses * inverse_class_frequency(targets)
        return losses.mean()

    def _set_student_lr(self) -> None:
        """Cosine decay computed from the iteration alone, so a resumed run follows the same schedule."""
        lr = self.config.student_lr
        if self.config.student_schedule == "cosine":
            lr *= 0.5 * (1 + math.cos(math.pi * self.iteration / self.config.iterations))
        for group in self.student_optimizer.param_groups:
            group["lr"] = lr

    def _discriminate(self, model: Classifier, images: Tensor) -> "DiscriminatorView":
        """A discriminator's features and logits on the generated images, with its BatchNorm-statistics term."""
        with FeatureStatistics.of_batchnorm(model, enabled=self.config.batchnorm_weight > 0) as batchnorm:
            features = model.features(images)
            logits = model.classify(features)
        return DiscriminatorView(features, logits, batchnorm.loss() if batchnorm.terms else None)

    def _generator_terms(self, images: Tensor, targets: Tensor | None,
                         teacher_view: "DiscriminatorView | None") -> dict[str, Tensor]:
        """DPSD Eq. 8 (L_s + L_g) plus the optional BatchNorm-statistics and adversarial terms; L_s only where the
        batch has fresh answers (`targets`)."""
        config = self.config
        self.student.eval()
        self.student.requires_grad_(False)
        view = teacher_view if teacher_view is not None else self._discriminate(self.student, images)
        student_logits = view.logits if teacher_view is None else self.student(images)
        terms = self._discriminator_terms(view)
        if self.released_statistics is not None:  # the teacher's layers, against their released statistics
            with FeatureStatistics(self.released_statistics) as statistics:
                teacher_logits = self.teacher(images)
            terms["statistics"] = config.statistics_weight * statistics.loss()
            if self.class_statistics is not None:  # and each class the teacher names, at coarse cells
                terms["class_statistics"] = config.statistics_weight * self.class_statistics.loss(
                    images, teacher_logits.argmax(1))
        if config.smoothness_weight > 0:
            terms["smoothness"] = config.smoothness_weight * total_variation(images)
        if targets is not None:
            terms["student"] = config.generator_student_weight * self._fit_to_targets(student_logits, targets)
        if config.adversarial_weight > 0:
            teacher_logits = teacher_view.logits if teacher_view is not None else self.teacher(images)
            divergence = kd_loss(student_logits, teacher_logits, self.fit_temperature) / self.fit_temperature**2
            terms["adversarial"] = -config.adversarial_weight * divergence.mean()
        return terms

    def _discriminator_terms(self, view: "DiscriminatorView") -> dict[str, Tensor]:
        """L_g: confident (one-hot), class-balanced (entropy), strongly activating samples, and BatchNorm
        statistics like the discriminator's training data's when asked for."""
        config = self.config
        terms = data_free_terms(view.logits, view.features, config.one_hot_weight, config.entropy_weight,
                                config.activation_weight)
        if view.batchnorm is not None:
            terms["batchnorm"] = config.batchnorm_weight * view.batchnorm
        return terms

    def pretrain_generator(self, timings: dict[str, float]) -> None:
        """DP-DFD step 1: the generator learns L_g with the teacher as fixed discriminator, before any private
        query. The teacher is read without noise, so nothing trained on these samples has a formal guarantee."""
        clock = time.perf_counter()
        self.generator.train()
        pace = Pace(in_phase(self.progress, PRETRAIN_PHASE, self.config.generator_pretrain_steps))
        checkpoints = Checkpoints(self.config.checkpoint_every)
        while self.pretrained < self.config.generator_pretrain_steps:
            pace.within({"done": self.pretrained})
            with torch.no_grad():
                self.latents.normal_()
            terms = self._discriminator_terms(self._discriminate(self.teacher, self.generator(self.latents)))
            loss = sum(terms.values())
            self.generator_optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.generator_optimizer.step()
            self.pretrained += 1
            if self.pretrained % self.config.eval_every == 0:
                pace({"done": self.pretrained, "pretrain_step": self.pretrained, "generator_loss": loss.item()})
            if self.work_dir:
                checkpoints(self.pretrained, self._checkpoint)
        _lap(timings, "pretrain", clock)

    # --- the run -------------------------------------------------------------------------------------------

    def run(self, resume: bool = False) -> TranscriptionResult:
        if resume:
            self._restore()
        elif self.journal is not None and self.journal.iterations():
            raise ConfigError(f"{self.journal.directory} holds the answers of an interrupted run: resume it (asking "
                              f"again would spend the budget twice)")
        timings: dict[str, float] = defaultdict(float)
        started = time.perf_counter()
        self.started = True
        self.pretrain_generator(timings)
        checkpoints = Checkpoints(self.config.checkpoint_every)
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
            if self.work_dir:  # the last iteration too: a resumed run then goes straight to the synthetic set
                checkpoints(self.iteration, self._checkpoint, final=self.iteration == self.config.iterations)
        wall = time.perf_counter() - started
        return TranscriptionResult(self.student.eval(), self.generator.eval(), self.latents.detach(), self.plan,
                                   self._answered(), self.history, wall, self.noise, dict(timings))

    def evaluate(self) -> float | None:
        if self.test_set is None:
            return None
        return accuracy(self.student, self.test_set.x_test, self.test_set.y_test, device=self.device)

    def _answered(self) -> int:
        if self.ledger is not None:
            return self.ledger.answered
        return self.config.query_iterations(self.iteration) * self.config.batch_size

    # --- resumable state -----------------------------------------------------------------------------------

    def _checkpoint(self) -> None:
        save_state(self.work_dir / "resume", {
            "iteration": self.iteration,
            "pretrained": self.pretrained,
            "student": self.student.state_dict(),
            "generator": self.generator.state_dict(),
            "latents": self.latents,
            "student_optimizer": self.student_optimizer.state_dict(),
            "generator_optimizer": self.generator_optimizer.state_dict(),
            "replay": self.replay.state() if self.replay is not None else {},
            "torch_rng": torch.get_rng_state(),
            "history": self.history,
        })

    def _restore(self) -> None:
        """Continue from the last checkpoint (same weights, optimizers and random streams), or from the start when
        the run stopped before its first checkpoint but after answers were journaled. The ledger counts every
        journaled answer, and a reproducible noise source continues after the last of them."""
        if self.journal is not None and self.journal.iterations():
            self.ledger.answered = self.journal.answered()
            self.noise.restore(self.journal.noise_state(self.journal.iterations()[-1]))
            if not (self.work_dir / "resume" / STATE_SKELETON).exists():
                return
        state = load_state(self.work_dir / "resume")
        if "noise_rng" in state:
            raise CheckpointError(f"the interrupted run in {self.work_dir} was written by an older dpdistill that drew "
                                  f"its noise from the seed and kept no answer journal: resuming would ask again and "
                                  f"spend the budget twice; start a new run elsewhere")
        self.student.load_state_dict(state["student"])
        self.generator.load_state_dict(state["generator"])
        with torch.no_grad():
            self.latents.copy_(state["latents"])
        self.student_optimizer.load_state_dict(state["student_optimizer"])
        self.generator_optimizer.load_state_dict(state["generator_optimizer"])
        if self.replay is not None:
            self.replay.restore(state["replay"])
        torch.set_rng_state(state["torch_rng"])
        self.iteration = state["iteration"]
        self.pretrained = state["pretrained"]
        self.history = state["history"]


def _check_teacher(config: TranscriptionConfig, teacher: Classifier | TeacherEnsemble | None) -> None:
    """The privacy request must count the teacher's members; only a single teacher can shape the generator."""
    if teacher is None:
        raise ConfigError("a transcription needs a teacher, or data owners that answer for theirs")
    members = len(teacher) if isinstance(teacher, TeacherEnsemble) else 1
    if members != config.privacy.teachers:
        raise ConfigError(f"the privacy request counts {config.privacy.teachers} teacher(s) but the teacher has "
                          f"{members}: the mechanism and its accounting depend on it")
    if members > 1 and (config.discriminator == "teacher" or config.generator_pretrain_steps):
        raise ConfigError("the teacher as discriminator (DPSD-T, generator pretraining) needs a single teacher, "
                          "not an ensemble")


def check_remote_settings(config: TranscriptionConfig) -> None:
    """Owners elsewhere answer only through their mechanism (data mode): nothing here may read a teacher."""
    if config.privacy.mode != "data":
        raise ConfigError(f"data owners answer in data mode, not {config.privacy.mode}")
    if config.generator_sees_teacher or config.sample_source is not None:
        raise ConfigError("with the teachers held by data owners the generator learns from the student only (no "
                          "teacher discriminator, pretraining, adversarial term or sample source)")


class AnswerJournal:
    """Write-ahead journal of a run's released answers: one small safetensors file per query iteration (the
    targets, a row of zeros where the mechanism declined to label), written atomically in the run's private state
    directory before the student sees them, removed with that directory when the run finishes, never published.

    A resumed run serves every journaled answer from here instead of asking the teacher again, and restores its
    ledger from here rather than from the checkpoint, so every answer ever released stays charged. An answer lost
    to a crash before it was journaled influenced nothing that was kept, so it was never released. Only a
    reproducible (debugging) noise source leaves its state with each answer; a secure one has none.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, iteration: int) -> Path:
        return self.directory / f"{iteration:07d}.safetensors"

    def write(self, iteration: int, targets: Tensor, noise_state: dict | None) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tensors = {"targets": targets.detach().cpu().contiguous()}
        metadata = {} if noise_state is None else {"noise": json.dumps(noise_state)}
        write_atomically({self._path(iteration): lambda path: save_file(tensors, path, metadata)})

    def iterations(self) -> list[int]:
        """The journaled query iterations, in order."""
        return sorted(int(path.stem) for path in self.directory.glob("*.safetensors"))

    def answered(self) -> int:
        """How many answers were ever released: the rows of every journaled iteration."""
        return sum(len(self.targets(iteration)) for iteration in self.iterations())

    def targets(self, iteration: int) -> Tensor | None:
        return self._read(iteration, lambda file: file.get_tensor("targets"))

    def noise_state(self, iteration: int) -> dict | None:
        """The reproducible noise source's state after this iteration's answer (None: secure noise)."""
        def read(file: Any) -> dict | None:
            noise = (file.metadata() or {}).get("noise")
            return None if noise is None else json.loads(noise)

        return self._read(iteration, read)

    def _read(self, iteration: int, read: Callable[[Any], Any]) -> Any:
        path = self._path(iteration)
        if not path.exists():
            return None
        try:
            with safe_open(path, framework="pt") as file:
                return read(file)
        except (SafetensorError, OSError, json.JSONDecodeError) as error:
            raise CheckpointError(f"the journaled answers in {path} are damaged ({error}); they cannot be asked "
                                  f"for again without spending the budget twice: start a new run elsewhere") from error


@dataclass
class DiscriminatorView:
    """What the generator's loss needs from one forward pass of its discriminator."""

    features: Tensor
    logits: Tensor
    batchnorm: Tensor | None  # the BatchNorm-statistics term, when asked for


class ReplayBuffer:
    """The most recent annotated synthetic samples, for extra student steps at no privacy cost.

    Reusing released targets is post-processing; it lets the student learn from many more samples than one
    batch without asking the teacher again.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.images: Tensor | None = None
        self.targets: Tensor | None = None

    def add(self, images: Tensor, targets: Tensor) -> None:
        if self.images is None:
            self.images, self.targets = images[: self.capacity], targets[: self.capacity]
            return
        self.images = torch.cat([images, self.images])[: self.capacity]
        self.targets = torch.cat([targets, self.targets])[: self.capacity]

    def sample(self, count: int) -> tuple[Tensor, Tensor]:
        index = torch.randint(len(self.images), (count,), device=self.images.device)
        return self.images[index], self.targets[index]

    def state(self) -> dict[str, Tensor]:
        return {"images": self.images, "targets": self.targets} if self.images is not None else {}

    def restore(self, state: dict[str, Tensor]) -> None:
        self.images, self.targets = state.get("images"), state.get("targets")


def _lap(timings: dict[str, float], phase: str, since: float) -> float:
    now = time.perf_counter()
    timings[phase] += now - since
    return now
