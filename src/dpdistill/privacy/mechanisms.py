"""Privacy mechanisms applied to teacher answers.

Each mechanism is a pure function of the private answer and a torch.Generator, so the noise is reproducible
from a seed and a run can be resumed with the same random stream. Accounting lives in `accounting.py`: a
mechanism here only describes itself through a `QuerySpec` that the accountant understands.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dpdistill.errors import PrivacyParameterError


def top_k_mask(values: Tensor, k: int) -> Tensor:
    """Boolean mask of the k largest-magnitude entries of each row (the papers' operator M_k)."""
    if not 1 <= k <= values.shape[-1]:
        raise PrivacyParameterError(f"top-k must be in [1, {values.shape[-1]}], got {k}")
    indices = values.abs().topk(k, dim=-1).indices
    return torch.zeros_like(values, dtype=torch.bool).scatter_(-1, indices, True)


def normalize_rows(values: Tensor, bound: float, stability: float = 1e-4) -> Tensor:
    """Scale each row to norm just under `bound`: bound * g / (||g|| + h).

    Unlike clipping, small gradients are scaled up too, which keeps their relative direction while bounding
    every answer's L2 norm by `bound` (sensitivity 2 * bound between any two teachers). The scale carries a
    1e-6 relative margin so that float32 rounding cannot push a norm over the bound the accountant assumes.
    """
    norms = values.norm(dim=-1, keepdim=True)
    return values * (bound * (1 - 1e-6) / (norms + stability))


def clip_rows(values: Tensor, bound: float) -> Tensor:
    """Classic clipping: rows with norm above `bound` are scaled down to it, others are left as they are."""
    norms = values.norm(dim=-1, keepdim=True)
    return values * torch.clamp(bound * (1 - 1e-6) / (norms + 1e-12), max=1.0)


def bounded_output_gradient(
    gradients: Tensor, bound: float, top_k: int | None, operation: str = "normalize", stability: float = 1e-4
) -> Tensor:
    """The deterministic part of the data-sensitive answer: optional top-k masking, then normalize or clip."""
    if bound <= 0:
        raise PrivacyParameterError(f"the norm bound beta must be positive, got {bound}")
    if top_k is not None:
        gradients = gradients * top_k_mask(gradients, top_k)
    if operation == "normalize":
        return normalize_rows(gradients, bound, stability)
    if operation == "clip":
        return clip_rows(gradients, bound)
    raise PrivacyParameterError(f"unknown gradient operation {operation!r}: choose normalize or clip")


def gaussian_noise(shape: torch.Size | tuple[int, ...], std: float, generator: torch.Generator, device: torch.device | str = "cpu") -> Tensor:
    """Isotropic Gaussian noise drawn on the CPU stream (reproducible on any device), then moved."""
    noise = torch.randn(shape, generator=generator) * std
    return noise.to(device)


def randomized_response_probabilities(epsilon0: float, num_candidates: int) -> tuple[float, float]:
    """(probability of the true answer, probability of each other candidate) of k-ary randomized response."""
    if epsilon0 <= 0 or not math.isfinite(epsilon0):
        raise PrivacyParameterError(f"randomized-response epsilon must be positive and finite, got {epsilon0}")
    if num_candidates < 2:
        raise PrivacyParameterError(f"randomized response needs at least 2 candidates, got {num_candidates}")
    denominator = math.exp(epsilon0) + num_candidates - 1
    return math.exp(epsilon0) / denominator, 1.0 / denominator


def selective_randomized_response(
    true_labels: Tensor, candidates: Tensor, epsilon0: float, generator: torch.Generator
) -> Tensor:
    """Randomized response restricted to a per-sample candidate set (DPSD Eq. 5, DP-DFD's SRR).

    `candidates` is (n, k): class indices chosen from public information (the student's prediction). When the
    true label is a candidate, it is kept with probability e^eps0 / (e^eps0 + k - 1) and each other candidate
    is returned with 1 / (e^eps0 + k - 1); otherwise a candidate is drawn uniformly. The uniform draw is a
    mixture of the randomized-response outputs, so every pair of outputs is bounded by k-ary randomized
    response with eps0: that is the accounting unit.
    """
    n, k = candidates.shape
    p_true, p_other = randomized_response_probabilities(epsilon0, k)
    is_true = candidates == true_labels.unsqueeze(1)
    hit = is_true.any(dim=1, keepdim=True)
    weights = torch.where(is_true, p_true, p_other)
    weights = torch.where(hit, weights, torch.full_like(weights, 1.0 / k))
    choice = torch.multinomial(weights.cpu(), 1, generator=generator).to(candidates.device)
    return candidates.gather(1, choice).squeeze(1)
