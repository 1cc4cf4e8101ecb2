"""The noisy count of a training set: its noise, its rounding and its epsilon as a ledger composes it."""

import math

import pytest

from dpdistill.errors import PrivacyParameterError
from dpdistill.privacy.accounting import RandomizedResponseQuery
from dpdistill.privacy.count import NoisyCount
from dpdistill.privacy.ledger import Release, composed_epsilon
from dpdistill.privacy.randomness import ReproducibleNoise, SecureNoise


def test_the_count_takes_the_least_noise_within_its_epsilon():
    assert NoisyCount.within(0.01) == NoisyCount(100) and NoisyCount(100).epsilon == 0.01
    assert NoisyCount.within(0.03).scale == 34 and NoisyCount.within(0.03).epsilon <= 0.03
    assert NoisyCount.within(2.0).scale == 1 and NoisyCount(1).unit == 1
    assert (NoisyCount(34).unit, NoisyCount(100).unit, NoisyCount(999).unit) == (10, 100, 100)
    with pytest.raises(PrivacyParameterError):
        NoisyCount.within(0.0)
    with pytest.raises(PrivacyParameterError):
        NoisyCount(0)


def test_released_counts_are_rounded_unbiased_and_spread_as_their_noise():
    count, noise = NoisyCount(100), SecureNoise()
    released = [count.release(10_000, noise) for _ in range(2000)]
    assert all(value % 100 == 0 for value in released)
    mean = sum(released) / len(released)
    # noise std sqrt(2 q) / (1 - q) ~ 141 plus rounding (std 29): the mean of 2,000 within 4.6 of 10,000 at 1 sigma
    assert abs(mean - 10_000) < 20
    spread = sum(abs(value - 10_000) for value in released) / len(released)
    assert 80 < spread < 120  # E|noise| = 100 for the discrete Laplace of scale 100, rounding adds little
    assert NoisyCount(100).release(3, ReproducibleNoise(0)) >= 100  # never below its unit


def test_a_ledger_composes_the_count_as_the_pure_epsilon_it_spends():
    count = NoisyCount(50)
    as_recorded = Release(count.dp_event(), 1e-5, count.epsilon)
    rr = RandomizedResponseQuery(count.epsilon, 2)
    # the ledger's RDP composition of two counts: sound (at least the exact 0.0400), near basic composition's 0.04
    assert rr.epsilon(2, 1e-5) <= composed_epsilon([as_recorded, as_recorded], 1e-5) < 1.1 * 2 * count.epsilon
    assert 0.998 * count.epsilon < rr.epsilon(1, 1e-5) <= count.epsilon  # two-bucket RR: epsilon, less delta's share
    assert count.dp_event().noise_parameter == pytest.approx(2 / (math.exp(0.02) + 1))
