"""Statistical checks of the mechanisms: bounds hold, noise has the stated scale, RR has its probabilities."""

import math

import pytest
import torch

from dpdistill.errors import PrivacyParameterError
from dpdistill.privacy.mechanisms import (
    bounded_output_gradient,
    clip_rows,
    gaussian_noise,
    noisy_votes,
    normalize_rows,
    randomized_response_probabilities,
    selective_randomized_response,
    top_k_mask,
)


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


def test_gaussian_noise_has_requested_std_and_zero_mean():
    generator = torch.Generator().manual_seed(0)
    noise = gaussian_noise((400_000,), std=0.37, generator=generator)
    assert abs(noise.std().item() - 0.37) < 0.37 * 0.01
    assert abs(noise.mean().item()) < 5 * 0.37 / math.sqrt(400_000)


def test_gaussian_noise_is_reproducible_from_seed():
    a = gaussian_noise((10,), 1.0, torch.Generator().manual_seed(3))
    b = gaussian_noise((10,), 1.0, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


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
    out = selective_randomized_response(true, candidates, epsilon0=1.0, generator=torch.Generator().manual_seed(1))
    p_true, p_other = randomized_response_probabilities(1.0, 3)
    tolerance = 5 * math.sqrt(0.25 / n)
    for observed, expected in zip(_frequencies(out, [7, 4, 1]), [p_true, p_other, p_other]):
        assert abs(observed - expected) < tolerance
    assert set(out.unique().tolist()) <= {1, 4, 7}


def test_selective_rr_is_uniform_over_candidates_when_label_is_not_one():
    n = 60_000
    candidates = _mask([0, 2, 5]).repeat(n, 1)
    true = torch.full((n,), 9)
    out = selective_randomized_response(true, candidates, epsilon0=3.0, generator=torch.Generator().manual_seed(2))
    tolerance = 5 * math.sqrt(0.25 / n)
    for observed in _frequencies(out, [0, 2, 5]):
        assert abs(observed - 1 / 3) < tolerance


def _mask(indices: list[int], classes: int = 10) -> torch.Tensor:
    return torch.zeros(1, classes, dtype=torch.bool).index_fill_(1, torch.tensor(indices), True)


def test_selective_rr_with_candidate_sets_of_different_sizes():
    n = 40_000
    candidates = torch.cat([_mask([3, 5]), _mask([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])]).repeat(n, 1)
    true = torch.full((2 * n,), 3)
    out = selective_randomized_response(true, candidates, epsilon0=1.0, generator=torch.Generator().manual_seed(3))
    tolerance = 5 * math.sqrt(0.25 / n)
    for row, k in ((0, 2), (1, 10)):
        expected, _ = randomized_response_probabilities(1.0, k)
        assert abs((out[row::2] == 3).float().mean().item() - expected) < tolerance
    with pytest.raises(PrivacyParameterError, match="at least 2"):
        selective_randomized_response(true[:1], _mask([3]), 1.0, torch.Generator())


def test_noisy_votes_picks_the_plurality_among_candidates_when_noise_is_small():
    votes = torch.tensor([[0, 9, 3, 1], [5, 0, 4, 2]])
    candidates = torch.cat([_mask([2, 3], 4), _mask([1, 2], 4)])  # the plurality (1 and 0) is not a candidate
    generator = torch.Generator().manual_seed(0)
    noisy = noisy_votes(votes, candidates, 1e-3, generator)
    assert noisy.argmax(1).tolist() == [2, 2] and noisy[~candidates].eq(-math.inf).all()


def test_noisy_votes_flips_with_the_gaussian_probability():
    """Two candidates whose counts differ by d: the smaller wins with probability Phi(-d / (sigma sqrt 2))."""
    n, sigma, gap = 40000, 2.0, 2
    votes = torch.tensor([[gap, 0]]).repeat(n, 1)
    picks = noisy_votes(votes, torch.ones(n, 2, dtype=torch.bool), sigma, torch.Generator().manual_seed(1)).argmax(1)
    expected = 0.5 * math.erfc(gap / (sigma * math.sqrt(2)) / math.sqrt(2))
    observed = (picks == 1).float().mean().item()
    assert abs(observed - expected) < 4 * math.sqrt(expected * (1 - expected) / n)


def test_noisy_votes_refuses_zero_noise():
    with pytest.raises(PrivacyParameterError):
        noisy_votes(torch.ones(1, 3), _mask([0, 1], 3), 0.0, torch.Generator())
