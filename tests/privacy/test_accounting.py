"""Accountant figures against the exact values of the privacy-accounting notes (delta = 1e-5)."""

import pytest

from dpdistill.errors import BudgetExceededError, PrivacyParameterError
from dpdistill.privacy.accounting import (
    GaussianQuery,
    PrivacyLedger,
    RandomizedResponseQuery,
    calibrate_gaussian,
    calibrate_randomized_response,
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
    query = calibrate_gaussian(PAPER_QUERIES, target, DELTA)
    assert 2 * query.noise_multiplier == pytest.approx(sigma, rel=0.002)
    spent = composed_epsilon(query, PAPER_QUERIES, DELTA)
    assert target * 0.995 <= spent <= target


def test_randomized_response_calibration_round_trips():
    query = calibrate_randomized_response(PAPER_QUERIES, 3, 1.0, DELTA)
    assert query.epsilon0 == pytest.approx(0.00145, rel=0.01)
    assert 0.995 <= composed_epsilon(query, PAPER_QUERIES, DELTA) <= 1.0


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
        calibrate_gaussian(100, bad, DELTA)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 2.0])
def test_delta_outside_unit_interval_is_rejected(bad):
    with pytest.raises(PrivacyParameterError):
        composed_epsilon(GaussianQuery(1.0), 10, bad)
