"""Private-training baselines: the student trained on the private data directly, what transcription is compared to.

- `dpsgd`: DP-SGD with Opacus (Poisson sampling, per-example clipping, Gaussian noise on the sum). Every update
  is a noisy release, so the student is covered by the guarantee (add or remove one training example).
- `dpdfd-direct` (the DPDFD paper's direct training on private data): each sampled example's cross-entropy
  gradient with respect to the student's logits is normalised to norm beta and noised; the student fits the
  softmax of its logits moved against that noisy gradient. The update still depends on the private input through
  d logits / d weights, which nothing bounds: the student has NO formal guarantee; the epsilon covers only the
  released noisy output gradients.

Both use the same Poisson sampler, so the sampling rate and the number of steps that the accountant composes are
the ones that run; the plan is checked against the budget before training.

Secret randomness (an equivalent of Opacus' secure mode, which needs torchcsprng, unavailable here): every
privacy draw comes from a `NoiseSource` (privacy/randomness.py), os.urandom by default. `PoissonBatchSampler`
draws batch membership from it and `NoiseSourceDPOptimizer` the Gaussian noise on the clipped gradient sum;
`--seed` governs only the student's initialisation and other non-private randomness, and it is safe to publish.
`reproducible_noise` (debugging only) draws both from the seed instead: such a run has NO guarantee.

Neighbouring relation: DP-SGD's budget is stated under add/remove by default (Opacus' convention) or, with
`relation="replace-one"`, under replace-one, the relation of the ensembles and transcriptions; every report gives
its relation and its replace-one epsilon, so routes can be compared under one relation.

Release hygiene: figures computed from the private data without noise (the exact training-set size, the expected
batch size, the training loss) are returned apart from the public report, in `private_figures`. The sampling rate
itself is public (the accountant needs it), so it follows a public training-set size: declared, or a noisy count
the run releases first at a share of its epsilon (privacy/count.py, `with_public_size`).

Either can start from an encoder pretrained on public images only (`dpdistill pretrain`), the starting point
PATE's best rows use, so the two routes compare like with like. Its BatchNorm layers then keep the encoder's
public statistics (eval mode, frozen scale and shift): each example is normalised alone, so per-example gradients
stay independent. With `train_layers="head"` only the last linear layer learns, on features computed once: a
private linear probe of public features, or of a fixed transform's (the scattering students, Tramer & Boneh 2021,
whose backbone has no parameters and which train this way by default with their DP-SGD recipe).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from contextvars import ContextVar
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterator

import dp_accounting
import torch
import torch.nn.functional as F
from opacus import GradSampleModule
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from opacus.accountants import RDPAccountant
from opacus.optimizers.ddpoptimizer import DistributedDPOptimizer
from opacus.optimizers.ddpoptimizer_fast_gradient_clipping import DistributedDPOptimizerFastGradientClipping
from opacus.optimizers.optimizer import DPOptimizer, _check_processed_flag, _mark_as_processed
from opacus.optimizers.optimizer_fast_gradient_clipping import DPOptimizerFastGradientClipping
from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping
from torch import Tensor, nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

from dpdistill.data.base import ImageDataset
from dpdistill.data.public import public_split, whole_test_split
from dpdistill.errors import BudgetExceededError, CheckpointError, ConfigError, PrivacyParameterError
from dpdistill.evaluation.metrics import confusion_counts, predict, share_correct
from dpdistill.losses.distillation import soft_cross_entropy
from dpdistill.options import dataset_help, setting
from dpdistill.progress import Pace, Progress
from dpdistill.training.annotation import DistillationGradient, OutputGradientAnnotator
from dpdistill.training.averaging import IterateAverage
from dpdistill.training.distributed import Group
from dpdistill.training.state import Checkpoints, load_state, save_state
from dpdistill.models.base import Classifier
from dpdistill.models.features import frozen_features
from dpdistill.models.per_example import first_line, layer_names, per_example
from dpdistill.models.registry import build_classifier, has_fixed_backbone, is_user_arch
from dpdistill.privacy.accounting import (
    ADD_REMOVE,
    NEIGHBOURING_RELATIONS,
    REPLACE_ONE,
    PrivacyLedger,
    SampledGaussianQuery,
    SampledReleaseQuery,
    calibrate,
    composed_epsilon,
    composed_epsilon_rdp,
    epsilon_key,
    validate_delta,
    validate_epsilon,
)
from dpdistill.privacy.count import COUNT_SHARE, NoisyCount
from dpdistill.privacy.ledger import Release
from dpdistill.privacy.randomness import NoiseSource, noise_source
from dpdistill.privacy.selection import FASHION_MNIST, Selection, selection_notes
from dpdistill.training.teacher import load_encoder


UNITS = {ADD_REMOVE: "adding or removing one private training example",
         REPLACE_ONE: "replacing one private training example"}
TRAIN_LAYERS = ("all", "head")  # which of the student's weights learn from the private data
OPTIMIZERS = ("adam", "sgd")
# An audit's white-box gradient canaries (audit/white_box.py GradientCanaries), attached to the DP-SGD optimizer
# of runs inside its block; None for every run a user makes.
GRADIENT_CANARIES: ContextVar[Any] = ContextVar("gradient_canaries", default=None)
# Settings left unset take the student's defaults. Scattering students: Tramer & Boneh's DP-SGD recipe (clip 0.1,
# SGD with momentum 0.9, 40 epochs); scatter-linear with their batch and step doubled (8,192 at lr 8), chosen on a
# validation split (the last 10,000 Fashion-MNIST training images; the test set untouched): 88.36% there at
# epsilon 1, as with 4,096 at lr 4 for 20 epochs, and 90.72% against 89.86% at epsilon 10 (80 epochs). It learns
# its head on features computed once. scatter-cnn keeps their published batch and step (not tuned here: its
# per-example gradients take 2.5 s a 4,096-example step on 2 cores). Other students: the measured `dpsgd-eps*`
# rows (per-example gradients are slow on CPU).
TRAINING_DEFAULTS: dict[str, Any] = {"max_grad_norm": 1.0, "epochs": 3, "batch_size": 256, "lr": 1e-3,
                                     "optimizer": "adam", "momentum": 0.0, "train_layers": "all"}
SCATTER_RECIPE: dict[str, Any] = {"max_grad_norm": 0.1, "epochs": 40, "batch_size": 4096, "lr": 4.0,
                                  "optimizer": "sgd", "momentum": 0.9}
ARCH_TRAINING_DEFAULTS: dict[str, dict[str, Any]] = {
    "scatter-linear": {**SCATTER_RECIPE, "batch_size": 8192, "lr": 8.0, "train_layers": "head"},
    "scatter-cnn": SCATTER_RECIPE,
}


# A default batch keeps at most the scatter recipe's sampling rate (8,192 of Fashion-MNIST's 60,000 images) on a
# smaller training set, and an SGD step its ratio to the batch: 8,192 images a step of 1,437 would be every image
# every step, without amplification
RECIPE_SAMPLE_RATE = 8192 / 60000
STUDENT_DEFAULT, ENCODER_STUDENT_DEFAULT = "scatter-linear", "cnn"  # the latter: pretrain's default encoder


# Settings chosen without noise on Fashion-MNIST's own training split (benchmarks/experiments/scatter_validation.py:
# its last 10,000 images as the validation split), and the cnn's schedule: the dpsgd-cnn benchmark rows', scored on
# Fashion-MNIST's test split; release's teacher's, the same steps for 10 epochs (the MNIST set's release rows, then
# a validation split of Fashion-MNIST's training images and whole releases scored on its test split)
CNN_SCHEDULE = {"batch_size": 1024, "lr": 3e-3, "epochs": 3}
RELEASE_TEACHER_SCHEDULE = {**CNN_SCHEDULE, "epochs": 10}
SELECTED_ON_PRIVATE_DATA = (*(
    Selection(f"scatter-linear's DP-SGD settings (batch {batch:,}, step {lr:g}, {epochs} epochs)",
              {"student_arch": "scatter-linear", "batch_size": batch, "lr": lr, "epochs": epochs},
              "Fashion-MNIST's training split (without noise)", FASHION_MNIST)
    for batch, lr, epochs in ((8192, 8.0, 40), (16384, 16.0, 160))),
    *(Selection(f"the cnn's DP-SGD schedule (batch 1,024, Adam 3e-3, {schedule['epochs']} epochs)",
                {"student_arch": "cnn", "optimizer": "adam", **schedule},
                "Fashion-MNIST (DP-SGD runs and releases scored on its test split)", FASHION_MNIST)
      for schedule in (CNN_SCHEDULE, RELEASE_TEACHER_SCHEDULE)))


def training_selection_notes(config: "PrivateTrainingConfig", digest: str | None) -> list[str]:
    """Where a run on the data of `digest` uses settings chosen on private data, what it must say."""
    return selection_notes(SELECTED_ON_PRIVATE_DATA, dataclasses.asdict(config), digest)


@dataclass(frozen=True)
class PrivateTrainingConfig:
    """Every setting of a private-training run; checked on construction, so a bad value fails before any work."""

    dataset: str = setting(help=dataset_help("the private data"))
    method: str = setting("dpsgd", "dpsgd (Opacus DP-SGD: the student is covered) or dpdfd-direct (noisy targets "
                                   "from output gradients: NO formal guarantee for the student)")
    epsilon: float | None = setting(None, "privacy budget; the noise is calibrated to it unless --sigma")
    delta: float = setting(1e-5, "delta of (epsilon, delta)-DP")
    sigma: float | None = setting(None, "dpsgd: noise multiplier (noise std over the clipping norm); dpdfd-direct: "
                                        "noise std over beta. Default: calibrated to --epsilon")
    max_grad_norm: float | None = setting(None, "dpsgd: per-example gradient clipping norm [default: 1.0; 0.1 for "
                                                "scatter-*]")
    beta: float = setting(1e-3, "dpdfd-direct: norm C of each output gradient")
    target_step: float = setting(0.1, "dpdfd-direct: gamma, step of the noisy gradient on the logits")
    student_arch: str | None = setting(None, "the student: any registered architecture, or module:callable "
                                             "[default: scatter-linear; with --student-init, cnn]")
    # None here and below: the student's default (ARCH_TRAINING_DEFAULTS)
    epochs: int | None = setting(None, "[default: 3, the benchmarks' dpsgd-eps* rows; 40 for scatter-*, Tramer & "
                                       "Boneh's recipe]", min=1)
    batch_size: int | None = setting(None, "expected batch size (Poisson sampling) [default: 256; 8192 for "
                                           "scatter-linear, 4096 for scatter-cnn; at most 0.137 of a smaller "
                                           "training set]", min=1)
    lr: float | None = setting(None, "the learning rate [default: 1e-3; 8 for scatter-linear, 4 for scatter-cnn, "
                                     "SGD's scaled with a smaller default batch]")
    optimizer: str | None = setting(None, "adam or sgd, on the privatised gradient (post-processing) [default: "
                                          "adam; sgd for scatter-*]")
    momentum: float | None = setting(None, "sgd's momentum [default: 0; 0.9 for scatter-*]")
    ema_decay: float = setting(0.0, "release the moving average of the weights after each step with this decay "
                                    "instead of the last weights (post-processing: no privacy spent); 0: the last "
                                    "weights (scatter-linear: +0.55 points at epsilon 1 on the MNIST set, none on "
                                    "Fashion-MNIST, a loss at 3 and 10: docs/methods/dpsgd.md)")
    student_init: str | None = setting(None, "start the student from this encoder (a `dpdistill pretrain` directory: "
                                             "public images only); accuracy is then measured outside its public "
                                             "pool")
    train_layers: str | None = setting(None, "all, or head: only the last layer learns, on the frozen encoder's "
                                             "features (a private linear probe; needs --student-init unless the "
                                             "backbone is fixed) [default: all; head for scatter-linear]")
    public: str | None = setting(None, "with --student-init: the data set of its public pool (as `pretrain "
                                       "--public`)")
    public_size: int = setting(5000, "with --student-init: the size of its public pool (as `pretrain "
                                     "--public-size`)")
    dataset_size: int | None = setting(None, "the training split's size as a public figure: the sampling rate and "
                                             "the steps come from it, never the exact private count [default: the "
                                             "data set's declared size (an .npz may hold declared_size); without "
                                             "one, a noisy count of it at --count-share of --epsilon]")
    count_share: float = setting(COUNT_SHARE, "where the data declare no training-set size: the share of --epsilon "
                                              "spent on a noisy count of it (the sampling rate and steps follow it)")
    # the noisy count this run released (privacy/count.py): set by the run, kept so that a resumed run reuses it
    counted_size: int | None = setting(None, "the noisy count of the training set a run released (set by the run)")
    relation: str = setting(ADD_REMOVE, "dpsgd: the neighbouring relation the budget is stated under, add-remove "
                                        "(Opacus') or replace-one (as ensembles and transcriptions; more noise); "
                                        "dpdfd-direct: always replace-one")
    seed: int = setting(0, "random seed of the initialisation only: noise and sampling are secret")
    reproducible_noise: bool = setting(False, "debugging only, NO privacy guarantee: draw the noise and the Poisson "
                                              "sampling from --seed, so the run repeats", show_default=False)
    device: str = setting("cpu", "cpu or cuda")
    processes: int = setting(1, "dpsgd: train on this many processes, each on its share of the examples, with the "
                                "same privacy (started here: gloo on CPU, NCCL with one GPU each; under torchrun, "
                                "give its number of processes)", min=1)
    accept_defaults: bool = setting(False, "train a student of your own (module:callable, file.py:callable) on the "
                                           "default schedule, measured for the registered students only",
                                    show_default=False)

    def __post_init__(self) -> None:
        momentum_given = self.momentum is not None
        unmeasured = is_user_arch(self.student_arch) and (self.epochs is None or self.lr is None)
        if unmeasured and not self.accept_defaults:
            raise ConfigError(f"no DP-SGD schedule is measured for {self.student_arch}, a student of your own: the "
                              f"default one (3 epochs of batch 256, Adam at lr 1e-3) was measured for the registered "
                              f"students, and a model that needs more steps or takes more noise per step spends the "
                              f"budget for little on it (docs/methods/dpsgd.md); give its schedule with --epochs and "
                              f"--lr, chosen on public data or a held-out part of yours (not the test split), or pass "
                              f"--accept-defaults to spend the budget on the defaults anyway")
        if self.student_arch is None:
            object.__setattr__(self, "student_arch", STUDENT_DEFAULT if self.student_init is None
                               else ENCODER_STUDENT_DEFAULT)
        for name, value in self._defaults().items():
            if getattr(self, name) is None and name not in SIZED:  # the batch and step: fitted to the data
                object.__setattr__(self, name, value)  # frozen: the resolved value is what is saved and resumed
        if self.optimizer == "adam":
            if momentum_given and self.momentum:
                raise ConfigError("--momentum is SGD's: Adam keeps its own moments (give --optimizer sgd)")
            object.__setattr__(self, "momentum", 0.0)  # a student's SGD default does not apply to Adam
        if self.method not in TRAINERS:
            raise ConfigError(f"unknown method {self.method!r}: choose one of {', '.join(TRAINERS)}")
        if self.train_layers not in TRAIN_LAYERS:
            raise ConfigError(f"unknown --train-layers {self.train_layers!r}: choose one of {', '.join(TRAIN_LAYERS)}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"unknown --optimizer {self.optimizer!r}: choose one of {', '.join(OPTIMIZERS)}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"momentum must be in [0, 1), got {self.momentum}")
        if not 0 <= self.ema_decay < 1:
            raise ConfigError(f"--ema-decay must be in [0, 1) (0: no average), got {self.ema_decay}")
        if self.relation not in NEIGHBOURING_RELATIONS:
            raise ConfigError(f"unknown --relation {self.relation!r}: choose one of {', '.join(NEIGHBOURING_RELATIONS)}")
        if self.train_layers == "head" and self.student_init is None and not has_fixed_backbone(self.student_arch):
            raise ConfigError("--train-layers head trains a linear layer on a pretrained encoder's features: give "
                              "the encoder with --student-init (`dpdistill pretrain` makes one from public images), "
                              "or choose a student with a fixed backbone (scatter-linear)")
        if self.epsilon is None:
            raise PrivacyParameterError("a privacy budget --epsilon is required")
        validate_epsilon(self.epsilon)
        validate_delta(self.delta)
        if self.sigma is not None and not 0 < self.sigma < float("inf"):
            raise PrivacyParameterError(f"sigma must be positive and finite, got {self.sigma}")
        for name in ("max_grad_norm", "beta", "target_step", "lr"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ConfigError(f"{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.dataset_size is not None and self.dataset_size < 1:
            raise ConfigError(f"--dataset-size must be at least 1, got {self.dataset_size}")
        if not 0 < self.count_share < 0.5:
            raise ConfigError(f"--count-share must be in (0, 0.5), got {self.count_share}")
        if self.counted_size is not None and (self.counted_size < 1 or self.dataset_size is not None):
            raise ConfigError("counted_size is the noisy count a run released itself: give the size you publish "
                              "with --dataset-size instead")
        if self.processes < 1:
            raise ConfigError(f"--processes must be at least 1, got {self.processes}")
        if self.processes > 1 and self.method != "dpsgd":
            raise ConfigError(f"--processes {self.processes}: only dpsgd trains on several processes; run "
                              f"{self.method} on one")
        if self.epochs < 1 or (self.batch_size or 1) < 1 or self.public_size < 1:
            raise ConfigError(f"epochs, batch size and public size must be at least 1, got {self.epochs}, "
                              f"{self.batch_size} and {self.public_size}")

    def _defaults(self) -> dict[str, Any]:
        return {**TRAINING_DEFAULTS, **ARCH_TRAINING_DEFAULTS.get(self.student_arch, {})}

    def fitted(self, train_size: int) -> "PrivateTrainingConfig":
        """The settings a run on `train_size` (public: the declared size) uses: a batch not given is the student's
        default, at most RECIPE_SAMPLE_RATE of the training set; a step not given is the default, scaled with
        that batch for SGD (the noise on the mean gradient grows as the batch shrinks)."""
        if self.batch_size is not None and self.lr is not None:
            return self
        defaults = self._defaults()
        batch = self.batch_size or max(1, min(defaults["batch_size"], round(RECIPE_SAMPLE_RATE * train_size)))
        lr = self.lr or (defaults["lr"] * batch / defaults["batch_size"] if self.optimizer == "sgd" and
                         self.batch_size is None else defaults["lr"])
        return dataclasses.replace(self, batch_size=batch, lr=lr)

    @property
    def size_count(self) -> NoisyCount | None:
        """The noisy count this run released for its training-set size (None: the size is a declared figure)."""
        return None if self.counted_size is None else NoisyCount.within(self.count_share * self.epsilon)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "PrivateTrainingConfig":
        try:
            return cls(**values)
        except TypeError as error:
            raise ConfigError(f"the saved configuration does not describe a train-private run ({error})") from error


@dataclass(frozen=True)
class PrivatePlan:
    """The mechanism fixed before training: one query per step, and exactly `steps` steps, accounted under
    `relation`."""

    query: SampledGaussianQuery | SampledReleaseQuery
    steps_per_epoch: int
    steps: int
    relation: str
    size: int  # the public training-set size the sampling rate and the steps come from
    count: NoisyCount | None = None  # the noisy count `size` is, where the data declare none

    @property
    def noise_multiplier(self) -> float:
        return self.query.noise_multiplier

    @property
    def sample_rate(self) -> float:
        return self.query.sample_rate

    def replace_one_release(self, delta: float) -> Release:
        """The whole plan as one release under replace-one (the relation a data set's ledger composes under):
        dp-accounting's event and the replace-one epsilon of its steps."""
        query = self.query if self.relation == REPLACE_ONE else dataclasses.replace(self.query, relation=REPLACE_ONE)
        steps = Release.of_query(query, self.steps, delta)
        if self.count is None:
            return steps
        return Release(dp_accounting.ComposedDpEvent([self.count.dp_event(), steps.event]), delta,
                       self.count_epsilon + steps.epsilon)

    @property
    def count_epsilon(self) -> float:
        """What the noisy count of the training set spent (0 where its size was declared): it adds to every figure
        of the steps (basic composition, privacy/count.py)."""
        return 0.0 if self.count is None else self.count.epsilon

    def size_words(self) -> str:
        """Where the training-set size the sampling follows comes from, for the report."""
        if self.count is None:
            return f"{self.size:,}, a public figure the data declare; the exact count stays private"
        return self.count.describe(self.size)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "PrivatePlan":
        """A DP-SGD plan from `dataclasses.asdict`'s fields: rank 0's, shared with the other processes of a run."""
        count = values["count"]
        return cls(**{**values, "query": SampledGaussianQuery(**values["query"]),
                      "count": None if count is None else NoisyCount(**count)})


def with_public_size(config: PrivateTrainingConfig, dataset: ImageDataset) -> PrivateTrainingConfig:
    """`config` with a public training-set size: --dataset-size, the data set's declared size, or else a noisy count
    of the training set released now (privacy/count.py) and kept in the configuration, so that a resumed run reuses
    it. The sampling rate and the number of steps are released, so they must not come from the exact private count,
    which adding one example would change."""
    if config.dataset_size or config.counted_size or dataset.declared_size:
        return config
    count = NoisyCount.within(config.count_share * config.epsilon)
    noise = noise_source(config.reproducible_noise, config.seed)
    return dataclasses.replace(config, counted_size=count.release(len(dataset.y_train), noise))


def public_train_size(config: PrivateTrainingConfig, dataset: ImageDataset) -> int:
    """The training-set size a run plans on (after `with_public_size`): given, counted by the run, or declared."""
    size = config.dataset_size or config.counted_size or dataset.declared_size
    if size is None:
        raise ConfigError(f"{config.dataset} has no public training-set size yet: plan the run with "
                          f"with_public_size first")
    return size


SIZED = ("batch_size", "lr")  # resolved by `fitted`, once the training set's declared size is known
MAX_SAMPLED_EPSILON = 1000.0  # beyond it the PLD accountant's grid needs tens of GiB (10^6: 48 GiB)


def plan_private_training(config: PrivateTrainingConfig, train_size: int) -> PrivatePlan:
    """Fix the noise for `epochs` epochs of Poisson-sampled steps and refuse a plan that would overspend.

    The sampling rate and steps per epoch follow Opacus' own rule (rate 1 / number of batches of the plain
    loader, int(1 / rate) steps an epoch), so the plan is what runs. dpdfd-direct's releases are tied to their
    examples, so only replace-one is meaningful for it.
    """
    if config.sigma is None and config.epsilon > MAX_SAMPLED_EPSILON:  # its loss grid grows with epsilon
        raise PrivacyParameterError(f"epsilon {config.epsilon:g} is above {MAX_SAMPLED_EPSILON:g}, the largest "
                                    f"budget DP-SGD's accountant calibrates noise for (it protects nothing "
                                    f"measurable): give the noise with --sigma, or train without privacy")
    config = config.fitted(train_size)
    count = config.size_count
    budget = config.epsilon - (0.0 if count is None else count.epsilon)  # the steps', beside the noisy count
    sample_rate, steps_per_epoch = opacus_sampling(train_size, config.batch_size)
    steps = config.epochs * steps_per_epoch
    if config.method == "dpsgd":
        relation = config.relation
        query = (SampledGaussianQuery(config.sigma, sample_rate, relation=relation) if config.sigma is not None
                 else calibrate_dpsgd(sample_rate, steps, budget, config.delta, relation))
    else:  # answers of norm <= beta differ by <= 2 beta and get noise sigma * beta: multiplier sigma / 2
        relation = REPLACE_ONE
        query = (SampledReleaseQuery(config.sigma / 2, sample_rate) if config.sigma is not None
                 else calibrate(lambda z: SampledReleaseQuery(z, sample_rate), steps, budget, config.delta))
    plan = PrivatePlan(query, steps_per_epoch, steps, relation, train_size, count)
    spent = plan.count_epsilon + composed_epsilon(query, steps, config.delta)
    if spent > config.epsilon:
        raise BudgetExceededError(
            f"{config.epochs} epochs of {steps_per_epoch} steps at sigma={config.sigma} would spend epsilon="
            f"{spent:.4g} > budget {config.epsilon}: raise --sigma, lower --epochs, or leave --sigma unset to "
            f"calibrate the noise to the budget")
    return plan


def calibrate_dpsgd(sample_rate: float, steps: int, epsilon: float, delta: float,
                    relation: str) -> SampledGaussianQuery:
    """The least noise on the grid 1.001^n whose `steps` DP-SGD steps fit (epsilon, delta) on a coarse PLD (10x
    faster than the stated figure's, which the plan checks), searched from where a rough PLD (another 4x faster)
    puts it: the rough search lands on or within a few points of the same grid point, which leaves the coarse one
    two to five evaluations instead of about twenty from 1.0, and its answer as it was."""

    def on(discretization: float) -> Callable[[float], SampledGaussianQuery]:
        return lambda z: SampledGaussianQuery(z, sample_rate, discretization, relation)

    rough = calibrate(on(1e-2), steps, epsilon, delta, tolerance=1e-3)
    coarse = calibrate(on(1e-3), steps, epsilon, delta, tolerance=1e-3, guess=rough.noise_multiplier)
    return dataclasses.replace(coarse, discretization=SampledGaussianQuery.discretization)


def opacus_sampling(train_size: int, batch_size: int) -> tuple[float, int]:
    """(sampling rate, steps an epoch) by Opacus' rule: rate 1 / number of batches of the plain loader,
    int(1 / rate) steps."""
    sample_rate = 1 / len(DataLoader(range(train_size), batch_size=batch_size))
    return sample_rate, int(1 / sample_rate)


class PoissonBatchSampler(Sampler[list[int]]):
    """Poisson sampling with secret randomness: in each of `steps` batches every one of `num_samples` examples
    takes part independently with probability `sample_rate`, drawn from `noise` (Opacus'
    UniformWithReplacementSampler, without its torch.Generator). Batches can be empty, as the accountant assumes."""

    def __init__(self, num_samples: int, sample_rate: float, steps: int, noise: NoiseSource) -> None:
        self.num_samples, self.sample_rate, self.steps, self.noise = num_samples, sample_rate, steps, noise

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            yield self.noise.bernoulli((self.num_samples,), self.sample_rate).nonzero().flatten().tolist()


class GatheredTensors(TensorDataset):
    """Tensors whose batch is gathered by one index per tensor (`__getitems__`, which a DataLoader calls with the
    whole batch of indices) instead of example by example then stacked: on a large batch of scattering features the
    per-example path took two thirds of the training's time. An empty batch keeps the tensors' shapes."""

    def __getitems__(self, indices: list[int]) -> list[Tensor]:
        index = torch.as_tensor(indices, dtype=torch.long)
        return [tensor[index] for tensor in self.tensors]


def _gathered(batch: list[Tensor]) -> list[Tensor]:
    """The collation of a batch GatheredTensors already gathered: none."""
    return batch


def poisson_loader(dataset: TensorDataset, plan: PrivatePlan, noise: NoiseSource, batch_size: int) -> DataLoader:
    """The plan's Poisson-sampled batches of `dataset` (an empty batch keeps the tensors' shapes, as in Opacus'
    DPDataLoader), each gathered at once. Refuses a plan other than Opacus' rule gives for its declared size: the
    rate and the steps come from that public figure, whatever the exact count of `dataset`."""
    sampling = opacus_sampling(plan.size, batch_size)
    if sampling != (plan.sample_rate, plan.steps_per_epoch):
        raise PrivacyParameterError(f"Opacus' rule samples at rate {sampling[0]} for {sampling[1]} steps an epoch, "
                                    f"the plan at {plan.sample_rate} for {plan.steps_per_epoch}")
    sampler = PoissonBatchSampler(len(dataset), plan.sample_rate, plan.steps_per_epoch, noise)
    # each pass draws a seed for workers (none here) from its own generator, not from torch's global stream: a run
    # resumed within an epoch then continues that stream (dropout) as the uninterrupted run does
    return DataLoader(GatheredTensors(*dataset.tensors), batch_sampler=sampler, collate_fn=_gathered,
                      generator=torch.Generator())


# Examples whose per-example gradients DP-SGD materialises at once (layers not ghost-clipped). A whole Poisson batch of
# the cnn (1,024 on average) changed every tensor's size each step, and glibc's heap, reusing few freed blocks, grew
# to 9.9 GB over 10 epochs; in chunks of 256, 2 epochs peak at 2.0 GB in 94 s (docs/methods/dpsgd.md)
PER_EXAMPLE_CHUNK = 256


class _NoiseFromSource:
    """Opacus' noise step (Gaussian noise on the clipped gradient sum) drawn from a NoiseSource: secure mode's
    noise (sum of four normals from secure bits) without torchcsprng. Mixed into an Opacus DP optimizer."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, noise: NoiseSource, **kwargs: Any) -> None:
        super().__init__(optimizer, **kwargs)
        self.noise = noise

    def add_noise(self) -> None:
        std = self.noise_multiplier * self.max_grad_norm
        for weight in self.params:
            _check_processed_flag(weight.summed_grad)
            noise = self.noise.normal(weight.summed_grad.shape, std, weight.summed_grad.device)
            weight.grad = (weight.summed_grad + noise).view_as(weight)
            _mark_as_processed(weight.summed_grad)


class NoiseSourceDPOptimizer(_NoiseFromSource, DPOptimizer):
    """Opacus' DPOptimizer (flat clipping of materialised per-example gradients), noise from a NoiseSource."""


class NoiseSourceGhostClippingOptimizer(_NoiseFromSource, DPOptimizerFastGradientClipping):
    """Opacus' optimizer for ghost clipping (the gradient it receives is already the clipped sum), noise from a
    NoiseSource."""


class NoiseSourceDistributedDPOptimizer(DistributedDPOptimizer, NoiseSourceDPOptimizer):
    """Opacus' DistributedDPOptimizer, one per process of a run: each clips its examples' gradients; rank 0 alone
    adds the noise (once a step, from its NoiseSource), then the sums are all-reduced (training/distributed.py)."""


class NoiseSourceDistributedGhostClippingOptimizer(DistributedDPOptimizerFastGradientClipping,
                                                   NoiseSourceGhostClippingOptimizer):
    """The same, for ghost clipping."""


def ghost_clipping_applies(module: nn.Module) -> bool:
    """Whether every trained layer has Opacus' ghost norm (linear layers): per-example gradient norms then come
    from activation and backprop norms, and the clipped sum from a second backward pass, without materialising
    one gradient per example (for a linear head on 3,969 scattering coefficients, 4,096 x 39,700 floats a step)."""
    trained = [layer for layer in module.modules() if any(weight.requires_grad for weight in
                                                           layer.parameters(recurse=False))]
    return bool(trained) and all(type(layer) in GradSampleModuleFastGradientClipping.NORM_SAMPLERS
                                 for layer in trained)


def student_change(change: str) -> str:
    """A change per-example gradients made to the student, as the run's note and report say it."""
    return f"the student was changed for DP-SGD (saved so, rebuilt so on load): {change}"


def make_optimizer(config: PrivateTrainingConfig, weights: list[nn.Parameter]) -> torch.optim.Optimizer:
    """Adam, or SGD with momentum (Tramer & Boneh's choice for scattering students)."""
    if config.optimizer == "sgd":
        return torch.optim.SGD(weights, lr=config.lr, momentum=config.momentum)
    return torch.optim.Adam(weights, lr=config.lr)


def freeze_batchnorm(model: nn.Module) -> list[nn.Module]:
    """Fix every BatchNorm layer's scale and shift and return the layers, to be kept in eval mode: they then
    normalise each example with the (public) running statistics alone, so examples stay independent."""
    layers = [layer for layer in model.modules() if isinstance(layer, nn.modules.batchnorm._BatchNorm)]
    for layer in layers:
        layer.requires_grad_(False)
    return layers


def label_logits(labels: Tensor, num_classes: int) -> Tensor:
    """Logits of a teacher certain of each private label. KD against it is cross-entropy, so the annotator's
    distillation gradient is d CE / d logits = softmax(z) - one_hot(y). -1e4 rather than -inf keeps 0 * log 0 at 0."""
    return (F.one_hot(labels, num_classes).float() - 1) * 1e4


@dataclass
class PrivateTrainingResult:
    """The trained student, what it spent, and how it went; `private_figures` are computed from the private data
    without noise (exact training-set size, expected batch size, training loss) and belong in a private record."""

    model: Classifier
    privacy: dict[str, Any]
    history: list[dict]  # public: epoch, steps, test accuracy
    wall_seconds: float
    fixes: list[str]  # what per-example gradients changed in the student, one line per kind (BatchNorm -> GroupNorm)
    private_figures: dict[str, Any]
    confusion: Tensor  # public, as the accuracy: the final student's predictions on the evaluation images


class PrivateTrainer:
    """The loop both baselines share: Poisson-sampled batches, one ledger charge per step (the run stops before a
    step beyond the plan), test accuracy and a resumable checkpoint after every epoch, and within an epoch at least
    every CHECKPOINT_SECONDS (training/state.py).

    Privacy draws come from `self.noise` alone. A resumed secure run draws fresh noise and fresh batches for the
    steps after the last checkpoint (the rest of its epoch, then the next ones): the interrupted run released
    nothing after it (the ledger resumes from the checkpoint's count, and the weights those steps produced were
    never saved), so no noise is reused, and every step is an independent Poisson sample, as the accounting has it.

    On several processes (training/distributed.py) each trains on its shard of the training set with its own
    noise source; rank 0 alone evaluates, checkpoints and reports, and every process starts from its state. They
    meet at each epoch's end, where the checkpoint is written (alone, a run also saves within an epoch on time).
    """

    def __init__(self, config: PrivateTrainingConfig, dataset: ImageDataset, plan: PrivatePlan, work_dir: Path,
                 progress: Progress | None = None) -> None:
        config = config.fitted(plan.size)
        self.config, self.dataset, self.plan, self.work_dir, self.progress = config, dataset, plan, work_dir, progress
        self.device = torch.device(config.device)
        torch.manual_seed(config.seed)  # initialisation and other non-private randomness only
        self.group = Group.current()  # this process alone, or its place among the run's processes
        self.noise = noise_source(config.reproducible_noise, config.seed, self.group.rank)
        self.follower_noise: list[Any] = []  # the other processes' noise streams at the last checkpoint
        self.x_eval, self.y_eval = dataset.x_test, dataset.y_test
        self.measured_on = whole_test_split(dataset)
        self.frozen: list[nn.Module] = []  # kept in eval mode while training
        if config.student_init is None:
            student = build_classifier(config.student_arch, dataset.input_shape, dataset.num_classes)
        else:  # accuracy only on test images outside the encoder's public pool
            split = public_split(dataset, config.public, config.public_size)
            student = load_encoder(Path(config.student_init), config.student_arch, dataset.input_shape,
                                   dataset.num_classes, split.description)
            self.x_eval, self.y_eval, self.measured_on = split.x_eval, split.y_eval, split.measured_on
            self.frozen = freeze_batchnorm(student)
        # What does not learn is computed once: a frozen backbone (head-only training), or a fixed transform
        # leading the student (scattering), whose layers after it then train on its outputs.
        split = student.fixed_split()
        frozen, fixed = ((student.backbone, student.fixed_backbone) if config.train_layers == "head"
                         else (split[0] if split else None, True))
        images, labels = self.group.shard(dataset.x_train), self.group.shard(dataset.y_train)  # all of them alone
        inputs, self.eval_inputs = images, self.x_eval
        if frozen is not None:
            frozen.requires_grad_(False)
            self.frozen.append(frozen)
            inputs = frozen_features(frozen.to(self.device), images, self.device, fixed, progress)
            self.eval_inputs = frozen_features(frozen, self.x_eval, self.device, fixed, progress)
        self.model, self.fixes = self._student(student.to(self.device).train())  # Opacus checks training mode
        self.trained: nn.Module = (self.model if frozen is None else self.model.head if config.train_layers == "head"
                                   else self.model.fixed_split()[1])
        self.optimizer = make_optimizer(config, [weight for weight in self.trained.parameters() if weight.requires_grad])
        # the released weights: their moving average over the steps, or the last ones
        self.average = IterateAverage(self.trained, config.ema_decay) if config.ema_decay else None
        self.loader = poisson_loader(TensorDataset(inputs, labels), plan, self.noise, config.batch_size)
        self.ledger = PrivacyLedger(plan.query, plan.steps)
        self.epoch = 0
        self.history: list[dict] = []
        self.train_loss: list[float] = []  # per epoch, on the private data: a private figure
        self.epoch_loss: list[float] = [0.0, 0]  # the epoch under way's summed loss and examples (private too)

    def _student(self, model: Classifier) -> tuple[Classifier, list[str]]:
        return model, []

    def _step(self, inputs: Tensor, labels: Tensor) -> Tensor:
        """One update on a sampled batch (images, or the frozen encoder's features of them when only the head
        learns); returns the per-example losses."""
        raise NotImplementedError

    def _train_mode(self) -> None:
        """Training mode, except the layers that must keep the encoder's public statistics."""
        self.model.train()
        for layer in self.frozen:
            layer.eval()

    def _predictions(self) -> Tensor:
        """The evaluation images' predicted classes by the weights the run releases (the trained layers, or their
        moving average, on the frozen layers' outputs of the images, computed once)."""
        if self.average is None:
            return predict(self.trained, self.eval_inputs, device=self.device)
        with self.average.swapped_in():
            return predict(self.trained, self.eval_inputs, device=self.device)

    def run(self, resume: bool = False) -> PrivateTrainingResult | None:
        """Train the plan's epochs (after the checkpoint's, resuming); None on a process other than rank 0."""
        if resume:
            self._restore(load_state(self.work_dir / "resume"))
        self._start_together()
        started, predicted, per_epoch = time.perf_counter(), None, self.plan.steps_per_epoch
        pace = Pace(self.progress)  # an epoch of a large student takes minutes: how far into it the run is
        checkpoints = Checkpoints()  # ... and, alone, is saved within it on time (each epoch's end is saved below)
        while self.epoch < self.config.epochs:
            self._train_mode()
            done = self.ledger.answered - self.epoch * per_epoch  # this epoch's steps before an interruption
            for step, (inputs, labels) in enumerate(islice(self.loader, per_epoch - done), start=done + 1):
                pace.within({"epoch": round(self.epoch + (step - 1) / per_epoch, 2)})
                self.ledger.charge(1)
                self.epoch_loss[0] += self._step(inputs.to(self.device), labels.to(self.device)).sum().item()
                if self.average is not None:
                    self.average.update()
                self.epoch_loss[1] += len(labels)
                if step < per_epoch and self.group.size == 1:
                    checkpoints(step, lambda: save_state(self.work_dir / "resume", self._state()))
            self.epoch += 1
            loss_sum, seen = self.group.sum(*self.epoch_loss)
            self.train_loss.append(loss_sum / max(seen, 1))
            self.epoch_loss = [0.0, 0]
            self.follower_noise = self.group.gather_json(self.noise.state())[1:]
            if not self.group.leads:
                continue
            predicted = self._predictions()
            self.history.append({"epoch": self.epoch, "steps": self.ledger.answered,
                                 "test_accuracy": share_correct(predicted, self.y_eval), **self._last_iterate()})
            save_state(self.work_dir / "resume", self._state())
            pace(self.history[-1])
        if self.ledger.answered != self.plan.steps:
            raise BudgetExceededError(f"ran {self.ledger.answered} steps, planned {self.plan.steps}")
        if not self.group.leads:
            return None
        if predicted is None:  # resumed after its last epoch
            predicted = self._predictions()
        confusion = confusion_counts(predicted, self.y_eval, self.dataset.num_classes)
        if self.average is not None:
            self.average.apply()  # the student released is the average
        return PrivateTrainingResult(self.model.eval(), self.privacy_summary(), self.history,
                                     time.perf_counter() - started, self.fixes, self.private_figures(), confusion)

    def _last_iterate(self) -> dict[str, float]:
        """Where the released weights are an average, the last weights' accuracy beside it (public as well: the
        last iterate is post-processing of the noisy steps too)."""
        if self.average is None:
            return {}
        return {"last_iterate_accuracy": share_correct(predict(self.trained, self.eval_inputs, device=self.device),
                                                       self.y_eval)}

    def _start_together(self) -> None:
        """On several processes, every one starts from rank 0's state: its weights (as Opacus' DPDDP broadcasts
        them) and, resumed, its optimizer's state, its counters and each process's noise stream."""
        if self.group.size > 1:
            state = self.group.broadcast_state(self._state() if self.group.leads else None)
            if not self.group.leads:
                self._restore(state)

    def private_figures(self) -> dict[str, Any]:
        """Figures computed from the private data without noise: for a private record, never the public report."""
        train_size = len(self.dataset.y_train)
        return {"train_size": train_size, "expected_batch_size": self.plan.sample_rate * train_size,
                "train_loss": [{"epoch": record["epoch"], "train_loss": loss}
                               for record, loss in zip(self.history, self.train_loss)]}

    def epsilons_by_relation(self, epsilon: float) -> dict[str, float]:
        """The run's epsilon under each neighbouring relation it can be stated in."""
        return {epsilon_key(self.plan.relation): epsilon}

    def privacy_summary(self) -> dict[str, Any]:
        """The public `privacy` section of the report: the guarantee of the steps run and its relation (what it
        covers is the method's to say)."""
        config, steps = self.config, self.ledger.answered
        epsilon = self.plan.count_epsilon + composed_epsilon(self.plan.query, steps, config.delta)
        count = {} if self.plan.count is None else {"size_count_epsilon": self.plan.count_epsilon,
                                                    "size_count_scale": self.plan.count.scale}
        return {"method": config.method, "mode": "data", "epsilon": epsilon, "delta": config.delta,
                "budget_epsilon": config.epsilon, "relation": self.plan.relation, **self.epsilons_by_relation(epsilon),
                "unit": UNITS[self.plan.relation], "noise_multiplier": self.plan.noise_multiplier,
                "sample_rate": self.plan.sample_rate, "declared_size": self.plan.size, **count,
                "training_set_size": self.plan.size_words(),
                "sampling": (f"Poisson, rate and steps per epoch from the public training-set size "
                             f"{self.plan.size:,}"),
                "steps": steps, "planned_steps": self.plan.steps,
                "calibrated": config.sigma is None, "noise": self.noise.description}

    def _state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "steps": self.ledger.answered, "noise_multiplier": self.plan.noise_multiplier,
                "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "noise": self.noise.state(), "follower_noise": self.follower_noise, "torch_rng": torch.get_rng_state(),
                "history": self.history, "train_loss": self.train_loss, "epoch_loss": self.epoch_loss,
                **({} if self.average is None else {"average": self.average.state()})}

    def _restore(self, state: dict[str, Any]) -> None:
        """Continue after the last checkpoint (an epoch's end, or a step within one): same weights, optimizer and
        spent steps; the same noise stream only in reproducible mode (a secure source has no state and draws
        afresh)."""
        if "noise" not in state:
            raise CheckpointError("the interrupted run drew its noise from seeded generators (no guarantee): start "
                                  "a new run")
        if state["noise_multiplier"] != self.plan.noise_multiplier:
            raise CheckpointError(f"the interrupted run used noise multiplier {state['noise_multiplier']}, its saved "
                                  f"configuration now gives {self.plan.noise_multiplier}: start a new run")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.average is not None:
            self.average.restore(state["average"])
        streams = [state["noise"], *state.get("follower_noise", [])]  # each process's, once a checkpoint saved them
        if self.group.rank < len(streams):
            self.noise.restore(streams[self.group.rank])
        self.follower_noise = state.get("follower_noise", [])
        torch.set_rng_state(state["torch_rng"])
        self.epoch, self.ledger.answered, self.history = state["epoch"], state["steps"], state["history"]
        self.train_loss, self.epoch_loss = state["train_loss"], state.get("epoch_loss", [0.0, 0])


class DPSGDTrainer(PrivateTrainer):
    """DP-SGD wired from Opacus' parts: GradSampleModule for per-example gradients, `NoiseSourceDPOptimizer` (flat
    clipping, noise from the NoiseSource; Adam or SGD on the privatised gradient is post-processing), the secret Poisson
    sampler, and Opacus' RDP accountant following every step, reported beside dp-accounting's figure.

    The mean-loss gradient is divided by the public --batch-size rather than Opacus' int(n * rate), which depends
    on the private training-set size.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # on several processes, Opacus' share of the batch: each process's sum over it, averaged over the processes
        settings = {"noise": self.noise, "noise_multiplier": self.plan.noise_multiplier,
                    "max_grad_norm": self.config.max_grad_norm,
                    "expected_batch_size": self.config.batch_size / self.group.size}
        distributed = self.group.size > 1
        self.ghost_clipping = ghost_clipping_applies(self.trained)
        if self.ghost_clipping:
            self.private_model = GradSampleModuleFastGradientClipping(self.trained,
                                                                      max_grad_norm=self.config.max_grad_norm)
            self.optimizer = (NoiseSourceDistributedGhostClippingOptimizer if distributed
                              else NoiseSourceGhostClippingOptimizer)(self.optimizer, **settings)
            self.ghost_loss = DPLossFastGradientClipping(self.private_model, self.optimizer, nn.CrossEntropyLoss())
        else:
            self.private_model = GradSampleModule(self.trained)
            self.private_model.forbid_grad_accumulation()  # Poisson batches: one batch, one step
            self.optimizer = (NoiseSourceDistributedDPOptimizer if distributed
                              else NoiseSourceDPOptimizer)(self.optimizer, **settings)
        self.accountant = RDPAccountant()
        self.optimizer.attach_step_hook(self.accountant.get_optimizer_hook_fn(sample_rate=self.plan.sample_rate))
        self._check_per_example_path()
        canaries = GRADIENT_CANARIES.get()
        if canaries is not None:  # an audit's white-box canaries (audit/white_box.py); never set by a release
            canaries.attach(self.optimizer, self.trained, self.plan.sample_rate, self.config.max_grad_norm)

    def _student(self, model: Classifier) -> tuple[Classifier, list[str]]:
        """The model Opacus can train, and one line per kind of change it needed (models/per_example.py; the saved
        student records it and is rebuilt so)."""
        return per_example(model)

    def _step(self, inputs: Tensor, labels: Tensor) -> Tensor:
        """One noisy step on the Poisson batch, its per-example gradients materialised PER_EXAMPLE_CHUNK examples at
        a time and clipped into one sum (Opacus' skipped steps, as its BatchMemoryManager does): the chunks keep
        their size from step to step where the batch's changes. Ghost clipping materialises none: one chunk."""
        self.optimizer.zero_grad(set_to_none=True)
        size = max(len(labels), 1) if self.ghost_clipping else PER_EXAMPLE_CHUNK
        chunks = list(zip(inputs.split(size), labels.split(size)))
        losses = []
        for index, (chunk_inputs, chunk_labels) in enumerate(chunks):
            losses.append(self._per_example_gradients(chunk_inputs, chunk_labels))
            last = index == len(chunks) - 1
            self.optimizer.signal_skip_step(do_skip=not last)
            self.optimizer.step()  # a skipped step clips the chunk into the sum, and neither noises nor updates
            if not last:
                self.optimizer.zero_grad(set_to_none=True)  # the chunk's per-example gradients; the sum stays
        return torch.cat(losses)

    def _per_example_gradients(self, inputs: Tensor, labels: Tensor) -> Tensor:
        """Forward and backward through Opacus' per-example path: the gradients the optimizer then clips and noises;
        returns the per-example losses."""
        outputs = self.private_model(inputs)
        with warnings.catch_warnings():  # Opacus' hooks on the first layer, whose input (the data) needs no gradient
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            if self.ghost_clipping:  # two backward passes: the per-example norms, then the clipped sum
                loss = self.ghost_loss(outputs, labels)
                loss.backward()
                losses = loss.loss_per_sample
            else:
                losses = F.cross_entropy(outputs, labels, reduction="none")
                losses.mean().backward()  # an empty Poisson batch still takes its noisy step
        return losses.detach()

    def _check_per_example_path(self) -> None:
        """One forward and backward pass of two blank inputs (zeros of the training inputs' shape: no data) through
        Opacus' per-example path when the run is planned: a layer it cannot go through (an output changed in place
        by the model's own code, a layer its per-example gradients fail on) or weights the loss never reaches are
        refused here, named, before any ledger entry, not at the first step of a run whose budget is reserved.
        Nothing is kept: the gradients are cleared, the buffers (a frozen encoder's statistics) restored."""
        names = layer_names(self.trained)
        running: list[nn.Module] = []  # the layers whose forward has begun and not ended, innermost last

        def entered(layer: nn.Module, _inputs: Any) -> None:
            running.append(layer)

        def left(_layer: nn.Module, _inputs: Any, _output: Any) -> None:
            running.pop()

        hooks = [hook for layer in names for hook in (layer.register_forward_pre_hook(entered),
                                                       layer.register_forward_hook(left))]
        blank = torch.zeros(2, *self.loader.dataset.tensors[0].shape[1:], device=self.device)
        buffers = {name: buffer.clone() for name, buffer in self.trained.named_buffers()}  # kept as they were
        self._train_mode()
        try:
            self._per_example_gradients(blank, torch.arange(2, device=self.device) % self.dataset.num_classes)
        except (RuntimeError, NotImplementedError, TypeError, ValueError) as error:
            where = f"its layer {names[running[-1]]} ({type(running[-1]).__name__})" if running else "its backward pass"
            reason = (("changes a layer's output in place (x.relu_(), F.relu(x, inplace=True), x += y), which "
                       "Opacus' per-example hooks cannot follow: compute it out of place")
                      if "modified inplace" in str(error) else f"fails under Opacus' per-example gradients: "
                                                              f"{first_line(error)}")
            raise ConfigError(f"DP-SGD cannot train the student: {where} {reason}") from error
        finally:
            for hook in hooks:
                hook.remove()
            for name, buffer in self.trained.named_buffers():
                buffer.copy_(buffers[name])
        unreached = [f"{name}.{weight_name}" for layer, name in names.items()
                     for weight_name, weight in layer.named_parameters(recurse=False) if weight.requires_grad
                     and weight.grad is None and getattr(weight, "grad_sample", None) is None]
        self.optimizer.zero_grad(set_to_none=True)
        if unreached:
            raise ConfigError(f"DP-SGD cannot train the student: the loss never reaches its weights "
                              f"{', '.join(unreached[:3])} (a layer its forward does not use): remove the layer, or "
                              f"set requires_grad=False on it")

    def epsilons_by_relation(self, epsilon: float) -> dict[str, float]:
        """Both relations: the budget's, and the other one for the same noise."""
        other = REPLACE_ONE if self.plan.relation == ADD_REMOVE else ADD_REMOVE
        restated = dataclasses.replace(self.plan.query, relation=other)
        return {**super().epsilons_by_relation(epsilon), epsilon_key(other): self.plan.count_epsilon
                + composed_epsilon(restated, self.ledger.answered, self.config.delta)}

    def privacy_summary(self) -> dict[str, Any]:
        config, steps = self.config, self.ledger.answered
        history = [tuple(entry) for entry in self.accountant.history]
        if history != [(self.plan.noise_multiplier, self.plan.sample_rate, steps)]:
            raise BudgetExceededError(f"Opacus accounted {history}, dpdistill {steps} steps at noise multiplier "
                                      f"{self.plan.noise_multiplier} and rate {self.plan.sample_rate}")
        add_remove = dataclasses.replace(self.plan.query, relation=ADD_REMOVE)
        count = self.plan.count_epsilon  # the cross-checks are of the steps; the noisy count adds to each
        return {**super().privacy_summary(),
                "epsilon_rdp": count + composed_epsilon_rdp(add_remove, steps, config.delta),
                "epsilon_opacus": count + self.accountant.get_epsilon(config.delta),
                "accountant": "dp-accounting PLD, Poisson-subsampled Gaussian",
                "accountant_opacus": "Opacus RDP accountant",
                "relation_rdp": ADD_REMOVE,  # both RDP cross-checks (dp-accounting's and Opacus')
                "max_grad_norm": config.max_grad_norm,
                "noise_std": self.plan.noise_multiplier * config.max_grad_norm}

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "accountant": self.accountant.history}

    def _restore(self, state: dict[str, Any]) -> None:
        super()._restore(state)
        self.accountant.history = [tuple(entry) for entry in state["accountant"]]


class DirectOutputGradientTrainer(PrivateTrainer):
    """DPDFD's direct training: DPSD's data-mode annotation with the private label as the teacher, its noise from
    the run's NoiseSource."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Counts per-example releases for the private record; the budget is guarded per step by `self.ledger`.
        self.releases = PrivacyLedger(self.plan.query, len(self.loader.dataset) * self.plan.steps)
        self.annotator = OutputGradientAnnotator(DistillationGradient(loss="kd"), self.releases, self.config.beta,
                                                 self.sigma, None, self.config.target_step, self.noise)

    @property
    def sigma(self) -> float:
        """Noise std / beta: answers of norm <= beta differ by <= 2 beta, so twice the noise multiplier."""
        return 2 * self.plan.noise_multiplier

    def _step(self, inputs: Tensor, labels: Tensor) -> Tensor:
        logits = self.trained(inputs)
        targets = self.annotator.annotate(label_logits(labels, self.dataset.num_classes), logits)
        losses = soft_cross_entropy(logits, targets)
        self.optimizer.zero_grad(set_to_none=True)
        losses.mean().backward()
        self.optimizer.step()
        return losses.detach()

    def privacy_summary(self) -> dict[str, Any]:
        config = self.config
        return {**super().privacy_summary(),
                "accountant": "exact, per-example Gaussian releases: no amplification by subsampling",
                "epsilon_scope": "output gradients only",
                "unit": "replacing one private training example (the released output gradients only)",
                "sigma": self.sigma, "beta": config.beta, "noise_std": self.sigma * config.beta,
                "target_step": config.target_step}

    def private_figures(self) -> dict[str, Any]:
        """Also the count of per-example releases: about the training-set size times the rate times the steps."""
        return {**super().private_figures(), "releases": self.releases.answered}

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "releases": self.releases.answered}

    def _restore(self, state: dict[str, Any]) -> None:
        super()._restore(state)
        self.releases.answered = state["releases"]


TRAINERS: dict[str, type[PrivateTrainer]] = {"dpsgd": DPSGDTrainer, "dpdfd-direct": DirectOutputGradientTrainer}
