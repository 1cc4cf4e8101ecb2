"""Pre-flight advice: from public quantities only, a run whose answers would be near random is refused before it
spends anything, and one whose answers can carry the classes is let through."""

import math

import numpy as np
import pytest

from dpdistill.errors import PrivacyParameterError
from dpdistill.privacy.budget import PrivacyRequest, plan_privacy
from dpdistill.privacy.preflight import (capacity_bits, gradient_advice, label_bits, response_advice,
                                         truthful_response, vote_advice, vote_survival)


@pytest.mark.parametrize("sigma, members, classes, noise", [(118.0, 50, 5, "gaussian"), (40.0, 60, 10, "laplace"),
                                                            (3.0, 4, 3, "gaussian")])
def test_a_unanimous_votes_survival_matches_a_simulation(sigma, members, classes, noise):
    rng = np.random.default_rng(0)
    draws = 200_000
    counts = np.zeros((draws, classes))
    counts[:, 0] = members
    noisy = counts + (rng.normal(0, sigma, counts.shape) if noise == "gaussian" else rng.laplace(0, sigma, counts.shape))
    simulated = (noisy.argmax(1) == 0).mean()
    assert vote_survival(sigma, members, classes, noise) == pytest.approx(simulated, abs=0.005)


def test_the_ensemble_that_taught_a_near_chance_student_is_refused_and_a_good_one_is_not():
    """50 heads at noise 118 (5 classes) taught 30.4% against chance 20%: a unanimous vote survives 31% of the
    time; 1,000 heads at the same noise, nearly always."""
    advice = vote_advice(118.0, 50, 5, "gaussian", "PATE")
    assert advice.startswith("PATE's answers would be near random") and "31%" in advice and "--accept-noise" in advice
    assert "307 unanimous voters would keep it 90% of the time" in advice and "dpdistill train-private" in advice
    assert vote_survival(118.0, 306, 5) < 0.9 <= vote_survival(118.0, 307, 5)
    assert vote_advice(118.0, 1000, 10, "gaussian", "PATE") is None


def test_randomized_response_is_refused_only_near_chance():
    assert truthful_response(math.log(2), 3) == pytest.approx(0.5)  # e^eps / (e^eps + k - 1)
    assert response_advice(1.0, 3) is None  # the SRR paper preset: 58% against chance 33%, a usable signal
    assert "near random" in response_advice(0.01, 3)


def test_data_mode_is_refused_below_the_bits_that_name_the_classes():
    assert label_bits(10) == pytest.approx(21.79, abs=0.01)  # log2(10!)
    assert capacity_bits(51_200, 100.0) == pytest.approx(51_200 / 20_000 / math.log(2))
    assert "at most 0.72 bits, fewer than the 21.8" in gradient_advice(51_200, 226.0, 1, 10)
    assert gradient_advice(51_200, 226.0, 50, 10) is None  # 50 members: 2,500 times the capacity


@pytest.mark.preflight
def test_a_plan_refuses_near_random_answers_unless_accepted():
    request = PrivacyRequest(mode="data", epsilon=10.0)
    plan = plan_privacy(request, 10, 256, 200)
    with pytest.raises(PrivacyParameterError, match="cannot teach the classes"):
        plan.refuse_near_random()
    plan_privacy(PrivacyRequest(mode="data", epsilon=10.0, accept_noise=True), 10, 256, 200).refuse_near_random()
    plan_privacy(PrivacyRequest(mode="none", epsilon=None), 10, 256, 200).refuse_near_random()  # nothing to refuse
