"""PATE on public images: a teacher ensemble labels public, unlabelled images through noisy votes (GNMax).

The baseline a privacy researcher compares data-free transcription to (Papernot et al. 2017, "Semi-supervised
Knowledge Transfer for Deep Learning from Private Training Data", and 2018, "Scalable Private Learning with PATE"):
1. Choose `queries` public images no member was trained on (half of the test split, whose other half measures
   accuracy, or another data set of the same shape); at random or as k-means representatives (public: free).
2. Ask: each member votes its top class; count the votes per class.
3. Release: the counts plus exact discrete Gaussian noise from secret randomness (never from `--seed`). One private
   example changes one member's vote, moving two counts by one; the answers compose (`DiscreteGaussianQuery`).
   The answers are saved before the student learns: a resumed run never asks the ensemble again.
4. Learn: the student fits the noisy winners, or the probability that each class holds the most votes given the
   noisy counts (the same release, no further cost), supervised or with consistency training on the whole
   public pool, then (self-training) the public images it labels confidently itself.
Everything the student learns from is public or a noisy release: it is covered, provided the public images hold
no private example. With a sample source (data/sample_source.py) its synthetic images replace the public pool, the
student learns from them, and the vote noise is calibrated so that the source's release and the answers together
stay within the budget.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from dpdistill.atomic import write_atomically
from dpdistill.data.base import ImageDataset
from dpdistill.data.public import PUBLIC_POOL, PublicSplit, pool_size, public_split
from dpdistill.data.sample_source import load_sample_source
from dpdistill.errors import CheckpointError, ConfigError, PrivacyParameterError
from dpdistill.evaluation.metrics import confusion_counts, predict, probabilities, share_correct
from dpdistill.methods.base import Job, Method, Needs, Outcome, Source
from dpdistill.methods.lifecycle import execute
from dpdistill.methods.teachers import (classifier_meta, evaluation_set, model_class_names, read_teacher,
                                       teacher_accuracy, teacher_data_set)
from dpdistill.models.checkpoint import saved_class_names
from dpdistill.models.ensemble import TeacherEnsemble, partition_reads, plurality_counts
from dpdistill.options import (AuditRoute, ENSEMBLE_HELP, OVERWRITE_OPTION, REPRODUCIBLE_NOISE_HELP,
                               RESUME_FROM_ANSWERS_HELP, SAMPLE_SOURCE_HELP, SEED_HELP, CommandSpec, Option,
                               dataset_help, field_options, out_option, resume_option, setting)
from dpdistill.privacy.accounting import Cost, DiscreteLaplaceQuery
from dpdistill.privacy.budget import PrivacyPlan, PrivacyRequest, plan_privacy
from dpdistill.privacy.ledger import Release, UncoveredRead, reproducible_noise_read
from dpdistill.privacy.mechanisms import noisy_votes
from dpdistill.privacy.randomness import noise_source
from dpdistill.progress import Progress, in_phase
from dpdistill.reporting.pate import pate_markdown, save_vote_leads
from dpdistill.runs import release_state, saved_config
from dpdistill.training.semi_supervised import ConsistencyConfig, manifold_triples, train_consistency
from dpdistill.training.teacher import TeacherConfig, load_encoder, train_classifier
from dpdistill.training.vae import VaeConfig


ANSWERS_FILE = "answers.safetensors"
ANSWERS_FIGURE = "answers.png"  # the noisy winners' leads, in noise standard deviations
ANSWERS_PHASE = "answers"  # a progress display's name for the ensemble answering
QUERY_SELECTIONS = ("random", "kmeans")
STUDENT_TRAININGS = ("supervised", "consistency", "tangent-normal")
ANSWER_TARGETS = ("argmax", "posterior", "shares")
VOTE_NOISE = {"gaussian": "discrete Gaussian noise (GNMax)", "laplace": "discrete Laplace noise (LNMax)",
              "none": "no noise (the control: exact votes, NOT private)"}
EXACT_VOTES = "none"  # the vote noise of the control: the same pipeline without privacy, what it learns at best
COVERS = ("the student: it learns only from public images and the noisy answers (post-processing), provided the "
          "public images hold no private example")
EXACT_VOTES_READ = UncoveredRead("the teacher ensemble's exact vote counts, released without noise (the control)",
                                 "NO guarantee: a control, the ensemble's votes were released without noise")
CONTROL_PRIVACY = {"mode": "none", "accountant": "none: no mechanism", "delta": None}
SOURCE_COVERS = ("the student: it learns only from the sample source's synthetic images and the noisy answers "
                 "(post-processing of both releases; epsilon is their composition)")


@dataclass(frozen=True)
class PateConfig:
    """Every setting of a PATE run; checked on construction, so a bad value fails before any work."""

    epsilon: float | None = setting(None, "privacy budget; the vote noise is calibrated to it unless --sigma (none "
                                          "with --vote-noise none)")
    delta: float = setting(1e-5, "delta of (epsilon, delta)-DP")
    queries: int = setting(1000, "public images the ensemble labels: fewer answers, each less noisy")
    sigma: float | None = setting(None, "noise std on each vote count (default: calibrated)")
    public: str | None = setting(None, "data set of the public images (default: the evaluation data set's test "
                                       "split, whose first --public-size images are then public and the rest "
                                       "measure accuracy)")
    public_size: int | None = setting(None, "public images the student may see, labelled or not [default: 5000, at "
                                            "most half the test split it comes from; with a sample source all its "
                                            "images]")
    sample_source: str | None = setting(None, SAMPLE_SOURCE_HELP)
    query_selection: str = setting("random", "which public images are asked: random, or kmeans (the typical image "
                                             "of each of --queries k-means clusters; public, so free)")
    vote_margin: float = setting(0.0, "keep only answers whose noisy winner leads by this many sigmas (free)")
    accept_noise: bool = setting(False, "run even where the answers would be near random (refused by default: "
                                        "even a unanimous vote would rarely survive the noise)", show_default=False)
    vote_noise: str = setting("gaussian", "gaussian (GNMax), laplace (LNMax, DGD's; --sigma is then the "
                                          "whole-number scale), or none (exact votes: a control, NOT private)")
    answer_targets: str = setting("argmax", "what the student learns from an answer: argmax (the noisy winner), or "
                                            "posterior (each class's probability of holding the most votes given "
                                            "the noisy counts; free), or shares (the control's: each class's share "
                                            "of the exact votes)")
    self_training_rounds: int = setting(1, "rounds of retraining on the public images the student labels "
                                           "confidently itself (free)")
    pseudo_label_confidence: float = setting(0.9, "the student's probability needed to keep its label")
    student_training: str = setting("supervised", "each round: supervised (the labels alone), consistency "
                                                  "(FixMatch: also the unlabelled public images; slower, better from "
                                                  "few answers) or tangent-normal (DGD's, through a VAE of the "
                                                  "pool)")
    consistency_steps: int = setting(3000, "steps of a consistency round, --batch-size labelled images each")
    consistency_threshold: float = setting(0.95, "the student's probability on an easy view needed to train on the "
                                                 "hard view of an unlabelled image")
    unlabelled_ratio: int = setting(3, "unlabelled images per labelled one in a consistency step")
    tangent_radius: float = setting(1.0, "tangent-normal: step along the VAE's manifold (code L2)")
    normal_radius: float = setting(0.1, "tangent-normal: step across it (RMS per pixel)")
    entropy_weight: float = setting(1.0, "tangent-normal: weight of the prediction entropy")
    vae_steps: int = setting(3000, "tangent-normal: steps fitting the VAE to the pool")
    feature_distance: str = setting("normalized", "tangent-normal: distances between L2-normalised features, the "
                                                  "reconstruction's fixed (a consistency loss), or raw (DGD's Eq. 6 "
                                                  "as written)")
    student_schedule: str = setting("cosine", "consistency and tangent-normal students: the learning rate decays "
                                              "to zero by a cosine, or linearly (DGD's)")
    student_arch: str = setting("datalens", "the student's architecture, or module:callable")
    student_init: str | None = setting(None, "start the student from this pretrained encoder (a `dpdistill "
                                             "pretrain` directory on the same public pool)")
    epochs: int = setting(10, "the student's passes over its labelled images each round")
    min_steps: int = setting(1500, "at least this many optimizer steps per round")
    augment_shift: int = setting(2, "translate training images by up to this many pixels (0: off)")
    batch_size: int = setting(128, "the student's images a step")
    lr: float = setting(1e-3, "Adam's learning rate")
    dataset: str | None = setting(None, dataset_help("evaluation data set (default: the teachers')"))
    seed: int = setting(0, SEED_HELP)
    reproducible_noise: bool = setting(False, REPRODUCIBLE_NOISE_HELP, show_default=False)
    device: str = setting("cpu", "cpu or cuda")

    def __post_init__(self) -> None:
        if self.control:
            if self.epsilon is not None or self.sigma is not None or self.vote_margin:
                raise ConfigError("--vote-noise none releases exact votes (a control, not private): drop --epsilon, "
                                  "--sigma and --vote-margin")
            if self.answer_targets == "posterior":
                raise ConfigError("posterior targets model the vote noise: use --answer-targets argmax or shares "
                                  "with --vote-noise none")
        elif self.epsilon is None:
            raise PrivacyParameterError("a privacy budget --epsilon is required")
        elif self.answer_targets == "shares":
            raise ConfigError("vote shares are the exact votes' (the control, --vote-noise none): noisy counts "
                              "can be negative; use --answer-targets posterior")
        for name in ("queries", "epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.sample_source is not None and (self.public is not None or self.public_size is not None):
            raise ConfigError("--sample-source replaces the public pool: drop --public and --public-size")
        if self.public_size is not None and self.public_size < 1:
            raise ConfigError(f"public-size must be at least 1, got {self.public_size}")
        for name in ("vote_margin", "self_training_rounds", "min_steps", "augment_shift"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name.replace('_', '-')} must not be negative, got {getattr(self, name)}")
        if self.student_training not in STUDENT_TRAININGS:
            raise ConfigError(f"unknown student training {self.student_training!r}; choose one of "
                              f"{', '.join(STUDENT_TRAININGS)}")
        if self.vote_noise not in VOTE_NOISE:
            raise ConfigError(f"unknown vote noise {self.vote_noise!r}; choose one of {', '.join(VOTE_NOISE)}")
        if self.vote_noise == "laplace" and self.answer_targets == "posterior":
            raise ConfigError("posterior targets model Gaussian vote noise: use --answer-targets argmax with "
                              "--vote-noise laplace")
        if self.answer_targets not in ANSWER_TARGETS:
            raise ConfigError(f"unknown answer targets {self.answer_targets!r}; choose one of "
                              f"{', '.join(ANSWER_TARGETS)}")
        if self.query_selection not in QUERY_SELECTIONS:
            raise ConfigError(f"unknown query selection {self.query_selection!r}; choose one of "
                              f"{', '.join(QUERY_SELECTIONS)}")
        if not 0 < self.pseudo_label_confidence <= 1:
            raise ConfigError(f"pseudo-label-confidence must be in (0, 1], got {self.pseudo_label_confidence}")
        if not self.lr > 0:
            raise ConfigError(f"lr must be positive, got {self.lr}")
        if self.student_training != "supervised":
            self.consistency_config()  # its own checks, now rather than after the answers are spent
        elif self.student_schedule != "cosine" or self.feature_distance != "normalized":
            raise ConfigError("student-schedule and feature-distance apply to consistency and tangent-normal "
                              "training; the supervised student decays by a cosine and measures no feature distance")

    @property
    def control(self) -> bool:
        """Exact votes: the pipeline without its privacy noise, reported as NOT private."""
        return self.vote_noise == EXACT_VOTES

    def public_split(self, evaluation: ImageDataset) -> PublicSplit:
        """The public pool (without a sample source) and the images accuracy is measured on: unless sized, at most
        half the evaluation set's test split."""
        size = pool_size(self.public_size, self.public, len(evaluation.y_test))
        if self.queries > size:
            raise ConfigError(f"{self.queries} queries need at least as many public images; the public pool holds "
                              f"{size}: lower --queries (or raise --public-size)")
        return public_split(evaluation, self.public, size)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "PateConfig":
        try:
            return cls(**values)
        except TypeError as error:
            raise ConfigError(f"the saved configuration does not describe a PATE run ({error})") from error

    def supervised_config(self) -> TeacherConfig:
        return TeacherConfig(arch=self.student_arch, epochs=self.epochs, batch_size=self.batch_size, lr=self.lr,
                             min_steps=self.min_steps, seed=self.seed, device=self.device,
                             augment_shift=self.augment_shift, init=self.student_init)

    def consistency_config(self) -> ConsistencyConfig:
        regularizer = "fixmatch" if self.student_training == "consistency" else self.student_training
        return ConsistencyConfig(arch=self.student_arch, steps=self.consistency_steps, batch_size=self.batch_size,
                                 unlabelled_ratio=self.unlabelled_ratio, regularizer=regularizer,
                                 threshold=self.consistency_threshold, tangent_radius=self.tangent_radius,
                                 normal_radius=self.normal_radius, entropy_weight=self.entropy_weight,
                                 vae=VaeConfig(steps=self.vae_steps, seed=self.seed, device=self.device),
                                 lr=self.lr, schedule=self.student_schedule, feature_distance=self.feature_distance,
                                 augment_shift=self.augment_shift, init=self.student_init, seed=self.seed,
                                 device=self.device)

    def progress_per_round(self) -> int:
        """Units of the student's progress ("done" in its progress records) a round: 1, or its consistency steps."""
        return 1 if self.student_training == "supervised" else self.consistency_steps

    def progress_total(self) -> int:
        return (self.self_training_rounds + 1) * self.progress_per_round()

    def privacy_request(self, members: int, num_classes: int) -> PrivacyRequest:
        """GNMax over all classes: label mode over an ensemble, with every class a candidate (the control: no
        mechanism)."""
        return PrivacyRequest(mode="none" if self.control else "label", epsilon=self.epsilon, delta=self.delta,
                              sigma=self.sigma, num_candidates=num_classes, teachers=members,
                              vote_noise=self.vote_noise, accept_noise=self.accept_noise)

    def privacy_plan(self, members: int, num_classes: int, cost: Cost | None = None) -> PrivacyPlan:
        """One answer per query; planned once, before the ensemble's ledger reserves the release. `cost`: what the
        answers spend against the budget (with a sample source, its release composed with them)."""
        return plan_privacy(self.privacy_request(members, num_classes), num_classes, self.queries, 1, cost)


@dataclass(frozen=True)
class Answers:
    """The released noisy votes: which public images were asked, their noisy vote counts, the noisy winner, and
    whether it was kept."""

    indices: Tensor  # int64 (queries,), into the public pool
    votes: Tensor  # float32 (queries, classes): the noisy vote histogram, the mechanism's whole output
    labels: Tensor  # int64 (queries,)
    confident: Tensor  # bool (queries,): the noisy lead reached the vote margin

    def save(self, path: Path) -> None:
        tensors = {name: getattr(self, name).contiguous() for name in ANSWER_FIELDS}
        write_atomically({path: lambda temporary: save_file(tensors, temporary)})

    @classmethod
    def load(cls, path: Path, queries: int) -> "Answers":
        try:
            tensors = load_file(path)
            if set(ANSWER_FIELDS) - tensors.keys() == {"votes"}:  # every field but the histogram
                raise CheckpointError(f"the released answers in {path} were written by an older dpdistill that kept "
                                      f"only the noisy winners, not the noisy histogram this version resumes from; "
                                      f"asking again would spend the budget twice: start a new run elsewhere")
            answers = cls(*(tensors[name] for name in ANSWER_FIELDS))
        except (SafetensorError, KeyError, OSError) as error:
            raise CheckpointError(f"the released answers in {path} are damaged ({error}); they cannot be asked "
                                  f"for again without spending the budget twice: start a new run elsewhere") from error
        if not len({len(getattr(answers, name)) for name in ANSWER_FIELDS} | {queries}) == 1:
            raise CheckpointError(f"{path} holds {len(answers.indices)} answers, the run planned {queries}")
        return answers


ANSWER_FIELDS = tuple(field.name for field in dataclasses.fields(Answers))


@torch.inference_mode()
def vote_counts(ensemble: TeacherEnsemble, images: Tensor, num_classes: int, device: torch.device,
                batch_size: int = 512, progress: Progress | None = None) -> Tensor:
    """(n, classes) counts of the members' top classes, batch by batch (M x batch logits at a time); a display
    counts the images answered (a large ensemble takes minutes)."""
    counts = []
    for start in range(0, len(images), batch_size):
        member_logits = ensemble.member_logits(images[start:start + batch_size].to(device))
        counts.append(plurality_counts(member_logits, num_classes).cpu())
        if progress:
            progress({"phase": ANSWERS_PHASE, "done": min(start + batch_size, len(images)), "total": len(images)})
    return torch.cat(counts)


def choose_queries(pool: Tensor, config: PateConfig) -> Tensor:
    """Indices of the `config.queries` public images to ask about, chosen from public images alone."""
    generator = torch.Generator().manual_seed(config.seed)
    if config.query_selection == "random":
        return torch.randperm(len(pool), generator=generator)[:config.queries]
    return kmeans_representatives(pool.flatten(1).float(), config.queries, generator)


def kmeans_representatives(points: Tensor, clusters: int, generator: torch.Generator, iterations: int = 20) -> Tensor:
    """Indices of `clusters` distinct points, each the one nearest the centre of its k-means cluster (Lloyd's
    algorithm from k-means++ seeds): few labels go further on typical images that cover the pool, and the
    ensemble agrees more on typical images, so its votes outrun the noise more often."""
    centres = _kmeans_plus_plus(points, clusters, generator)
    for _ in range(iterations):
        assignment = torch.cdist(points, centres).argmin(1)
        sums = torch.zeros_like(centres).index_add_(0, assignment, points)
        sizes = torch.bincount(assignment, minlength=clusters).unsqueeze(1)
        centres = torch.where(sizes > 0, sums / sizes.clamp(min=1), centres)  # an empty cluster keeps its centre
    distances = torch.cdist(points, centres)
    assignment = distances.argmin(1)
    chosen = torch.zeros(len(points), dtype=torch.bool)
    for cluster in assignment.unique():  # the point nearest its own centre: distinct, since clusters are disjoint
        members = (assignment == cluster).nonzero().squeeze(1)
        chosen[members[distances[members, cluster].argmin()]] = True
    spare = (~chosen).nonzero().squeeze(1)  # an empty cluster's place goes to a random remaining point
    fill = spare[torch.randperm(len(spare), generator=generator)[:clusters - int(chosen.sum())]]
    return torch.cat([chosen.nonzero().squeeze(1), fill])


def _kmeans_plus_plus(points: Tensor, clusters: int, generator: torch.Generator) -> Tensor:
    """Seeds far apart: each next one drawn with probability proportional to its squared distance to the nearest
    seed so far (Arthur and Vassilvitskii 2007)."""
    seeds = [int(torch.randint(len(points), (1,), generator=generator))]
    nearest = torch.cdist(points, points[seeds]).squeeze(1).square()
    for _ in range(clusters - 1):
        weights = nearest if nearest.sum() > 0 else torch.ones_like(nearest)  # all covered: any point will do
        seeds.append(int(torch.multinomial(weights, 1, generator=generator)))
        nearest = torch.minimum(nearest, (points - points[seeds[-1]]).square().sum(1))
    return points[seeds].clone()


def release_answers(ensemble: TeacherEnsemble, pool: Tensor, plan: PrivacyPlan, config: PateConfig,
                    num_classes: int, progress: Progress | None = None) -> Answers:
    """Charge the ledger for every answer, then release the noisy plurality of each asked image's votes, with
    noise from secret randomness (or, debugging only, from the seed); the control (no mechanism) releases the
    exact votes."""
    ledger = plan.ledger()
    indices = choose_queries(pool, config)
    if ledger is not None:
        ledger.charge(len(indices))
    votes = vote_counts(ensemble, pool[indices], num_classes, torch.device(config.device), progress=progress)
    if ledger is None:  # the control
        return Answers(indices, votes.float(), votes.argmax(1), torch.ones(len(indices), dtype=torch.bool))
    everything = torch.ones_like(votes, dtype=torch.bool)
    noisy = noisy_votes(votes, everything, plan.sigma, noise_source(config.reproducible_noise, config.seed),
                        laplace=isinstance(plan.query, DiscreteLaplaceQuery))  # the noise the plan accounts
    leaders = noisy.topk(2, dim=1).values
    confident = leaders[:, 0] - leaders[:, 1] >= config.vote_margin * plan.sigma
    return Answers(indices, noisy, noisy.argmax(1), confident)  # argmax: integer counts tie, topk's order is arbitrary


def plurality_posterior(noisy: Tensor, sigma: float, points: int = 801) -> Tensor:
    """(n, classes): the probability that each class holds the most votes, given noisy counts `noisy` (n, classes)
    that are the true counts plus noise of std sigma each, under a flat prior on the true counts. The release's
    discrete Gaussian is taken as the continuous N(0, sigma^2) it closely follows: post-processing either way.

    Soft targets from an answer: certain where the noisy winner leads by several sigmas, shared with the runner-up
    where the noise could have decided it (the members' second choice, often the class most like the first).
    P(class c wins) = E_t[prod_{j != c} Phi((noisy_c - noisy_j) / sigma + t)], t ~ N(0, 1), by quadrature on
    [-8, 8] (double precision), so the same noisy counts always give the same targets."""
    steps = torch.linspace(-8.0, 8.0, points, dtype=torch.float64)
    weights = torch.exp(-steps.square() / 2) * (steps[1] - steps[0]) / math.sqrt(2 * math.pi)
    posterior = []
    for chunk in noisy.double().split(64):
        gaps = (chunk[:, :, None] - chunk[:, None, :]) / sigma  # (n, c, j): how far c leads j, in sigmas
        log_below = torch.special.log_ndtr(gaps[..., None] + steps)  # (n, c, j, points): class j stays below c
        log_below = log_below.masked_fill(torch.eye(chunk.shape[1], dtype=torch.bool)[None, :, :, None], 0.0)
        posterior.append((log_below.sum(2).exp() * weights).sum(-1))
    posterior = torch.cat(posterior)
    return (posterior / posterior.sum(1, keepdim=True)).float()


def answer_targets(answers: Answers, config: PateConfig, sigma: float) -> Tensor:
    """What the student learns from the kept answers: class indices (n,) or, for "posterior" and "shares",
    probabilities (n, classes) (post-processing of the released votes)."""
    if config.answer_targets == "posterior":
        return plurality_posterior(answers.votes[answers.confident], sigma)
    if config.answer_targets == "shares":  # the control's exact votes: the members' distribution over the classes
        votes = answers.votes[answers.confident]
        return votes / votes.sum(1, keepdim=True)
    return answers.labels[answers.confident]


def train_student(split: PublicSplit, answers: Answers, config: PateConfig, num_classes: int, sigma: float,
                  progress: Progress | None = None) -> tuple[torch.nn.Module, list[dict]]:
    """Round 1 learns from the kept answers (`answer_targets`); each self-training round starts afresh from those
    answers plus the public images the previous student labels with at least `pseudo_label_confidence`
    (post-processing). With consistency training every round also learns from the whole public pool, unlabelled.
    Progress records carry "done", the units of `config.progress_total()` finished so far (the tangent-normal
    VAE's fitting, before the first round, is a phase of its own)."""
    images, labels = split.pool[answers.indices[answers.confident]], answer_targets(answers, config, sigma)
    if not len(labels):
        raise ConfigError("the vote margin kept no answer: lower --vote-margin or raise the budget")
    soft = labels.dim() == 2
    labelled = torch.zeros(len(split.pool), dtype=torch.bool)
    labelled[answers.indices[answers.confident]] = True
    student, history = None, []
    train_images, train_labels = images, labels
    work = config.progress_per_round()
    # the VAE and its triples are fitted to the pool once: every round learns from the same triples
    triples = (manifold_triples(split.pool, config.consistency_config(), progress)[0]
               if config.student_training == "tangent-normal" else None)
    for round_ in range(1, config.self_training_rounds + 2):
        if student is not None:  # self-training: add the public images the previous student is sure of
            unlabelled = split.pool[~labelled]
            if not len(unlabelled):  # every image of the pool was asked: nothing left to label
                break
            beliefs = probabilities(student, unlabelled, device=config.device)
            sure = beliefs.max(1).values >= config.pseudo_label_confidence
            guesses = beliefs.argmax(1)[sure]
            train_images = torch.cat([images, unlabelled[sure]])
            train_labels = torch.cat([labels, F.one_hot(guesses, num_classes).float() if soft else guesses])
        if config.student_training != "supervised":
            step_progress = None if progress is None else (
                lambda record, before=(round_ - 1) * work: progress({**record, "done": before + record["step"]}))
            student, training = train_consistency(train_images, train_labels, split.pool, split.x_eval, split.y_eval,
                                                  num_classes, config.consistency_config(), step_progress, triples)
        else:
            dataset = ImageDataset("pate-student", train_images, train_labels.argmax(1) if soft else train_labels,
                                   split.x_eval, split.y_eval, num_classes, split.description)
            student, training = train_classifier(dataset, config.supervised_config(),
                                                 in_phase(progress, f"student round {round_}"),
                                                 evaluate_each_epoch=False, targets=train_labels if soft else None)
        history.append({"round": round_, "examples": len(train_labels), "test_accuracy": training["test_accuracy"],
                        "wall_seconds": training["wall_seconds"]})
        if progress:
            progress({**history[-1], "done": round_ * work})
    return student, history


def answer_accuracy(answers: Answers, true_labels: Tensor | None) -> float | None:
    """How often the kept noisy answers name the true class (only when the pool's labels are known)."""
    if true_labels is None or not answers.confident.any():
        return None
    kept = answers.indices[answers.confident]
    return share_correct(answers.labels[answers.confident], true_labels[kept])


class PATE(Method):
    name = "pate"
    summary = "a teacher ensemble labels public images through noisy votes (GNMax); a student learns from them"
    needs = Needs.ENSEMBLE
    command = "pate"
    paper = "Papernot et al., Semi-supervised Knowledge Transfer (ICLR 2017) and Scalable Private Learning (ICLR 2018)"

    config_type: Any = PateConfig  # what config.json keeps under the method's name (DGD: its own)

    def plan(self, source: Source, config: PateConfig, out_dir: Path, progress: Progress | None) -> "PateJob":
        return PateJob(source.teacher, config, release_state(out_dir), progress)

    def config_record(self, source: Source, config: Any) -> dict[str, Any]:
        return {"teacher": str(source.teacher), self.name: config.to_dict()}

    def interrupted(self, out_dir: Path) -> tuple[Source, Any] | None:
        """Resumable once its answers are released: the run then continues from them."""
        saved = saved_config(out_dir)
        if saved is None or self.name not in saved or not (release_state(out_dir) / ANSWERS_FILE).exists():
            return None
        return Source(Path(saved["teacher"])), self.config_type.from_dict(saved[self.name])

    def markdown(self, report: dict[str, Any]) -> str:
        return pate_markdown(report)


class PateJob(Job):
    """PATE planned on an ensemble: one answer per query."""

    def __init__(self, teacher_dir: Path, config: PateConfig, state_dir: Path, progress: Progress | None,
                 public_pool: bool = True) -> None:
        if public_pool and config.sample_source is None and config.public_size is not None \
                and config.queries > config.public_size:  # before the teachers are read; a default pool: its split
            raise ConfigError(f"{config.queries} queries need at least as many public images; --public-size is "
                              f"{config.public_size}")
        self.ensemble, self.meta = read_teacher(teacher_dir)
        if not isinstance(self.ensemble, TeacherEnsemble):
            raise ConfigError(f"{teacher_dir} holds one teacher; PATE needs an ensemble on disjoint partitions "
                              f"(dpdistill train-teacher --partitions M)")
        self.in_shape, num_classes = tuple(self.meta["in_shape"]), int(self.meta["num_classes"])
        self.dataset_name = config.dataset or self.meta.get("dataset")
        if not self.dataset_name:
            raise ConfigError(f"the teachers in {teacher_dir} do not name their data set: give --dataset")
        self.evaluation = evaluation_set(self.dataset_name, self.in_shape, num_classes, saved_class_names(self.meta))
        self.class_names = model_class_names(self.meta, self.evaluation)  # the student's: the teachers' classes
        self.config = self.pate = config  # what the lifecycle saves; PATE's settings (DGD saves more)
        self.teacher_dir, self.state_dir, self.progress = teacher_dir, state_dir, progress
        self.source = None if config.sample_source is None else load_sample_source(
            Path(config.sample_source), self.in_shape, num_classes)
        if self.source is not None and config.queries > len(self.source.labels):
            raise ConfigError(f"{config.queries} queries need at least as many images; the sample source "
                              f"{self.source.path} holds {len(self.source.labels)}: lower --queries")
        cost = None if self.source is None or config.control else self.source.cost(config.epsilon, config.delta)
        self.privacy_plan = config.privacy_plan(len(self.ensemble), num_classes, cost)
        self.privacy_plan.refuse_near_random()
        self.ledger_dir = teacher_dir
        self.route = Release.of_plan(self.privacy_plan, config.queries)  # every query is answered
        self.planned = self.route if self.source is None else self.source.composed(self.route)
        self.partition: dict[str, Any] = {}  # what the partition assumes, for the report's privacy section
        self.uncovered = ((self.source.uncovered if self.source else [])
                          + partition_reads(self.partition, self.meta["ensemble"])
                          + reproducible_noise_read(config.reproducible_noise)
                          + ([EXACT_VOTES_READ] if config.control else []))
        # the images it asks about (None: a generator of the run's makes them) and the student's starting point: a
        # bad one is refused before any reservation
        self.split = (self.source.pool(self.evaluation) if self.source is not None
                      else config.public_split(self.evaluation) if public_pool else None)
        if self.split is not None:
            self._check_encoder(self.split)
        self.querying = False  # whether the answers' release began
        self.data_set = teacher_data_set(self.meta)  # whose ledger records the release too

    def asked(self) -> bool:
        return self.querying

    def _check_encoder(self, split: PublicSplit) -> None:
        """A student started from an encoder pretrained on another pool would be measured on images it saw."""
        config = self.pate
        if config.student_init is not None:
            load_encoder(Path(config.student_init), config.student_arch, self.evaluation.input_shape,
                         self.evaluation.num_classes, split.description)

    def run(self, resume: bool) -> Outcome:
        """Release (or reload) the answers, train the student."""
        config, plan, started = self.pate, self.privacy_plan, time.perf_counter()
        split = self.split
        if split is None:  # the run's own images, made by now
            split = self.source.pool(self.evaluation)
            self._check_encoder(split)
        num_classes = self.evaluation.num_classes
        answers_path = self.state_dir / ANSWERS_FILE
        if resume:
            answers = Answers.load(answers_path, config.queries)
        else:
            self.querying = True
            answers = release_answers(self.ensemble.to(config.device).eval(), split.pool, plan, config, num_classes,
                                      self.progress)
            self.state_dir.mkdir(parents=True, exist_ok=True)
            answers.save(answers_path)
        release_seconds = time.perf_counter() - started
        student, history = train_student(split, answers, config, num_classes, plan.sigma, self.progress)
        summary = {key: value for key, value in plan.summary(config.queries).items()
                   if not key.startswith("paper_epsilon") and key != "num_candidates"}  # no seed states a formula
        # mode data: one whole example, not only its label, changes one member's vote
        privacy = {**summary, **(CONTROL_PRIVACY if config.control else {"mode": "data"}),
                   "aggregation": f"the members' vote counts over all classes plus {VOTE_NOISE[config.vote_noise]} "
                                  f"(the histogram is released, its winner is the label)"
                                  + ("" if config.control else ", data-independent accounting"),
                   "unit": "one private training example (it changes one member's vote)",
                   "vote_margin": config.vote_margin,
                   "answer_targets": config.answer_targets,
                   "kept_answers": int(answers.confident.sum()),
                   "noise": noise_source(config.reproducible_noise).description}
        if self.source is not None:
            privacy = self.source.privacy(privacy, self.route)
        report = {"dataset": self.dataset_name, "teacher": str(self.teacher_dir), "public": split.description,
                  "accuracy": {"student": history[-1]["test_accuracy"],
                               "answers": answer_accuracy(answers, split.pool_labels)},
                  "timing": {"wall_seconds": time.perf_counter() - started, "release_seconds": release_seconds},
                  "history": history, "resumed": resume}

        def write_files(out_dir: Path, _report: dict[str, Any]) -> None:
            """The noisy answers are a release: keep them, and show how far each winner led (a public figure)."""
            shutil.copyfile(answers_path, out_dir / ANSWERS_FILE)
            if not config.control:
                save_vote_leads(answers.votes, plan.sigma, config.vote_margin, out_dir / ANSWERS_FIGURE)

        return Outcome(
            report=report, privacy={**privacy, **self.partition},
            covers=COVERS if self.source is None else SOURCE_COVERS,
            models={"student": (student, {**classifier_meta(config.student_arch, self.in_shape, self.class_names,
                                                            self.dataset_name, config.student_init),
                                          PUBLIC_POOL: dataclasses.asdict(split.source)})},  # it learnt from them
            private_record=lambda: {"accuracy": {"teacher": teacher_accuracy(
                self.ensemble, self.meta, self.evaluation, self.dataset_name, config.device)}},
            release=self.planned, write_files=write_files,
            confusion=confusion_counts(predict(student, split.x_eval, device=config.device), split.y_eval, num_classes))


def _configure(values: dict[str, Any]) -> PateConfig | None:
    """A fresh run's settings from the options; a resumed run's saved ones (None: nothing to resume, which the run
    then says)."""
    if values["resume"]:
        saved = PATE().interrupted(Path(values["out"]))
        return None if saved is None else saved[1]
    return PateConfig(**COMMAND.field_values(values))


def run_pate(teacher_dir: Path, config: PateConfig | None, out_dir: Path, resume: bool = False,
             progress: Progress | None = None, overwrite: bool = False) -> dict[str, Any]:
    """PATE on public images: the ensemble in `teacher_dir` labels public images through noisy votes, and a student
    learns from them. With `resume`, the run saved in `out_dir` continues from its released answers with its
    saved settings, without asking the ensemble again."""
    return execute(PATE(), Source(teacher_dir), None if resume else config, out_dir, resume, overwrite, progress)


def _progress_of(_values: dict[str, Any], config: PateConfig | None) -> tuple[int | None, str]:
    unit = "rounds" if config is None or config.student_training == "supervised" else "steps"
    return (None if config is None else config.progress_total()), f"pate student {unit}"


COMMAND = CommandSpec(
    name="pate", help="PATE: an ensemble labels public images by noisy votes. A student learns from the answers.",
    options=(Option("teacher", Path, help=ENSEMBLE_HELP, field=False),
             out_option("directory for student.safetensors, answers.safetensors, report.json and report.md"),
             *field_options(PateConfig, tuple(field.name for field in dataclasses.fields(PateConfig))),
             resume_option(RESUME_FROM_ANSWERS_HELP), OVERWRITE_OPTION),
    configure=_configure,
    run=lambda values, config, progress: run_pate(Path(values["teacher"]), config, Path(values["out"]),
                                                  values["resume"], progress, values["overwrite"]),
    progress_of=_progress_of, positional=("teacher", "out"),
    audits=(AuditRoute("pate", "PATE: the ensemble's noisy votes on public images teach a student",
                       {"teacher": "ensemble", "dataset": "data"}),))
