"""Planning a run's privacy: calibration to the budget, refusal of plans that overspend, paper accounting."""

import math
import warnings

import pytest
import scipy.optimize

from dpdistill.errors import BudgetExceededError, PrivacyParameterError
from dpdistill.privacy.budget import PrivacyRequest, plan_privacy
from dpdistill.privacy.ledger import Release, composed_epsilon

from helpers import gdp_delta

DELTA = 1e-5


def test_sound_data_plan_calibrates_sigma_and_fits_the_budget():
    """51,200 answers of sensitivity 2 beta and noise std sigma beta are sqrt(51200) * 2 / sigma-GDP: the least
    sigma that meets epsilon 1 follows from the closed form (1688 in the privacy notes)."""
    plan = plan_privacy(PrivacyRequest("data", epsilon=1.0), num_classes=10, batch_size=256, iterations=200)
    least = 2 * math.sqrt(256 * 200) / _gdp_mu_for(1.0)
    assert least <= plan.sigma <= least * (1 + 1e-4) and plan.sigma == pytest.approx(1688, rel=0.002)
    assert gdp_delta(1.0, 2 * math.sqrt(256 * 200) / plan.sigma) <= DELTA
    assert plan.max_queries >= plan.planned_queries
    assert plan_privacy(PrivacyRequest("data", epsilon=1.0, beta=0.5), 10, 256, 200).sigma == plan.sigma  # no beta


def _gdp_mu_for(epsilon: float) -> float:
    """The mu at which mu-GDP spends exactly (epsilon, 1e-5), from the closed form."""
    return scipy.optimize.brentq(lambda mu: gdp_delta(epsilon, mu) - DELTA, 1e-3, 50, xtol=1e-14)


def test_fixed_sigma_that_overspends_is_refused_before_any_query():
    with pytest.raises(BudgetExceededError, match="affords"):
        plan_privacy(PrivacyRequest("data", epsilon=1.0, sigma=100.0), 10, 256, 200)


def test_ledger_from_plan_stops_at_the_budget():
    plan = plan_privacy(PrivacyRequest("data", epsilon=4.44, sigma=100.0), 10, 256, 10)
    ledger = plan.ledger()
    for _ in range(10):
        ledger.charge(256)
    with pytest.raises(BudgetExceededError):
        ledger.charge(plan.max_queries - ledger.answered + 1)


def test_paper_accounting_reports_sound_epsilon_beside_the_paper_figure():
    plan = plan_privacy(PrivacyRequest("data", epsilon=10.0, accounting="paper", sigma=100.0, beta=5e-3), 10, 256, 200)
    summary = plan.summary(256 * 200)
    assert summary["paper_epsilon"] == pytest.approx(0.261, abs=0.001)
    assert summary["epsilon"] == pytest.approx(28.84, abs=0.01)
    assert "NOT a guarantee" in summary["paper_epsilon_label"]


def test_label_plans_sound_and_paper():
    sound = plan_privacy(PrivacyRequest("label", epsilon=1.0), 10, 256, 200)
    assert sound.epsilon0 == pytest.approx(0.00145, rel=0.01)
    paper = plan_privacy(PrivacyRequest("label", epsilon=1.0, accounting="paper"), 10, 256, 200)
    assert paper.epsilon0 == 1.0
    assert paper.summary(256 * 200)["epsilon"] == pytest.approx(19424, rel=0.001)


@pytest.mark.parametrize("request_", [
    PrivacyRequest("data", epsilon=0.0),
    PrivacyRequest("data", epsilon=-2.0),
    PrivacyRequest("data", epsilon=1.0, delta=1.0),
    PrivacyRequest("data", epsilon=1.0, delta=0.0),
    PrivacyRequest("label", epsilon=1.0, num_candidates=11),
    PrivacyRequest("label", epsilon=1.0, num_candidates=1),
    PrivacyRequest("data", epsilon=None),
    PrivacyRequest("data", epsilon=1.0, sigma=-1.0),
])
def test_impossible_parameters_are_refused(request_):
    with pytest.raises(PrivacyParameterError):
        plan_privacy(request_, 10, 16, 2)


def test_no_privacy_has_no_guarantee():
    plan = plan_privacy(PrivacyRequest("none", epsilon=None), 10, 16, 2)
    assert plan.ledger() is None
    assert plan.summary(32)["guarantee"].startswith("none")


def test_an_ensembles_labels_are_noisy_votes_with_sensitivity_sqrt2():
    """One example moves one member's vote: two counts change by one. The least sigma for 51,200 answers at
    epsilon 1 is that of the continuous Gaussian of sensitivity sqrt 2 (closed-form GDP), or a hair above it for
    the discrete noise the votes get; with sensitivity 1 (one count) or 2 it would be another."""
    request = PrivacyRequest("label", epsilon=1.0, teachers=50)
    plan = plan_privacy(request, 10, 256, 200)
    continuous = math.sqrt(2) * math.sqrt(256 * 200) / _gdp_mu_for(1.0)
    assert plan.query.discrete and continuous <= plan.sigma <= continuous * 1.002
    summary = plan.summary(plan.planned_queries)
    assert summary["teachers"] == 50 and summary["epsilon"] <= 1.0 and summary["paper_epsilon"] is None
    fixed = plan_privacy(PrivacyRequest("label", epsilon=10.0, teachers=50, sigma=40.0), 10, 100, 10)
    assert fixed.sigma == 40.0
    assert fixed.summary(1000)["epsilon"] == pytest.approx(4.98, abs=0.01)  # GNMax, sigma 40, 1000 answers (notes)


@pytest.mark.parametrize("values, message", [({"accounting": "paper"}, "paper accounting"),
                                             ({"epsilon0": 0.5}, "noisy votes"), ({"teachers": 0}, "at least one")])
def test_impossible_ensemble_requests_are_refused(values, message):
    with pytest.raises(PrivacyParameterError, match=message):
        plan_privacy(PrivacyRequest("label", epsilon=1.0, **({"teachers": 5} | values)), 10, 256, 10)


@pytest.mark.parametrize("request_", [PrivacyRequest("label", epsilon=1.0), PrivacyRequest("label", epsilon=1.0,
                                                                                            num_candidates=2),
                                      PrivacyRequest("label", epsilon=1.0, accounting="paper"),
                                      PrivacyRequest("label", epsilon=1.0, teachers=4)])
def test_label_mode_accounting_emits_no_warning(request_):
    """Calibration (whose first probe, eps0 = epsilon on every answer, spends an epsilon in the hundreds), the
    report's figures (PLD and RDP) and the composition of several releases in a ledger."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = plan_privacy(request_, 10, 64, 20)
        plan.summary(plan.planned_queries)
        composed_epsilon([Release.of_plan(plan, 1280), Release.of_plan(plan, 64)], DELTA)


@pytest.mark.parametrize("request_, error, message", [
    # the paper's Theorem 1 gives 0.261 for sigma 100, beta 5e-3, b 256, T 200: above a budget of 0.2
    (PrivacyRequest("data", epsilon=0.2, accounting="paper", sigma=100.0, beta=5e-3), BudgetExceededError, "affords 0"),
    (PrivacyRequest("label", epsilon=0.5, accounting="paper", epsilon0=0.6), BudgetExceededError, "affords 0"),
    (PrivacyRequest("data", epsilon=1.0, accounting="paper"), PrivacyParameterError, "needs a fixed --sigma"),
])
def test_paper_accounting_refuses_what_the_papers_formula_does_not_afford(request_, error, message):
    with pytest.raises(error, match=message):
        plan_privacy(request_, 10, 256, 200)
    assert plan_privacy(PrivacyRequest("data", epsilon=0.3, accounting="paper", sigma=100.0, beta=5e-3), 10, 256,
                        200).max_queries == 256 * 200  # 0.261 fits 0.3
