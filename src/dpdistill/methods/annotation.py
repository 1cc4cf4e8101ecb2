"""Differentially private annotation: how the teacher's knowledge reaches the student.

An annotator receives the teacher's and the student's logits on a batch of synthetic images and returns soft
targets for the student. Everything the teacher contributes passes through a privacy mechanism, and every
answer is charged to the ledger before it is computed. Methods share these annotators and differ in settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from dpdistill.losses.distillation import dkd_loss, kd_loss
from dpdistill.privacy.accounting import PrivacyLedger
from dpdistill.privacy.mechanisms import bounded_output_gradient, gaussian_noise, selective_randomized_response


class Annotator(Protocol):
    def annotate(self, teacher_logits: Tensor, student_logits: Tensor) -> Tensor:
        """Soft targets (n, classes) for the student; rows sum to 1."""


@dataclass
class DistillationGradient:
    """The per-sample gradient of a distillation loss with respect to the student's logits."""

    loss: str = "dkd"  # "dkd" or "kd"
    dkd_alpha: float = 1.0
    dkd_beta: float = 8.0
    temperature: float = 1.0

    def __call__(self, teacher_logits: Tensor, student_logits: Tensor) -> Tensor:
        student = student_logits.detach().requires_grad_(True)
        with torch.enable_grad():
            if self.loss == "dkd":
                per_sample = dkd_loss(student, teacher_logits, teacher_logits.argmax(1), self.dkd_alpha,
                                      self.dkd_beta, self.temperature)
            else:
                per_sample = kd_loss(student, teacher_logits, self.temperature)
            (gradient,) = torch.autograd.grad(per_sample.sum(), student)
        return gradient


@dataclass
class OutputGradientAnnotator:
    """Data-sensitive annotation (DPSD Eq. 3, DPDFD): bounded output gradient + Gaussian noise.

    y_i = softmax(z_i - step * (bound(g_i) + N(0, (sigma * beta)^2 I))) where z_i are the student's logits.
    """

    gradient: DistillationGradient
    ledger: PrivacyLedger
    beta: float
    sigma: float
    top_k: int | None
    step: float
    generator: torch.Generator
    operation: str = "normalize"

    def annotate(self, teacher_logits: Tensor, student_logits: Tensor) -> Tensor:
        self.ledger.charge(len(teacher_logits))
        bounded = bounded_output_gradient(self.gradient(teacher_logits, student_logits), self.beta, self.top_k,
                                          self.operation)
        noisy = bounded + gaussian_noise(bounded.shape, self.sigma * self.beta, self.generator, bounded.device)
        return F.softmax(student_logits.detach() - self.step * noisy, dim=1)


@dataclass
class RandomizedResponseAnnotator:
    """Label-sensitive annotation (DPSD Eq. 5, DP-DFD's SRR): randomized response over the student's top-k."""

    ledger: PrivacyLedger
    epsilon0: float
    top_k: int
    generator: torch.Generator

    def annotate(self, teacher_logits: Tensor, student_logits: Tensor) -> Tensor:
        self.ledger.charge(len(teacher_logits))
        candidates = student_logits.detach().topk(self.top_k, dim=1).indices
        labels = selective_randomized_response(teacher_logits.argmax(1), candidates, self.epsilon0, self.generator)
        return F.one_hot(labels, teacher_logits.shape[1]).float()


@dataclass
class TeacherAnnotator:
    """No protection: the teacher's softened prediction (the non-private upper bound)."""

    temperature: float = 1.0

    def annotate(self, teacher_logits: Tensor, student_logits: Tensor) -> Tensor:
        return F.softmax(teacher_logits / self.temperature, dim=1)
