"""The accountant's figures against computations that share no code with it: the closed form of Gaussian
differential privacy, dp-accounting's own PLD and RDP accountants, and randomized response's privacy-loss
distribution convolved exactly here. A figure that only repeats what the library printed once cannot catch a
regression in the library path; these can."""

import math

import dp_accounting
import pytest

from dpdistill.privacy.accounting import (GaussianQuery, RandomizedResponseQuery, composed_epsilon,
                                          composed_epsilon_rdp)
from dpdistill.privacy.budget import PrivacyRequest, plan_privacy

from helpers import exact_randomized_response_epsilon, gdp_epsilon

DELTA = 1e-5


def pld_gaussian_epsilon(noise_multiplier: float, count: int) -> float:
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
    accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier), count)
    return accountant.get_epsilon(DELTA)


def rdp_gaussian_epsilon(noise_multiplier: float, count: int) -> float:
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier), count)
    return accountant.get_epsilon(DELTA)


@pytest.mark.parametrize("noise_multiplier, count", [(50.0, 256), (50.0, 2560), (3.0, 10), (40 / math.sqrt(2), 1000),
                                                     (844.0, 51200)])
def test_composed_gaussians_are_mu_gdp_with_mu_sqrt_count_over_the_multiplier(noise_multiplier, count):
    epsilon = composed_epsilon(GaussianQuery(noise_multiplier), count, DELTA)
    exact = gdp_epsilon(math.sqrt(count) / noise_multiplier, DELTA)
    assert epsilon == pytest.approx(exact, rel=1e-6)


@pytest.mark.parametrize("noise_multiplier, count", [(50.0, 256), (50.0, 2560), (3.0, 10), (40 / math.sqrt(2), 1000)])
def test_composed_gaussians_agree_with_dp_accountings_pld_and_rdp_accountants(noise_multiplier, count):
    epsilon = composed_epsilon(GaussianQuery(noise_multiplier), count, DELTA)
    # the PLD accountant discretises pessimistically (interval 1e-3 here): an upper bound a hair above the exact figure
    assert epsilon <= pld_gaussian_epsilon(noise_multiplier, count) <= epsilon + 0.01
    rdp = rdp_gaussian_epsilon(noise_multiplier, count)
    assert composed_epsilon_rdp(GaussianQuery(noise_multiplier), count, DELTA) == pytest.approx(rdp, rel=1e-9)
    assert epsilon < rdp < epsilon * 1.25  # RDP's conversion to (eps, delta) is looser, never tighter


@pytest.mark.parametrize("epsilon0, candidates, count", [(0.01, 3, 51200), (0.1, 3, 51200), (0.01, 10, 51200),
                                                         (0.5, 2, 200), (1.0, 3, 1), (0.05, 3, 5000)])
def test_randomized_response_matches_the_exact_convolution_of_its_privacy_loss(epsilon0, candidates, count):
    exact = exact_randomized_response_epsilon(epsilon0, candidates, count, DELTA)
    assert composed_epsilon(RandomizedResponseQuery(epsilon0, candidates), count, DELTA) == pytest.approx(exact,
                                                                                                      rel=1e-4)


def test_the_exact_convolution_reproduces_the_privacy_notes_table():
    # k = 3, eps0 = 0.01 over 51,200 answers: 9.08; k = 10: 4.45 (privacy-accounting notes, exact / PLD column)
    assert exact_randomized_response_epsilon(0.01, 3, 51200, DELTA) == pytest.approx(9.08, abs=0.01)
    assert exact_randomized_response_epsilon(0.01, 10, 51200, DELTA) == pytest.approx(4.45, abs=0.01)


@pytest.mark.parametrize("sigma, queries", [(40.0, 1000), (5.0, 100), (150.0, 2000)])
def test_gnmax_votes_cost_the_gaussian_of_sensitivity_sqrt_2_and_a_hair_more(sigma, queries):
    """One example moves one member's vote: two counts change by one, L2 sensitivity sqrt 2. The continuous
    Gaussian of the same sigma is sqrt(queries) * sqrt(2) / sigma-GDP; the discrete noise the release draws costs
    at most a hair more, never less."""
    plan = plan_privacy(PrivacyRequest("label", epsilon=1e4, teachers=50, sigma=sigma), 10, queries, 1)
    gaussian = gdp_epsilon(math.sqrt(queries) * math.sqrt(2) / sigma, DELTA)
    assert gaussian - 1e-6 <= plan.epsilon(queries) <= gaussian * 1.002
    with_sensitivity_one = gdp_epsilon(math.sqrt(queries) / sigma, DELTA)
    assert plan.epsilon(queries) > with_sensitivity_one * 1.3  # a count-only sensitivity would be far too low
