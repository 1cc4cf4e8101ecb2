"""What an owner's teachers answer about a round's queries, before the protocol's boundary and noise: their vote
counts (PATE) or their bounded distillation gradients at the student's logits (FedDPSD)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dpdistill.federated.protocol import (GRID_STEPS, AnswerRejected, GradientAnswer, Owner, SecAggSettings, Wire,
                                          accept, admit, checked_answer, noisy_share)
from dpdistill.models.ensemble import TeacherEnsemble, plurality_counts
from dpdistill.privacy.mechanisms import bounded_output_gradient
from dpdistill.privacy.randomness import noise_source
from dpdistill.training.annotation import DistillationGradient


@torch.no_grad()
def member_logits(teacher: torch.nn.Module, images: Tensor) -> Tensor:
    """(members, n, classes): each of the owner's members' logits (a single teacher is an ensemble of one)."""
    logits = teacher.member_logits(images) if isinstance(teacher, TeacherEnsemble) else teacher(images)[None]
    if not torch.isfinite(logits).all():
        raise AnswerRejected("the owner's teachers gave a non-finite logit")
    return logits


def vote_counts(teacher: torch.nn.Module, images: Tensor, num_classes: int) -> Tensor:
    """(n, classes): how many of the owner's members name each class."""
    return plurality_counts(member_logits(teacher, images), num_classes)


def bounded_gradients(teacher: torch.nn.Module, images: Tensor, student_logits: Tensor,
                      answer: GradientAnswer) -> Tensor:
    """(n, classes): the sum over the owner's members of each one's bounded gradient, in grid units."""
    logits = member_logits(teacher, images)
    members, rows, classes = logits.shape
    gradient = DistillationGradient(answer.loss, answer.dkd_alpha, answer.dkd_beta, answer.temperature, answer.space)
    per_member = gradient(logits.reshape(-1, classes), student_logits.repeat(members, 1))
    bounded = bounded_output_gradient(per_member, GRID_STEPS, answer.top_k, answer.operation)
    return bounded.view(members, rows, classes).sum(0)


def owner_of(teacher: torch.nn.Module, meta: dict[str, Any], delta: float) -> Owner:
    """The owner as its teachers describe it (`meta`: their saved description; a single teacher is one member),
    stating its epsilon at `delta`."""
    members = len(teacher) if isinstance(teacher, TeacherEnsemble) else 1
    return Owner(int(meta["num_classes"]), tuple(meta["in_shape"]), members, delta)


def owner_answer(owner_dir: Path, teacher: torch.nn.Module, owner: Owner, secagg: SecAggSettings | None,
                 arrays: list[np.ndarray], wire_json: dict[str, Any]) -> np.ndarray:
    """The owner's contribution to the round's secure sum (run with `secagg`), on the owner's own terms (`accept`):
    charged to the owner's ledger, checked, with its noise share. `arrays` holds the query images, and for
    gradients the student's logits on them."""
    wire = accept(owner_dir, Wire.from_json(wire_json), owner, secagg)
    images = torch.from_numpy(np.asarray(arrays[0], dtype=np.float32))
    if tuple(images.shape[1:]) != wire.in_shape:
        raise AnswerRejected(f"queries of shape {tuple(images.shape[1:])}, the owner's teachers take {wire.in_shape}")
    if wire.gradient is None:
        answer = vote_counts(teacher, images, wire.num_classes)
    else:
        student_logits = torch.from_numpy(np.asarray(arrays[1], dtype=np.float32))
        if tuple(student_logits.shape) != (len(images), wire.num_classes) or not torch.isfinite(student_logits).all():
            raise AnswerRejected(f"student logits of shape {tuple(student_logits.shape)} for {len(images)} queries "
                                 f"of {wire.num_classes} classes, or not finite")
        answer = bounded_gradients(teacher, images, student_logits, wire.gradient)
    checked = checked_answer(answer, len(images), wire)
    admit(owner_dir, wire, len(images))
    return noisy_share(checked, wire, noise_source())
