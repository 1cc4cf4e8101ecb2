"""Accountant figures against the exact values of the privacy-accounting notes (delta = 1e-5)."""

import math

import dp_accounting
import numpy as np
import pytest
import scipy.stats
from dp_accounting import gaussian_mechanism

from dpdistill.errors import BudgetExceededError, PrivacyParameterError
from dpdistill.privacy.budget import PrivacyRequest, plan_privacy

from helpers import lattice_epsilon, self_convolved
from dpdistill.privacy.accounting import (
    DiscreteGaussianQuery,
    DiscreteLaplaceQuery,
    DistributedDiscreteGaussianQuery,
    GaussianQuery,
    PrivacyLedger,
    RandomizedResponseQuery,
    calibrate,
    composed_epsilon,
    composed_epsilon_rdp,
    max_queries,
    paper_epsilon_dpsd_data,
)

DELTA = 1e-5
PAPER_QUERIES = 256 * 200
PAPER_MULTIPLIER = 100 / 2  # sigma = 100 on answers of sensitivity 2 * beta


def test_dpsd_paper_settings_sound_epsilon():
    assert composed_epsilon(GaussianQuery(PAPER_MULTIPLIER), PAPER_QUERIES, DELTA) == pytest.approx(28.84, abs=0.01)
    assert composed_epsilon_rdp(GaussianQuery(PAPER_MULTIPLIER), PAPER_QUERIES, DELTA) == pytest.approx(30.60, abs=0.01)


@pytest.mark.parametrize("iterations, expected", [(1, 1.22), (10, 4.44), (50, 11.65)])
def test_fewer_iterations_at_paper_sigma(iterations, expected):
    assert composed_epsilon(GaussianQuery(PAPER_MULTIPLIER), 256 * iterations, DELTA) == pytest.approx(expected, abs=0.01)


def test_looser_sensitivity_of_the_paper_lemma():
    multiplier = 100 / (2 * 10**0.5)  # sensitivity 2 * beta * sqrt(c), c = 10
    assert composed_epsilon(GaussianQuery(multiplier), PAPER_QUERIES, DELTA) == pytest.approx(162.6, abs=0.1)


@pytest.mark.parametrize(
    "k, eps0, pld, rdp",
    [(3, 0.01, 9.08, 9.75), (3, 0.1, 251.9, 260.5), (10, 0.01, 4.45, 4.80)],
)
def test_randomized_response_composition(k, eps0, pld, rdp):
    query = RandomizedResponseQuery(eps0, k)
    assert composed_epsilon(query, PAPER_QUERIES, DELTA) == pytest.approx(pld, abs=0.01 * pld)
    assert composed_epsilon_rdp(query, PAPER_QUERIES, DELTA) == pytest.approx(rdp, abs=0.01 * rdp)


def test_single_randomized_response_costs_at_most_eps0():
    assert 0.699 < composed_epsilon(RandomizedResponseQuery(0.7, 3), 1, DELTA) <= 0.7


@pytest.mark.parametrize("target, sigma", [(1.0, 1688), (10.0, 226)])
def test_gaussian_calibration_matches_notes_and_round_trips(target, sigma):
    query = calibrate(GaussianQuery, PAPER_QUERIES, target, DELTA)
    assert 2 * query.noise_multiplier == pytest.approx(sigma, rel=0.002)
    spent = composed_epsilon(query, PAPER_QUERIES, DELTA)
    assert target * 0.999 <= spent <= target
    assert composed_epsilon(GaussianQuery(query.noise_multiplier / 1.0001), PAPER_QUERIES, DELTA) > target


def test_randomized_response_calibration_round_trips():
    query = calibrate(lambda noise: RandomizedResponseQuery(1 / noise, 3), PAPER_QUERIES, 1.0, DELTA)
    assert query.epsilon0 == pytest.approx(0.00145, rel=0.01)
    assert 0.999 <= composed_epsilon(query, PAPER_QUERIES, DELTA) <= 1.0
    assert composed_epsilon(RandomizedResponseQuery(query.epsilon0 * 1.0001, 3), PAPER_QUERIES, DELTA) > 1.0


@pytest.mark.parametrize("start", [1e-3, 1.0, 40.0, 1e4])
def test_calibration_finds_the_same_noise_from_below_and_from_above(start):
    expected = gaussian_mechanism.get_sigma_gaussian(1.0, DELTA) * math.sqrt(1000)  # analytic, exact
    query = calibrate(GaussianQuery, 1000, 1.0, DELTA, start=start)
    assert expected <= query.noise_multiplier <= expected * (1 + 1e-4)


@pytest.mark.parametrize("guess", [1e-3, 0.99, 1.0, 1.003, 40.0, 1e4])  # times the answer
def test_a_guess_moves_where_the_search_starts_never_its_answer(guess):
    asked = []

    def cost(query: GaussianQuery, count: int) -> float:
        asked.append(query.noise_multiplier)
        return composed_epsilon(query, count, DELTA)

    plain = calibrate(GaussianQuery, 1000, 1.0, DELTA)  # from 1.0 on the grid 1.0001^n
    guided = calibrate(GaussianQuery, 1000, 1.0, DELTA, guess=guess * plain.noise_multiplier, cost=cost)
    assert guided == plain  # the same grid point: the least noise on the grid that fits
    assert composed_epsilon(GaussianQuery(plain.noise_multiplier / 1.0001), 1000, DELTA) > 1.0
    if 0.99 <= guess <= 1.003:  # within 101 grid points: the guess, then a gallop and a bisection of 8 at most each
        assert len(asked) <= 17  # (from 1.0: 32)


def test_calibration_refuses_noise_beyond_a_million_times_its_start():
    with pytest.raises(PrivacyParameterError, match="no noise up to"):
        calibrate(GaussianQuery, PAPER_QUERIES, 1.0, DELTA, start=1e-4)  # 844 is needed


def test_max_queries_is_the_boundary():
    query = GaussianQuery(PAPER_MULTIPLIER)
    n = max_queries(query, 4.44, DELTA)
    assert composed_epsilon(query, n, DELTA) <= 4.44 < composed_epsilon(query, n + 1, DELTA)


def test_paper_formula_reproduces_theorem_1_values():
    assert paper_epsilon_dpsd_data(1e-3, 10, 256, 200, 100, DELTA) == pytest.approx(0.046, abs=0.001)
    assert paper_epsilon_dpsd_data(5e-3, 10, 256, 200, 100, DELTA) == pytest.approx(0.261, abs=0.001)


def test_ledger_refuses_a_charge_past_its_cap():
    ledger = PrivacyLedger(GaussianQuery(PAPER_MULTIPLIER), max_queries=512)
    ledger.charge(256)
    ledger.charge(256)
    with pytest.raises(BudgetExceededError):
        ledger.charge(1)
    assert ledger.answered == 512
    assert ledger.epsilon(DELTA) == pytest.approx(composed_epsilon(GaussianQuery(PAPER_MULTIPLIER), 512, DELTA))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_impossible_epsilon_is_rejected(bad):
    with pytest.raises(PrivacyParameterError):
        calibrate(GaussianQuery, 100, bad, DELTA)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 2.0])
def test_delta_outside_unit_interval_is_rejected(bad):
    with pytest.raises(PrivacyParameterError):
        composed_epsilon(GaussianQuery(1.0), 10, bad)


def _exact_vote_epsilon(sigma: float, count: int, delta: float) -> float:
    """Exact epsilon of `count` discrete-Gaussian vote histograms, computed without dp-accounting.

    One member's vote moves from class a to b: the noisy counts are N_Z(0, sigma^2) around (v_a, v_b) or around
    (v_a - 1, v_b + 1), so the privacy loss is (y - x + 1) / sigma^2 for independent discrete Gaussians x and y.
    Over `count` queries it is (K + count) / sigma^2 with K a sum of `count` differences: an integer lattice, so
    delta(eps) = E[(1 - e^(eps - loss))+] is exact by convolution."""
    support = np.arange(-int(12 * sigma) - 2, int(12 * sigma) + 3).astype(float)  # mass beyond: below 1e-30
    pmf = np.exp(-support**2 / (2 * sigma**2))
    pmf /= pmf.sum()
    total = self_convolved(np.convolve(pmf, pmf[::-1]), count)
    return lattice_epsilon(total, (np.arange(len(total)) - (len(total) - 1) // 2 + count) / sigma**2, delta)


@pytest.mark.parametrize("sigma, count", [(0.5, 3), (2, 1), (2, 10), (5, 100), (12, 400)])
def test_discrete_gaussian_votes_epsilon_is_an_upper_bound_within_a_thousandth_of_the_exact_one(sigma, count):
    exact = _exact_vote_epsilon(sigma, count, DELTA)
    assert exact <= composed_epsilon(DiscreteGaussianQuery(sigma), count, DELTA) <= exact * (1 + 1e-3)


@pytest.mark.parametrize("sigma, count", [(2, 1), (5, 100), (40, 1000), (1200, 51200)])
def test_discrete_gaussian_votes_sit_between_the_continuous_figure_and_the_rdp_bound(sigma, count):
    epsilon = composed_epsilon(DiscreteGaussianQuery(sigma), count, DELTA)
    continuous = gaussian_mechanism.get_epsilon_gaussian(sigma / math.sqrt(2) / math.sqrt(count), DELTA)
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma / math.sqrt(2)), count))
    assert continuous - 1e-6 <= epsilon <= accountant.get_epsilon(DELTA)
    assert epsilon <= continuous * 1.02  # GNMax at sigma 40 on 1000 answers: 4.98 in the privacy notes


def test_discrete_gaussian_votes_describe_themselves_like_the_other_queries():
    query = DiscreteGaussianQuery(40.0)
    assert query.discrete and not getattr(GaussianQuery(1.0), "discrete", False)  # what a ledger checks
    assert query.dp_event() == dp_accounting.GaussianDpEvent(40 / math.sqrt(2))
    assert composed_epsilon_rdp(query, 1000, DELTA) == pytest.approx(5.38, abs=0.01)  # the notes' RDP figure
    with pytest.raises(PrivacyParameterError):
        DiscreteGaussianQuery(0.0)


@pytest.mark.parametrize("target, count", [(1.0, 100), (10.0, 3840), (1000.0, 150)])
def test_discrete_gaussian_calibration_never_overspends(target, count):
    query = plan_privacy(PrivacyRequest("label", epsilon=target, teachers=5), 10, count, 1).query
    assert query.discrete
    assert target * 0.999 < composed_epsilon(query, count, DELTA) <= target
    assert composed_epsilon(DiscreteGaussianQuery(query.sigma / 1.0002), count, DELTA) > target  # smallest to 0.01%
    cap = max_queries(query, target, DELTA, guess=count)
    assert cap >= count and composed_epsilon(query, cap + 1, DELTA) > target
    assert max_queries(query, target, DELTA) == cap  # the guess only speeds the search


@pytest.mark.parametrize("owners, dropouts", [(5, 0), (5, 2), (50, 10)])
def test_distributed_shares_cost_what_one_discrete_gaussian_of_the_threshold_sum_costs(owners, dropouts):
    """With shares of sigma 5 the correction term is below 1e-100: the RDP epsilon is that of one discrete
    Gaussian of sigma 5 sqrt(owners - dropouts) on the same histogram (the fewest shares that can be unmasked)."""
    distributed = DistributedDiscreteGaussianQuery(5.0, math.sqrt(2), 10, owners, dropouts)
    central = DiscreteGaussianQuery(5.0 * math.sqrt(owners - dropouts))
    assert distributed.noise_multiplier == pytest.approx(central.noise_multiplier, rel=1e-12)
    assert distributed.epsilon(1000, DELTA) == pytest.approx(composed_epsilon_rdp(central, 1000, DELTA), rel=1e-9)


def test_small_shares_pay_the_distributed_correction():
    """Kairouz et al.'s tau: for two owners with shares of sigma 0.5, rho = Delta^2 / (2 n sigma^2) + tau d / 4,
    tau = 10 exp(-2 pi^2 sigma^2 / 2), worse than one owner's share alone would suggest."""
    query = DistributedDiscreteGaussianQuery(0.5, math.sqrt(2), 10, 2, 0)
    tau = 10 * math.exp(-2 * math.pi**2 * 0.25 / 2)
    assert query.rho() == pytest.approx(2 / (2 * 2 * 0.25) + tau * 10 / 4, rel=1e-12)
    assert query.epsilon(10, DELTA) > composed_epsilon_rdp(DiscreteGaussianQuery(0.5 * math.sqrt(2)), 10, DELTA)


def test_distributed_shares_refuse_a_threshold_of_nobody():
    with pytest.raises(PrivacyParameterError):
        DistributedDiscreteGaussianQuery(1.0, 1.0, 10, 3, 3)


def _exact_laplace_vote_epsilon(scale: int, count: int, delta: float) -> float:
    """LNMax, exactly: each of the two counts that move has privacy loss +1/scale when its discrete Laplace noise
    is <= 0 (probability 1 / (1 + p), p = e^(-1/scale)) and -1/scale otherwise, so `count` answers sum 2 count
    such signs: a binomial."""
    p = math.exp(-1 / scale)
    signs = 2 * count
    ups = np.arange(signs + 1)
    pmf = scipy.stats.binom.pmf(ups, signs, 1 / (1 + p))
    return lattice_epsilon(pmf, (2 * ups - signs) / scale, delta)


@pytest.mark.parametrize("scale, count", [(1, 1), (40, 1), (40, 27), (40, 1300), (5, 200)])
def test_discrete_laplace_votes_epsilon_is_an_upper_bound_near_the_exact_one(scale, count):
    exact = _exact_laplace_vote_epsilon(scale, count, DELTA)
    query = DiscreteLaplaceQuery(scale)
    assert exact - 1e-9 <= composed_epsilon(query, count, DELTA) <= exact * (1 + 1e-3) + 1e-9
    assert composed_epsilon(query, count, DELTA) <= count * 2 / scale  # never above basic composition


def test_lnmax_at_dgds_scale_is_sound_at_the_papers_query_counts():
    """DGD's 2 / eps0 = 40: its 27 and 1,300 answers spend a sound 0.646 and 5.81 (the paper states 1 and 10)."""
    query = DiscreteLaplaceQuery(40)
    assert composed_epsilon(query, 27, DELTA) == pytest.approx(0.646, abs=0.001)
    assert composed_epsilon(query, 1300, DELTA) == pytest.approx(5.81, abs=0.01)
    assert query.discrete and query.dp_event() == dp_accounting.GaussianDpEvent(20.0)  # 1 / eps0, through zCDP
    with pytest.raises(PrivacyParameterError):
        DiscreteLaplaceQuery(0)
    values = np.arange(-4000, 4001)  # the report's noise std against the pmf's own, and about scale sqrt 2
    pmf = np.exp(-np.abs(values) / 40)
    assert query.noise_std == pytest.approx(math.sqrt((values**2 * pmf).sum() / pmf.sum()), rel=1e-9)
    assert query.noise_std == pytest.approx(40 * math.sqrt(2), rel=1e-3)


def test_lnmax_calibrates_a_whole_number_scale_within_the_budget():
    request = PrivacyRequest(mode="label", epsilon=1.0, num_candidates=10, teachers=250, vote_noise="laplace")
    plan = plan_privacy(request, 10, 27, 1)
    assert isinstance(plan.query, DiscreteLaplaceQuery) and plan.epsilon(27) <= 1.0
    assert composed_epsilon(DiscreteLaplaceQuery(plan.query.scale - 1), 27, DELTA) > 1.0  # the least noise that fits
    with pytest.raises(PrivacyParameterError, match="whole number"):
        PrivacyRequest(mode="label", epsilon=1.0, teachers=250, vote_noise="laplace", sigma=40.5).validate(10)
