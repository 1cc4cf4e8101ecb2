"""The one-run audit: exact p-values, the most a perfect attack can certify, no false refutation of a mechanism
that meets its epsilon (randomized response, simulated), and power where the epsilon is large."""

import math

import numpy as np
import pytest
from scipy import stats

from dpdistill.audit.one_run import audit, epsilon_lower_bound, guess_grid, p_value
from dpdistill.errors import ConfigError


def test_the_p_value_is_the_binomial_tail_of_randomized_response_at_epsilon():
    assert p_value(100, 40, 30, 0.0) == pytest.approx(stats.binom.sf(29, 40, 0.5))
    q = 1 / (1 + math.exp(-2.0))
    assert p_value(100, 40, 30, 2.0) == pytest.approx(stats.binom.sf(29, 40, q))
    assert p_value(100, 40, 30, 2.0, delta=1e-4) > p_value(100, 40, 30, 2.0)  # delta only weakens the test
    with pytest.raises(ConfigError):
        p_value(10, 20, 5, 1.0)


def test_a_perfect_attack_on_1000_canaries_certifies_about_5_8():
    """All 1,000 guesses right: the largest epsilon with q^1000 < 0.05, q = 1 / (1 + e^-eps)."""
    q = 0.05 ** (1 / 1000)
    assert epsilon_lower_bound(1000, 1000, 1000) == pytest.approx(math.log(q / (1 - q)), rel=1e-6)
    assert 5.7 < epsilon_lower_bound(1000, 1000, 1000) < 5.9
    assert epsilon_lower_bound(1000, 1000, 500) == 0.0  # chance refutes nothing


def _randomized_response(epsilon: float, canaries: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Each canary's inclusion released through epsilon-DP randomized response, with a noisy score to rank by."""
    included = rng.random(canaries) < 0.5
    truthful = rng.random(canaries) < math.exp(epsilon) / (1 + math.exp(epsilon))
    released = np.where(truthful, included, ~included)
    return released + 0.01 * rng.random(canaries), included


def test_an_epsilon_dp_mechanism_is_refuted_above_its_epsilon_in_at_most_5_percent_of_audits():
    rng = np.random.default_rng(0)
    refuted = sum(audit(*_randomized_response(1.0, 1000, rng)).epsilon_lower_bound > 1.0 for _ in range(100))
    assert refuted <= 12  # at most 5% in expectation (with the grid's correction, fewer); 12 of 100 is p < 0.005


def test_the_audit_has_power_where_the_epsilon_is_large():
    result = audit(*_randomized_response(6.0, 1000, np.random.default_rng(1)))
    assert result.epsilon_lower_bound > 3 and result.auc > 0.99 and result.tpr_at_1pct_fpr > 0.9
    assert result.guesses_in in guess_grid(1000) and result.canaries == 1000


def test_scores_without_signal_give_no_bound_and_chance_auc():
    rng = np.random.default_rng(2)
    results = [audit(rng.random(1000), rng.random(1000) < 0.5) for _ in range(40)]
    assert sum(result.epsilon_lower_bound > 0 for result in results) <= 6
    assert abs(np.mean([result.auc for result in results]) - 0.5) < 0.02


def test_bad_scores_are_refused():
    with pytest.raises(ConfigError, match="one score"):
        audit(np.zeros(5), np.zeros(4, dtype=bool))
    with pytest.raises(ConfigError, match="finite"):
        audit(np.array([0.0, np.nan]), np.array([True, False]))
