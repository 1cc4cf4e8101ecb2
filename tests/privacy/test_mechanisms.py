"""Statistical checks of the mechanisms: bounds hold, vote noise is an exact discrete Gaussian, RR has its
probabilities. Every draw comes from secret randomness; statistical tests reject at p < 1e-6."""

import math

import numpy as np
import pytest
import scipy.stats
import torch

from dpdistill.errors import PrivacyParameterError
from dpdistill.privacy.mechanisms import (
    bounded_output_gradient,
    clip_rows,
    noisy_votes,
    normalize_rows,
    randomized_response_probabilities,
    selective_randomized_response,
    top_k_mask,
)
from dpdistill.privacy.randomness import SecureNoise

REJECT = 1e-6


def test_normalized_rows_never_exceed_bound_and_keep_direction():
    rows = torch.cat([torch.randn(500, 10) * 1e3, torch.randn(500, 10) * 1e-6, torch.zeros(1, 10)])
    out = normalize_rows(rows, bound=0.005)
    assert (out.norm(dim=1) <= 0.005).all()
    big = out[:500]
    assert torch.allclose(big.norm(dim=1), torch.full((500,), 0.005), rtol=1e-6)
    cosine = torch.nn.functional.cosine_similarity(big, rows[:500], dim=1)
    assert torch.allclose(cosine, torch.ones(500), atol=1e-5)


def test_clipping_bounds_large_rows_and_leaves_small_ones():
    rows = torch.cat([torch.randn(100, 5) * 100, torch.randn(100, 5) * 1e-3])
    out = clip_rows(rows, bound=1.0)
    assert (out.norm(dim=1) <= 1.0).all()
    assert torch.equal(out[100:], rows[100:])


def test_top_k_mask_keeps_largest_magnitudes():
    values = torch.tensor([[0.1, -5.0, 2.0, 0.0], [3.0, 1.0, -0.5, 4.0]])
    mask = top_k_mask(values, 2)
    assert mask.tolist() == [[False, True, True, False], [True, False, False, True]]
    with pytest.raises(PrivacyParameterError):
        top_k_mask(values, 5)


def test_bounded_gradient_with_top_k_has_k_nonzeros_and_bounded_norm():
    grads = torch.randn(300, 10)
    out = bounded_output_gradient(grads, bound=1e-3, top_k=3)
    assert ((out != 0).sum(dim=1) == 3).all()
    assert (out.norm(dim=1) <= 1e-3).all()
    with pytest.raises(PrivacyParameterError):
        bounded_output_gradient(grads, bound=0.0, top_k=3)
    with pytest.raises(PrivacyParameterError):
        bounded_output_gradient(grads, bound=1.0, top_k=3, operation="scale")


def test_randomized_response_probabilities_sum_to_one():
    p_true, p_other = randomized_response_probabilities(1.0, 3)
    assert p_true == pytest.approx(math.e / (math.e + 2))
    assert p_true + 2 * p_other == pytest.approx(1.0)
    with pytest.raises(PrivacyParameterError):
        randomized_response_probabilities(0.0, 3)
    with pytest.raises(PrivacyParameterError):
        randomized_response_probabilities(1.0, 1)


def _frequencies(labels: torch.Tensor, classes: list[int]) -> list[float]:
    return [(labels == c).float().mean().item() for c in classes]


def test_selective_rr_frequencies_match_probabilities_when_label_is_a_candidate():
    n = 60_000
    candidates = _mask([4, 7, 1]).repeat(n, 1)
    true = torch.full((n,), 7)
    out = selective_randomized_response(true, candidates, epsilon0=1.0, noise=SecureNoise())
    p_true, p_other = randomized_response_probabilities(1.0, 3)
    observed = [int((out == label).sum()) for label in (7, 4, 1)]
    assert sum(observed) == n  # nothing outside the candidates
    assert scipy.stats.chisquare(observed, [n * p_true, n * p_other, n * p_other]).pvalue > REJECT
    assert scipy.stats.chisquare(observed, [n / 3] * 3).pvalue < REJECT  # the test has power: RR is not uniform


def test_selective_rr_is_uniform_over_candidates_when_label_is_not_one():
    n = 60_000
    candidates = _mask([0, 2, 5]).repeat(n, 1)
    true = torch.full((n,), 9)
    out = selective_randomized_response(true, candidates, epsilon0=3.0, noise=SecureNoise())
    tolerance = 5 * math.sqrt(0.25 / n)
    for observed in _frequencies(out, [0, 2, 5]):
        assert abs(observed - 1 / 3) < tolerance


def _mask(indices: list[int], classes: int = 10) -> torch.Tensor:
    return torch.zeros(1, classes, dtype=torch.bool).index_fill_(1, torch.tensor(indices), True)


def test_selective_rr_with_candidate_sets_of_different_sizes():
    n = 40_000
    candidates = torch.cat([_mask([3, 5]), _mask([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])]).repeat(n, 1)
    true = torch.full((2 * n,), 3)
    out = selective_randomized_response(true, candidates, epsilon0=1.0, noise=SecureNoise())
    tolerance = 5 * math.sqrt(0.25 / n)
    for row, k in ((0, 2), (1, 10)):
        expected, _ = randomized_response_probabilities(1.0, k)
        assert abs((out[row::2] == 3).float().mean().item() - expected) < tolerance
    with pytest.raises(PrivacyParameterError, match="at least 2"):
        selective_randomized_response(true[:1], _mask([3]), 1.0, SecureNoise())


def test_noisy_votes_picks_the_plurality_among_candidates_when_noise_is_small():
    votes = torch.tensor([[0, 9, 3, 1], [5, 0, 4, 2]])
    candidates = torch.cat([_mask([2, 3], 4), _mask([1, 2], 4)])  # the plurality (1 and 0) is not a candidate
    noisy = noisy_votes(votes, candidates, 1e-3, SecureNoise())
    assert noisy.argmax(1).tolist() == [2, 2] and noisy[~candidates].eq(-math.inf).all()


def _discrete_gaussian_pmf(values: np.ndarray, sigma: float) -> np.ndarray:
    support = np.arange(-int(20 * sigma) - 1, int(20 * sigma) + 2)
    return np.exp(-values**2 / (2 * sigma**2)) / np.exp(-support**2 / (2 * sigma**2)).sum()


def test_vote_noise_is_an_exact_discrete_gaussian_on_the_integer_counts():
    n, sigma = 20_000, 2.5
    votes = torch.randint(0, 50, (n // 4, 4))
    noisy = noisy_votes(votes, torch.ones(n // 4, 4, dtype=torch.bool), sigma, SecureNoise())
    noise = noisy - votes
    assert noisy.dtype == torch.float32 and torch.equal(noise, noise.round())  # integers: no float trace of the counts
    values = noise.flatten().long().numpy()
    bins = np.arange(-7, 8)  # |noise| >= 8 pooled into the two end bins
    observed = np.array([(values <= -7).sum(), *[(values == b).sum() for b in bins[1:-1]], (values >= 7).sum()])
    pmf = _discrete_gaussian_pmf(np.arange(-60, 61), sigma)
    expected = n * np.array([pmf[:54].sum(), *pmf[54:67], pmf[67:].sum()])
    assert scipy.stats.chisquare(observed, expected).pvalue > REJECT
    wider = n * np.diff(scipy.stats.norm.cdf(np.concatenate([[-np.inf], bins[:-1] + 0.5, [np.inf]]), scale=3.0))
    assert scipy.stats.chisquare(observed, wider).pvalue < REJECT  # the test has power: std 3 is told apart


def test_noisy_votes_refuse_zero_noise_and_fractional_counts():
    with pytest.raises(PrivacyParameterError):
        noisy_votes(torch.ones(1, 3), _mask([0, 1], 3), 0.0, SecureNoise())
    with pytest.raises(PrivacyParameterError, match="integers"):
        noisy_votes(torch.tensor([[0.5, 1.0, 2.0]]), _mask([0, 1], 3), 1.0, SecureNoise())
