"""DataLens (Wang et al., CCS 2021; seed 003): a generator trained by N teacher discriminators through TopAgg.

The private training set is split into N disjoint keyed partitions (data/partition.py), one per teacher
discriminator (the official conditional DCGAN discriminator, models/datalens.py, all N as one batched network).
Each step:
1. Teachers: each takes `discriminator_steps` GAN steps on a batch of its own partition (real) and the generator's
   samples labelled with that batch's classes (fake). They are never released.
2. Query: the generator makes `batch_size` samples of random classes; every teacher computes the gradient of the
   generator's loss (non-saturating, its mean over the batch) with respect to each sample's pixels.
3. TopAgg (privacy/mechanisms.py): each teacher's gradient -> top-k stochastic signs (k entries of +-1); the votes
   are summed over teachers, N(0, sigma^2) is added to each coordinate, and the coordinates whose noisy vote
   reaches `threshold` x N in magnitude keep its sign, the rest 0.
4. The generator fits its samples moved by `step_size` along the released descent direction (squared error), with
   Adam.
Teachers and TopAgg read pixels in [0, 1], as the official code does, so its clip and step size keep their units.

Privacy: one example changes one partition, hence one teacher's votes, by at most 2 sqrt(k) in L2 for each
sample, whatever the teacher computed (its batch norm, its minibatch); each sample's release is a Gaussian
mechanism with noise multiplier sigma / (2 sqrt(k)) (replace-one), and the `steps` x `batch_size` releases compose
(dp-accounting; the official code's data-independent RDP bound 2 k lambda / sigma^2 per query is the same). A
teacher that takes a minibatch of its partition is still asked about its whole partition: no amplification by
subsampling is claimed. The generator, its samples and the student trained on them are post-processing. The
teachers, the partition key and the resumable state stay in the private folder. `sigma` 0 is the control: the
votes are thresholded without noise, and nothing is guaranteed.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dp_accounting
import torch
import torch.nn.functional as F
from torch import Tensor

from dpdistill.data.base import ImageDataset
from dpdistill.data.partition import new_partition_key, partition_indices
from dpdistill.errors import BudgetExceededError, ConfigError
from dpdistill.models.datalens import ConditionalGenerator, DiscriminatorBank
from dpdistill.options import dataset_help, setting
from dpdistill.privacy.accounting import (GaussianQuery, PrivacyLedger, calibrate, composed_epsilon,
                                          composed_epsilon_rdp, max_queries)
from dpdistill.privacy.mechanisms import threshold_votes, thresholded_noisy_votes, top_k_stochastic_signs
from dpdistill.privacy.randomness import NoiseSource, noise_source
from dpdistill.progress import Progress, in_phase
from dpdistill.training.state import Checkpoints, load_state, save_state

GENERATOR_STEPS_PHASE = "generator steps"  # the progress display's name for the training loop (teachers' steps in it)


@dataclass(frozen=True)
class DataLensConfig:
    """Every knob of the paper and its official code (flag names in brackets); presets in methods/datalens.py."""

    dataset: str = setting(help=dataset_help("the private data"))
    epsilon: float = setting(help="privacy budget (sound, replace-one); inf with sigma 0, the control")
    delta: float = setting(1e-5, "delta of (epsilon, delta)-DP")
    teachers: int = setting(1000, "N teacher discriminators, one per partition [teachers_batch x batch_teachers]")
    top_k: int = setting(200, "k, coordinates each teacher votes on [topk]")
    clip: float = setting(1e-5, "gradients clipped to [-c, c] before the stochastic sign [max_grad]")
    sigma: float | None = setting(1000.0, "noise std on each summed vote [sigma]; None: calibrated to `steps`; 0: no "
                                          "noise, the control (no guarantee)")
    threshold: float = setting(0.7, "beta: a coordinate is kept where |noisy vote| >= beta N [thresh]")
    step_size: float = setting(1e-3, "gamma: the generator fits x + gamma * released direction, pixels in [0, 1] "
                                     "[learning_rate, the official sign step]")
    steps: int | None = setting(None, "generator steps; None: as many as the budget affords at `sigma`")
    batch_size: int = setting(30, "samples a step, each one query [batch_size]")
    latent_dim: int = setting(50, "[z_dim]")
    generator_hidden: int = setting(1024, "the generator's dense layer [gfc_dim]")
    generator_width: int = setting(64, "the generator has 2 x width channels at H/4 and H/2 [gf_dim]")
    discriminator_width: int = setting(32, "the teacher's second convolution has width + classes filters [df_dim]")
    discriminator_hidden: int = setting(256, "the teacher's dense layer [dfc_dim]")
    discriminator_steps: int = setting(2, "teacher GAN steps per generator step [d_step]")
    teacher_batch: int = setting(30, "real images per teacher per teacher step, drawn from its own partition (the "
                                     "official: its whole partition)")
    teacher_warmup: int = setting(10, "teacher steps before the first query, against the untrained generator "
                                      "[pretrain_teacher]")
    generator_lr: float = setting(1e-3, "Adam [learning_rate]")
    discriminator_lr: float = setting(1e-3, "Adam, each teacher its own state [learning_rate]")
    beta1: float = setting(0.5, "Adam's beta1 [beta1]")
    synthetic_size: int = setting(60000, "labelled images written to synthetic.npz (classes balanced)")
    student_epochs: int = setting(10, "epochs of the evaluation classifier trained on the synthetic set")
    student_lr: float = setting(1e-3, "the evaluation classifier's Adam learning rate")
    student_batch: int = setting(128, "the evaluation classifier's batch")
    checkpoint_every: int = setting(200, "generator steps between resumable checkpoints (and one every 30 s at "
                                         "least)")
    seed: int = setting(0, "initialisation, latents, classes, the quantisation's coin flips; never the noise")
    reproducible_noise: bool = setting(False, "debugging only: the Gaussian noise from the seed, NO guarantee")
    device: str = setting("cpu", "cpu or cuda")

    def __post_init__(self) -> None:
        for name in ("teachers", "top_k", "batch_size", "latent_dim", "discriminator_steps", "teacher_batch",
                     "synthetic_size", "student_epochs", "student_batch", "checkpoint_every", "generator_hidden",
                     "generator_width", "discriminator_width", "discriminator_hidden"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.teachers < 2:
            raise ConfigError(f"DataLens needs at least 2 teacher discriminators, got {self.teachers}")
        for name in ("batch_size", "teacher_batch"):  # batch norm in training mode normalises over the batch
            if getattr(self, name) < 2:
                raise ConfigError(f"{name} must be at least 2 (batch norm on the batch), got {getattr(self, name)}")
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"steps must be at least 1, got {self.steps}")
        if self.teacher_warmup < 0:
            raise ConfigError(f"teacher_warmup must be non-negative, got {self.teacher_warmup}")
        if not 0 < self.threshold:
            raise ConfigError(f"the vote threshold beta must be positive, got {self.threshold}")
        if self.sigma is not None and not self.sigma >= 0:
            raise ConfigError(f"sigma must be non-negative (0: no noise, the control), got {self.sigma}")
        if self.sigma == 0 and (self.steps is None or self.epsilon != math.inf):
            raise ConfigError("sigma 0 (no noise, the control) needs --steps and no --epsilon: nothing is guaranteed")
        for name in ("clip", "step_size", "generator_lr", "discriminator_lr", "student_lr"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.beta1 < 1:
            raise ConfigError(f"beta1 must be in [0, 1), got {self.beta1}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "DataLensConfig":
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown DataLens setting(s): {', '.join(unknown)}")
        return cls(**values)


@dataclass(frozen=True)
class DataLensPlan:
    """The release fixed before training: each of steps x batch_size samples is one Gaussian query (`query` None:
    the control, votes without noise, no guarantee)."""

    query: GaussianQuery | None
    sigma: float
    steps: int
    batch_size: int

    @property
    def queries(self) -> int:
        return self.steps * self.batch_size

    def epsilon(self, delta: float) -> float:
        return math.inf if self.query is None else composed_epsilon(self.query, self.queries, delta)

    def release_event(self) -> dp_accounting.DpEvent:
        """Every sample's release, as the dp-accounting event a ledger or a composing route records."""
        if self.query is None:
            return dp_accounting.NonPrivateDpEvent()
        return dp_accounting.SelfComposedDpEvent(self.query.dp_event(), self.queries)

    def summary(self, delta: float) -> dict[str, Any]:
        common = {"mode": "data", "delta": delta, "relation": "replace-one", "sigma": self.sigma,
                  "queries": self.queries, "steps": self.steps}
        if self.query is None:
            return {**common, "epsilon": math.inf, "epsilon_replace_one": math.inf, "epsilon_rdp": math.inf,
                    "mechanism": "TopAgg without noise (the control): top-k stochastic signs summed over teachers, "
                                 "thresholded", "noise_multiplier": 0.0, "accountant": "none: no noise"}
        epsilon = self.epsilon(delta)
        return {**common, "epsilon": epsilon, "epsilon_replace_one": epsilon,
                "epsilon_rdp": composed_epsilon_rdp(self.query, self.queries, delta),
                "mechanism": "TopAgg: top-k stochastic signs summed over teachers + Gaussian noise, thresholded",
                "noise_multiplier": self.query.noise_multiplier,
                "accountant": "dp-accounting (analytic Gaussian composition; RDP beside)"}


def topagg_query(sigma: float, top_k: int) -> GaussianQuery:
    """One sample's TopAgg release: votes of L2 sensitivity 2 sqrt(k) (one teacher's k signs flip) plus N(0, sigma^2)."""
    return GaussianQuery(sigma / (2 * math.sqrt(top_k)))


def plan_datalens(config: DataLensConfig) -> DataLensPlan:
    """Fix sigma and the number of steps within the budget; refuse a plan that would overspend."""
    if config.sigma == 0:  # the control: its steps are given (the config checks), nothing is spent or guaranteed
        return DataLensPlan(None, 0.0, config.steps, config.batch_size)
    if config.sigma is None:
        if config.steps is None:
            raise ConfigError("DataLens needs --sigma or --steps (or both): the other is fitted to the budget")
        sigma = calibrate(lambda s: topagg_query(s, config.top_k), config.steps * config.batch_size,
                          config.epsilon, config.delta, start=1000.0).noise_multiplier * 2 * math.sqrt(config.top_k)
        return DataLensPlan(topagg_query(sigma, config.top_k), sigma, config.steps, config.batch_size)
    query = topagg_query(config.sigma, config.top_k)
    affordable = max_queries(query, config.epsilon, config.delta) // config.batch_size
    if affordable < 1:
        raise BudgetExceededError(f"not one step of {config.batch_size} samples fits epsilon={config.epsilon} at "
                                  f"sigma={config.sigma}: raise --sigma or lower --batch-size")
    steps = affordable if config.steps is None else config.steps
    if steps > affordable:
        raise BudgetExceededError(f"{steps} steps of {config.batch_size} samples at sigma={config.sigma} would spend "
                                  f"more than epsilon={config.epsilon} (at most {affordable} steps fit): lower "
                                  f"--steps, raise --sigma, or leave --steps unset")
    return DataLensPlan(query, config.sigma, steps, config.batch_size)


@dataclass
class DataLensResult:
    generator: ConditionalGenerator
    history: list[dict[str, Any]]  # public: functions of the released votes only
    teacher_history: list[dict[str, Any]]  # the teachers' losses, computed without noise: private
    wall_seconds: float
    timing: dict[str, float]


class DataLensTrainer:
    """The teachers and the generator, trained together; resumable from its last checkpoint."""

    def __init__(self, config: DataLensConfig, dataset: ImageDataset, plan: DataLensPlan, state_dir: Path,
                 progress: Progress | None = None, noise: NoiseSource | None = None) -> None:
        self.config, self.dataset, self.plan, self.state_dir = config, dataset, plan, state_dir
        self.progress = in_phase(progress, GENERATOR_STEPS_PHASE) or (lambda record: None)
        self.noise = noise or noise_source(config.reproducible_noise, config.seed)
        self.device = torch.device(config.device)
        torch.manual_seed(config.seed)
        self.coins = torch.Generator(device=self.device).manual_seed(config.seed + 1)  # latents, classes, flips
        self.num_classes = dataset.num_classes
        with self.device:  # initialised where they train: N teachers' weights are gigabytes at the paper's N
            self.generator = ConditionalGenerator(config.latent_dim, self.num_classes, dataset.input_shape,
                                                  config.generator_hidden, config.generator_width)
            self.teachers = DiscriminatorBank(config.teachers, dataset.input_shape, self.num_classes,
                                              config.discriminator_width, config.discriminator_hidden)
        self.generator_optimizer = torch.optim.Adam(self.generator.parameters(), config.generator_lr,
                                                    betas=(config.beta1, 0.999))
        # Adam is elementwise: over the stacked weights, each teacher keeps its own moments
        self.teacher_optimizer = torch.optim.Adam(self.teachers.parameters(), config.discriminator_lr,
                                                  betas=(config.beta1, 0.999))
        self.ledger = PrivacyLedger(plan.query, plan.queries)
        self.step_index, self.history, self.teacher_history = 0, [], []
        self.partition_key = new_partition_key()
        self._partitions()

    def _partitions(self) -> None:
        """Each teacher's images (pixels in [0, 1]) and labels, padded to the largest partition; sizes kept for
        uniform sampling within each."""
        parts = partition_indices(self.dataset.ids_train, self.config.teachers, self.partition_key)
        sizes = torch.tensor([len(part) for part in parts])
        padded = torch.stack([part[torch.arange(int(sizes.max())) % len(part)] for part in parts])
        self.part_images = ((self.dataset.x_train[padded] + 1) / 2).to(self.device)  # (N, largest, C, H, W)
        self.part_labels = self.dataset.y_train[padded].to(self.device)
        self.part_sizes = sizes.to(self.device)

    def _latents(self, count: int) -> Tensor:
        return torch.rand(count, self.config.latent_dim, generator=self.coins, device=self.device) * 2 - 1

    def _pixels(self, latents: Tensor, labels: Tensor) -> Tensor:
        """The generator's samples on the teachers' scale, [0, 1]; batch norm on this batch, as in training."""
        self.generator.train()
        return (self.generator(latents, labels) + 1) / 2

    def _teacher_step(self) -> float:
        """One GAN step of every teacher on a batch of its own partition (real) and the generator's samples with
        that batch's classes (fake). The fakes of one latent in every class are made in one batch and each teacher
        takes the one of its real image's class: the official code's fakes, at the cost of `classes` samples a
        latent instead of one per teacher."""
        config, classes = self.config, self.num_classes
        picks = (torch.rand(config.teachers, config.teacher_batch, generator=self.coins, device=self.device)
                 * self.part_sizes[:, None]).long()
        teacher_rows = torch.arange(config.teachers, device=self.device)[:, None]
        real, real_labels = self.part_images[teacher_rows, picks], self.part_labels[teacher_rows, picks]
        latents = self._latents(config.teacher_batch).repeat_interleave(classes, 0)
        with torch.no_grad():
            every_class = self._pixels(latents, torch.arange(classes, device=self.device).repeat(config.teacher_batch))
        every_class = every_class.view(config.teacher_batch, classes, *every_class.shape[1:])
        fake = every_class[torch.arange(config.teacher_batch, device=self.device)[None, :], real_labels]
        # each teacher's own mean loss; summed, so each teacher's gradient is that of its own loss
        loss = (F.softplus(-self.teachers(real, real_labels)).mean(1)
                + F.softplus(self.teachers(fake, real_labels)).mean(1)).sum()
        self.teacher_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.teacher_optimizer.step()
        return float(loss.detach()) / config.teachers

    def _generator_step(self) -> tuple[float, float]:
        """One query: the teachers' gradients through TopAgg, then the generator fits the moved samples. Returns the
        share of coordinates the release kept (public) and the teachers' mean loss on the samples (private)."""
        config = self.config
        labels = torch.randint(self.num_classes, (config.batch_size,), generator=self.coins, device=self.device)
        pixels = self._pixels(self._latents(config.batch_size), labels)
        asked = pixels.detach().unsqueeze(0).repeat(config.teachers, *[1] * pixels.dim()).requires_grad_(True)
        teacher_loss = F.softplus(-self.teachers(asked, labels)).mean(1).sum()
        (gradients,) = torch.autograd.grad(teacher_loss, asked)
        votes = top_k_stochastic_signs(gradients.flatten(2), config.top_k, config.clip, self.coins).sum(0)
        self.ledger.charge(config.batch_size)
        threshold = config.threshold * config.teachers
        direction = (threshold_votes(votes, threshold) if self.plan.query is None
                     else thresholded_noisy_votes(votes, self.plan.sigma, threshold, self.noise))
        target = pixels.detach().flatten(1) - config.step_size * direction  # descend the teachers' generator loss
        loss = F.mse_loss(pixels.flatten(1), target, reduction="sum")
        self.generator_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.generator_optimizer.step()
        return float(direction.abs().mean()), float(teacher_loss.detach()) / config.teachers

    def _teacher_steps(self, count: int) -> float:
        """`count` teacher steps, each announced (thousands of teachers take seconds a step on a CPU); their summed
        mean losses."""
        loss = 0.0
        for teacher_step in range(1, count + 1):
            loss += self._teacher_step()
            self.progress({"step": self.step_index, "total": self.plan.steps, "teacher_step": teacher_step})
        return loss

    def run(self, resume: bool = False) -> DataLensResult:
        started = time.perf_counter()
        timing = {"teachers": 0.0, "generator": 0.0}
        if resume:
            self._restore()
        else:
            self._teacher_steps(self.config.teacher_warmup)
        checkpoints = Checkpoints(self.config.checkpoint_every)
        while self.step_index < self.plan.steps:
            step_started = time.perf_counter()
            teacher_loss = self._teacher_steps(self.config.discriminator_steps)
            lap = time.perf_counter()
            timing["teachers"] += lap - step_started
            kept_share, generator_loss = self._generator_step()
            timing["generator"] += time.perf_counter() - lap
            self.step_index += 1
            record = {"step": self.step_index, "kept_share": kept_share}
            if self.step_index % 50 == 0 or self.step_index == self.plan.steps:
                self.history.append(record)
                self.teacher_history.append({"step": self.step_index, "teacher_loss": generator_loss,
                                             "discriminator_loss": teacher_loss / self.config.discriminator_steps})
            self.progress({**record, "total": self.plan.steps, "seconds": time.perf_counter() - step_started})
            # the last step too: a run interrupted while its classifier trains does not train the generator again
            checkpoints(self.step_index, self._checkpoint, final=self.step_index == self.plan.steps)
        self.generator.eval()
        return DataLensResult(self.generator, self.history, self.teacher_history, time.perf_counter() - started,
                              timing)

    def _checkpoint(self) -> None:
        save_state(self.state_dir, {
            "step": self.step_index, "history": self.history, "teacher_history": self.teacher_history,
            "answered": self.ledger.answered,
            "generator": self.generator.state_dict(), "teachers": self.teachers.state_dict(),
            "generator_optimizer": self.generator_optimizer.state_dict(),
            "teacher_optimizer": self.teacher_optimizer.state_dict(),
            "coins": self.coins.get_state(), "torch": torch.get_rng_state(),
            "partition_key": torch.frombuffer(bytearray(self.partition_key), dtype=torch.uint8),
            "noise": self.noise.state()})

    def _restore(self) -> None:
        state = load_state(self.state_dir)
        self.partition_key = bytes(state["partition_key"].tolist())
        self._partitions()
        self.generator.load_state_dict(state["generator"])
        self.teachers.load_state_dict(state["teachers"])
        self.generator_optimizer.load_state_dict(state["generator_optimizer"])
        self.teacher_optimizer.load_state_dict(state["teacher_optimizer"])
        self.coins.set_state(state["coins"])
        torch.set_rng_state(state["torch"])
        self.noise.restore(state["noise"])
        self.step_index, self.history = int(state["step"]), list(state["history"])
        self.teacher_history = list(state["teacher_history"])
        self.ledger.answered = int(state["answered"])
