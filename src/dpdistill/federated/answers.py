"""What an owner's teachers answer about a round's queries: their vote counts, before the protocol's boundary and
noise."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from dpdistill.federated.protocol import AnswerRejected, Wire, checked_answer, noisy_share
from dpdistill.models.ensemble import TeacherEnsemble, plurality_counts
from dpdistill.privacy.randomness import noise_source


@torch.inference_mode()
def vote_counts(teacher: torch.nn.Module, images: Tensor, num_classes: int) -> Tensor:
    """(n, classes): how many of the owner's members name each class (a single teacher is an ensemble of one)."""
    logits = teacher.member_logits(images) if isinstance(teacher, TeacherEnsemble) else teacher(images)[None]
    if not torch.isfinite(logits).all():
        raise AnswerRejected("the owner's teachers gave a non-finite logit")
    return plurality_counts(logits, num_classes)


def owner_answer(teacher: torch.nn.Module, arrays: list[np.ndarray], wire_json: dict[str, Any]) -> np.ndarray:
    """The owner's contribution to the round's secure sum: checked, with its noise share."""
    wire = Wire.from_json(wire_json)
    images = torch.from_numpy(np.asarray(arrays[0], dtype=np.float32))
    if tuple(images.shape[1:]) != wire.in_shape:
        raise AnswerRejected(f"queries of shape {tuple(images.shape[1:])}, the owner's teachers take {wire.in_shape}")
    answer = checked_answer(vote_counts(teacher, images, wire.num_classes), len(images), wire)
    return noisy_share(answer, wire, noise_source())
