"""Privacy mechanisms applied to teacher answers.

Every random draw of a mechanism comes from a `NoiseSource` (`randomness.py`): secret bits from the operating
system unless a debugging run asks for reproducible ones, never from `--seed`, so no one can regenerate the
noise and subtract it. Accounting lives in `accounting.py`: a mechanism here only describes itself through a
`QuerySpec` that the accountant understands.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dpdistill.errors import PrivacyParameterError
from dpdistill.privacy.randomness import NoiseSource


def _check_top_k(values: Tensor, k: int) -> None:
    if not 1 <= k <= values.shape[-1]:
        raise PrivacyParameterError(f"top-k must be in [1, {values.shape[-1]}], got {k}")


def top_k_mask(values: Tensor, k: int) -> Tensor:
    """Boolean mask of the k largest-magnitude entries of each row (the papers' operator M_k)."""
    _check_top_k(values, k)
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


def top_k_stochastic_signs(gradients: Tensor, k: int, clip: float, generator: torch.Generator | None = None) -> Tensor:
    """DataLens' TopkStoSignGrad on each row (a teacher's gradient for one sample): the k largest-magnitude entries,
    clipped to [-clip, clip] and divided by the largest of them, become +1 with probability (1 + g) / 2 and -1
    otherwise (an unbiased sign); every other entry is 0.

    Whatever the gradients and the coin flips, a row has exactly k entries of magnitude 1 (L2 norm sqrt(k)), so
    two teachers' rows differ by at most 2 sqrt(k): the sensitivity TopAgg's Gaussian noise is calibrated to does
    not rest on the flips, which therefore need not be secret (`generator` may be seeded).
    """
    if clip <= 0:
        raise PrivacyParameterError(f"the gradient clipping bound must be positive, got {clip}")
    _check_top_k(gradients, k)
    kept, indices = gradients.abs().topk(k, dim=-1, sorted=False)  # unsorted: twice as fast
    values = gradients.gather(-1, indices).clamp(-clip, clip)
    scale = kept.amax(-1, keepdim=True).clamp(max=clip).clamp(min=torch.finfo(gradients.dtype).tiny)
    up = torch.rand(values.shape, generator=generator, device=values.device) < (1 + values / scale) / 2
    signs = up.to(gradients.dtype) * 2 - 1
    return torch.zeros_like(gradients).scatter_(-1, indices, signs)


def thresholded_noisy_votes(votes: Tensor, sigma: float, threshold: float, noise: NoiseSource) -> Tensor:
    """TopAgg's release: the teachers' summed sign votes plus N(0, sigma^2) on each coordinate (the Gaussian
    mechanism; one teacher's votes move the sum by at most 2 sqrt(k)), then, as post-processing, +1 where the noisy
    sum reaches `threshold`, -1 where it reaches -`threshold`, 0 elsewhere."""
    if not sigma > 0 or not math.isfinite(sigma):
        raise PrivacyParameterError(f"the vote noise sigma must be positive and finite, got {sigma}")
    return threshold_votes(votes + noise.normal(votes.shape, sigma, votes.device), threshold)


def threshold_votes(votes: Tensor, threshold: float) -> Tensor:
    """+1 where the summed votes reach `threshold`, -1 where they reach -`threshold`, 0 elsewhere: TopAgg's
    post-processing, and on its own (no noise) the control's release, which guarantees nothing."""
    return (votes >= threshold).to(votes.dtype) - (votes <= -threshold).to(votes.dtype)


def randomized_response_probabilities(epsilon0: float, num_candidates: int | Tensor) -> tuple[float | Tensor, float | Tensor]:
    """(probability of the true answer, probability of each other candidate) of k-ary randomized response,
    e^eps0 / (e^eps0 + k - 1) and 1 / (e^eps0 + k - 1), for one k or a tensor of them. Computed with e^-eps0,
    so a large eps0 does not overflow."""
    if epsilon0 <= 0 or not math.isfinite(epsilon0):
        raise PrivacyParameterError(f"randomized-response epsilon must be positive and finite, got {epsilon0}")
    if (torch.as_tensor(num_candidates) < 2).any():
        raise PrivacyParameterError(f"randomized response needs at least 2 candidates, got {num_candidates}")
    other = math.exp(-epsilon0)  # each other candidate's weight relative to the true answer's
    denominator = 1 + (num_candidates - 1) * other
    return 1 / denominator, other / denominator


def selective_randomized_response(true_labels: Tensor, candidates: Tensor, epsilon0: float, noise: NoiseSource) -> Tensor:
    """Randomized response restricted to a per-sample candidate set (DPSD Eq. 5, DP-DFD's SRR).

    `candidates` is an (n, classes) boolean mask chosen from public information (the student's prediction), with
    k_i >= 2 candidates in row i. When the true label is a candidate, it is kept with probability
    e^eps0 / (e^eps0 + k_i - 1) and each other candidate is returned with 1 / (e^eps0 + k_i - 1); otherwise a
    candidate is drawn uniformly. The uniform draw is a mixture of the randomized-response outputs, so every pair
    of outputs is bounded by k_i-ary randomized response with eps0, itself bounded by binary randomized response
    with eps0 (the worst case): that is the accounting unit.
    """
    counts = candidates.sum(dim=1, keepdim=True)
    if (counts < 2).any():
        raise PrivacyParameterError("selective randomized response needs at least 2 candidates per sample")
    p_true, p_other = randomized_response_probabilities(epsilon0, counts)
    classes = torch.arange(candidates.shape[1], device=candidates.device)
    is_true = candidates & (classes == true_labels.unsqueeze(1))
    hit = is_true.any(dim=1, keepdim=True)
    weights = torch.where(is_true, p_true, p_other) * candidates
    weights = torch.where(hit, weights, candidates / counts)
    return noise.categorical(weights)


def noisy_votes(votes: Tensor, candidates: Tensor, sigma: float, noise: NoiseSource, laplace: bool = False) -> Tensor:
    """PATE's GNMax release restricted to a candidate set: vote counts + exact discrete Gaussian noise N_Z(0, sigma^2)
    (or, with `laplace`, LNMax's exact discrete Laplace of scale `sigma`, an integer), as float with non-candidates
    at -inf.

    `votes` is (n, classes) integer counts of an ensemble's members; `candidates` an (n, classes) boolean mask from
    public information. One private example changes one member's vote, moving two counts by one (accounted by
    `DiscreteGaussianQuery` or `DiscreteLaplaceQuery`). Integer noise on integer counts leaves no floating-point
    trace of the true counts. The label is the argmax; anything else read from the noisy counts (how far ahead it
    is) is post-processing.
    """
    if not sigma > 0:
        raise PrivacyParameterError(f"the vote noise sigma must be positive, got {sigma}")
    if votes.is_floating_point() and not torch.equal(votes, votes.round()):
        raise PrivacyParameterError("vote counts must be integers: the discrete noise protects integer answers")
    drawn = noise.discrete_laplace(votes.shape, sigma) if laplace else noise.discrete_gaussian(votes.shape, sigma)
    noisy = votes.long() + drawn.to(votes.device)
    return noisy.float().masked_fill(~candidates, -math.inf)
