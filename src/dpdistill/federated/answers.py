"""What an owner's teachers answer about a round's queries, before the protocol's boundary and noise."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from dpdistill.federated.protocol import AnswerRejected, Wire, checked_answer, noisy_share
from dpdistill.models.ensemble import TeacherEnsemble, plurality_counts
from dpdistill.privacy.mechanisms import bounded_output_gradient
from dpdistill.privacy.randomness import noise_source
from dpdistill.training.annotation import DistillationGradient, as_members


@torch.inference_mode()
def member_logits(teacher: torch.nn.Module, images: Tensor) -> Tensor:
    """(members, n, classes): an ensemble's members, or a single teacher as an ensemble of one."""
    if isinstance(teacher, TeacherEnsemble):
        return teacher.member_logits(images)
    return as_members(teacher(images))


def raw_answer(teacher: torch.nn.Module, arrays: list[np.ndarray], wire: Wire) -> Tensor:
    """The owner's answer rows (n, classes) in the wire's units: vote counts of its members (PATE), or the sum of
    its members' bounded distillation gradients with respect to the student's logits (FedDPSD)."""
    images = torch.from_numpy(np.asarray(arrays[0], dtype=np.float32))
    if tuple(images.shape[1:]) != wire.in_shape:
        raise AnswerRejected(f"queries of shape {tuple(images.shape[1:])}, the owner's teachers take {wire.in_shape}")
    logits = member_logits(teacher, images)
    if not torch.isfinite(logits).all():
        raise AnswerRejected("the owner's teachers gave a non-finite logit")
    if wire.method == "pate":
        return plurality_counts(logits, wire.num_classes)
    settings = dict(wire.gradient or {})
    student = torch.from_numpy(np.asarray(arrays[1], dtype=np.float32))
    members, rows, classes = logits.shape
    gradient = DistillationGradient(settings["loss"], settings["dkd_alpha"], settings["dkd_beta"],
                                    settings["temperature"])
    gradients = gradient(logits.reshape(-1, classes), student.repeat(members, 1))
    bounded = bounded_output_gradient(gradients, settings["beta"], settings["top_k"], settings["operation"])
    return bounded.view(members, rows, classes).sum(0)


def owner_answer(teacher: torch.nn.Module, arrays: list[np.ndarray], wire_json: dict[str, Any]) -> np.ndarray:
    """The owner's contribution to the round's secure sum: checked, on the integer grid, with its noise share."""
    wire = Wire.from_json(wire_json)
    answer = checked_answer(raw_answer(teacher, arrays, wire), len(arrays[0]), wire)
    return noisy_share(answer, wire, noise_source())
