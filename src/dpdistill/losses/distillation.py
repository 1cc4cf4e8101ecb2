"""Distillation losses between teacher and student outputs, per sample (no batch reduction).

Per-sample losses matter: the data-sensitive mechanisms differentiate them with respect to each sample's
student logits, and each sample's gradient is one private answer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def kd_loss(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Hinton's KD: KL(teacher || student) on tempered softmaxes, scaled by T^2, per sample."""
    log_student = F.log_softmax(student_logits / temperature, dim=1)
    log_teacher = F.log_softmax(teacher_logits / temperature, dim=1)
    return (log_teacher.exp() * (log_teacher - log_student)).sum(dim=1) * temperature**2


def dkd_loss(student_logits: Tensor, teacher_logits: Tensor, target: Tensor, alpha: float = 1.0,
             beta: float = 8.0, temperature: float = 1.0) -> Tensor:
    """Decoupled KD (Zhao et al. 2022): alpha * target-class KD + beta * non-target-class KD, per sample.

    The target-class term compares the binary (target, rest) probabilities; the non-target term compares the
    distributions over the other classes, renormalised. DPSD uses beta (its lambda) = 8 and the teacher's
    argmax as target.
    """
    target_mask = F.one_hot(target, student_logits.shape[1]).bool()
    p_student = F.softmax(student_logits / temperature, dim=1)
    p_teacher = F.softmax(teacher_logits / temperature, dim=1)
    binary_student = torch.stack([p_student[target_mask], (p_student.masked_fill(target_mask, 0)).sum(1)], dim=1)
    binary_teacher = torch.stack([p_teacher[target_mask], (p_teacher.masked_fill(target_mask, 0)).sum(1)], dim=1)
    eps = 1e-8
    target_term = (binary_teacher * (torch.log(binary_teacher + eps) - torch.log(binary_student + eps))).sum(1)
    # Non-target distributions: push the target logit to -inf so the softmax renormalises over the rest.
    log_student_rest = F.log_softmax(student_logits / temperature - 1000.0 * target_mask, dim=1)
    log_teacher_rest = F.log_softmax(teacher_logits / temperature - 1000.0 * target_mask, dim=1)
    non_target_term = (log_teacher_rest.exp() * (log_teacher_rest - log_student_rest)).masked_fill(target_mask, 0).sum(1)
    return (alpha * target_term + beta * non_target_term) * temperature**2


def probability_loss(student_probabilities: Tensor, teacher_logits: Tensor, loss: str = "dkd", alpha: float = 1.0,
                     beta: float = 8.0, temperature: float = 1.0) -> Tensor:
    """KD or DKD per sample as a function of the student's class probabilities taken as free variables: DPSD's Eq. 2
    writes its loss in p = Phi(x) and Eq. 3 differentiates it with respect to them, so its gradient is not the one
    with respect to the logits (which `kd_loss` and `dkd_loss` give). DKD's target term compares (p_r, 1 - p_r), its
    non-target term the other classes renormalised by 1 - p_r (Zhao et al. 2022; DPSD's own formula writes the
    renormaliser with j for r, as it drops r from its target term: read as typesetting, see docs/methods/dpsd.md)."""
    eps = 1e-8
    teacher = F.softmax(teacher_logits / temperature, dim=1)
    if loss == "kd":
        divergence = teacher * (torch.log(teacher + eps) - torch.log(student_probabilities + eps))
        return divergence.sum(1) * temperature**2
    target_mask = F.one_hot(teacher_logits.argmax(1), teacher.shape[1]).bool()
    student_target, teacher_target = student_probabilities[target_mask], teacher[target_mask]
    target_term = (teacher_target * (torch.log(teacher_target + eps) - torch.log(student_target + eps))
                   + (1 - teacher_target) * (torch.log(1 - teacher_target + eps) - torch.log(1 - student_target + eps)))
    student_rest = student_probabilities.masked_fill(target_mask, 0) / (1 - student_target + eps).unsqueeze(1)
    teacher_rest = teacher.masked_fill(target_mask, 0) / (1 - teacher_target + eps).unsqueeze(1)
    non_target_term = (teacher_rest * (torch.log(teacher_rest + eps) - torch.log(student_rest + eps))).sum(1)
    return (alpha * target_term + beta * non_target_term) * temperature**2


def soft_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy against soft targets (rows of probabilities), per sample."""
    return -(targets * F.log_softmax(logits, dim=1)).sum(dim=1)


def inverse_class_frequency(targets: Tensor) -> Tensor:
    """Per-sample weights 1 / (count of the sample's target class in the batch), normalised to mean 1.

    Data-free generators tend to produce images the teacher puts in one class; without reweighting, the student
    learns that class everywhere. The weights depend only on the (already privatised) targets.
    """
    classes = targets.argmax(dim=1)
    counts = torch.bincount(classes, minlength=targets.shape[1]).float()
    weights = 1.0 / counts[classes]
    return weights / weights.mean()
