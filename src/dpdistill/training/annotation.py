"""Differentially private annotation: how the teacher's knowledge reaches the student.

An annotator receives the teacher's and the student's logits on a batch of synthetic images and returns soft
targets for the student. Everything the teacher contributes passes through a privacy mechanism, and every
answer is charged to the ledger before it is computed, and every draw comes from a `NoiseSource` (secret unless
a debugging run asks otherwise). Methods share these annotators and differ in settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from dpdistill.errors import ConfigError
from dpdistill.losses.distillation import dkd_loss, kd_loss, probability_loss
from dpdistill.privacy.accounting import PrivacyLedger
from dpdistill.privacy.mechanisms import bounded_output_gradient, noisy_votes, selective_randomized_response
from dpdistill.privacy.randomness import NoiseSource


class Annotator(Protocol):
    def annotate(self, teacher_logits: Tensor, student_logits: Tensor) -> Tensor:
        """Soft targets (n, classes) for the student; rows sum to 1, or are all zero where the mechanism declined
        to label a sample (its noisy answer was too uncertain). `teacher_logits` is (n, classes) for one teacher
        or (members, n, classes) for an ensemble."""


class RemoteAnnotator(Protocol):
    def annotate(self, images: Tensor, student_logits: Tensor, ledger: PrivacyLedger) -> Tensor:
        """Soft targets as `Annotator`'s, from teachers held elsewhere that see only the images and the
        student's logits; the answers are charged to `ledger` before they are asked."""


OUTPUT_SPACES = ("logits", "probabilities")  # what the answer's gradient is taken with respect to, and moves


def gradient_targets(student_logits: Tensor, noisy_sum: Tensor, step: float, count: int,
                     space: str = "logits") -> Tensor:
    """DPSD Eq. 3's targets: the student's output moved against the mean of `count` teachers' noisy bounded
    gradients (their noisy sum divided by `count`). In "logits" the logits are moved and the target is their softmax;
    in "probabilities" (Eq. 3 as written: Phi_s is the student's prediction p) the prediction itself is moved, so a
    target may leave the simplex by the step (the cross-entropy of Eq. 7 takes it as it is)."""
    moved = step * noisy_sum / count
    if space == "probabilities":
        return F.softmax(student_logits.detach(), dim=1) - moved
    return F.softmax(student_logits.detach() - moved, dim=1)


def as_members(teacher_logits: Tensor) -> Tensor:
    """Teacher answers as (members, n, classes): a single teacher is an ensemble of one."""
    return teacher_logits if teacher_logits.dim() == 3 else teacher_logits.unsqueeze(0)


@dataclass
class DistillationGradient:
    """The per-sample gradient of a distillation loss with respect to the student's logits, or (`space`
    "probabilities") to its class probabilities at the temperature."""

    loss: str = "dkd"  # "dkd" or "kd"
    dkd_alpha: float = 1.0
    dkd_beta: float = 8.0
    temperature: float = 1.0
    space: str = "logits"

    def __post_init__(self) -> None:
        if self.space not in OUTPUT_SPACES:  # an owner refuses a wire stating another, before computing anything
            raise ConfigError(f"unknown output space {self.space!r}: choose {' or '.join(OUTPUT_SPACES)}")

    def __call__(self, teacher_logits: Tensor, student_logits: Tensor) -> Tensor:
        if self.space == "probabilities":
            student = F.softmax(student_logits.detach() / self.temperature, dim=1).requires_grad_(True)
            with torch.enable_grad():
                per_sample = probability_loss(student, teacher_logits, self.loss, self.dkd_alpha, self.dkd_beta,
                                              self.temperature)
                (gradient,) = torch.autograd.grad(per_sample.sum(), student)
            return gradient
        student = student_logits.detach().requires_grad_(True)
        with torch.enable_grad():
            if self.loss == "dkd":
                per_sample = dkd_loss(student, teacher_logits, teacher_logits.argmax(1), self.dkd_alpha,
                                      self.dkd_beta, self.temperature)
            else:
                per_sample = kd_loss(student, teacher_logits, self.temperature)
            (gradient,) = torch.autograd.grad(per_sample.sum(), student)
        return gradient


@dataclass(frozen=True)
class CandidateSet:
    """Which classes a label answer may name, chosen from the student's prediction (public: post-processing).

    DPSD takes the student's top k; DP-DFD's SRR takes every class the student gives more than `threshold`
    probability, at least two. From an untrained student the threshold rule offers every class, so the teacher's
    class is among the candidates; a top-3 rule misses it 70% of the time, and then the answer is a uniform draw
    from the student's own guesses.
    """

    top_k: int
    threshold: float | None = None

    def __call__(self, student_logits: Tensor) -> Tensor:
        """(n, classes) boolean mask of candidates."""
        logits = student_logits.detach()
        if self.threshold is None:
            return _mask_of(logits.topk(self.top_k, dim=1).indices, logits)
        mask = F.softmax(logits, dim=1) > self.threshold
        return mask | _mask_of(logits.topk(2, dim=1).indices, logits)


def _mask_of(indices: Tensor, like: Tensor) -> Tensor:
    return torch.zeros_like(like, dtype=torch.bool).scatter_(1, indices, True)


@dataclass
class OutputGradientAnnotator:
    """Data-sensitive annotation (DPSD Eq. 3, DPDFD): bounded output gradient + Gaussian noise.

    y_i = softmax(z_i - step * (bound(g_i) + N(0, (sigma * beta)^2 I))) where z_i are the student's logits, or with
    the gradient in probability space y_i = p_i - step * (...) (`gradient.space`, `gradient_targets`).
    An ensemble's M bounded gradients are summed before the one noise draw and the sum divided by M (FedDPSD,
    DPDFD's multi-teacher extension): one example changes one member, so the sensitivity stays 2 * beta.
    """

    gradient: DistillationGradient
    ledger: PrivacyLedger
    beta: float
    sigma: float
    top_k: int | None
    step: float
    noise: NoiseSource
    operation: str = "normalize"

    def annotate(self, teacher_logits: Tensor, student_logits: Tensor) -> Tensor:
        members = as_members(teacher_logits)
        count, samples, classes = members.shape
        self.ledger.charge(samples)
        gradients = self.gradient(members.reshape(-1, classes), student_logits.repeat(count, 1))
        bounded = bounded_output_gradient(gradients, self.beta, self.top_k, self.operation).view(members.shape).sum(0)
        noisy = bounded + self.noise.normal(bounded.shape, self.sigma * self.beta, bounded.device)
        return gradient_targets(student_logits, noisy, self.step, count, self.gradient.space)


@dataclass
class RandomizedResponseAnnotator:
    """Label-sensitive annotation (DPSD Eq. 5, DP-DFD's SRR): randomized response over the student's top-k."""

    ledger: PrivacyLedger
    epsilon0: float
    candidates: CandidateSet
    noise: NoiseSource

    def annotate(self, teacher_logits: Tensor, student_logits: Tensor) -> Tensor:
        if teacher_logits.dim() == 3:
            raise ValueError("randomized response answers for one teacher; an ensemble's labels go through "
                             "NoisyVoteAnnotator")
        self.ledger.charge(len(teacher_logits))
        labels = selective_randomized_response(teacher_logits.argmax(1), self.candidates(student_logits),
                                               self.epsilon0, self.noise)
        return F.one_hot(labels, teacher_logits.shape[1]).float()


@dataclass
class NoisyVoteAnnotator:
    """Label-sensitive annotation for an ensemble: each member votes its top class, and the label is the noisy
    plurality among the student's top-k (GNMax over the candidates; one example changes one vote).

    With `min_margin` > 0 a sample whose noisy winner leads the runner-up by less than `min_margin` votes gets no
    label (a row of zeros): PATE's confident answers, read from the same noisy counts, so free of privacy cost.
    The query is still charged: the counts were released.
    """

    ledger: PrivacyLedger
    sigma: float
    candidates: CandidateSet
    noise: NoiseSource
    min_margin: float = 0.0

    def annotate(self, teacher_logits: Tensor, student_logits: Tensor) -> Tensor:
        members = as_members(teacher_logits)
        classes = members.shape[-1]
        self.ledger.charge(members.shape[1])
        votes = F.one_hot(members.argmax(-1), classes).sum(0)
        leaders = noisy_votes(votes, self.candidates(student_logits), self.sigma, self.noise).topk(2, dim=1)
        confident = leaders.values[:, 0] - leaders.values[:, 1] >= self.min_margin
        return F.one_hot(leaders.indices[:, 0], classes).float() * confident.unsqueeze(1)


@dataclass
class TeacherAnnotator:
    """No protection: the teacher's softened prediction (an ensemble's: the members' mean), the upper bound."""

    temperature: float = 1.0

    def annotate(self, teacher_logits: Tensor, student_logits: Tensor) -> Tensor:
        return F.softmax(as_members(teacher_logits) / self.temperature, dim=-1).mean(0)
