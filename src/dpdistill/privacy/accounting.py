"""Sound privacy accounting on dp-accounting, plus the papers' formulas for comparison only.

Neighbouring relation: the private data trained the teacher(s) without DP, so a change of one private example
can change every answer of the teacher it touched. Every query is therefore charged at the mechanism's full
sensitivity and all queries compose. The per-query mechanisms are:

- `GaussianQuery`: an answer of L2 sensitivity Delta plus N(0, std^2) noise, described by its noise multiplier
  std / Delta. DPSD data mode: answers of norm <= beta differ by <= 2 beta, noise std sigma * beta, so the
  multiplier is sigma / 2.
- `RandomizedResponseQuery`: k-ary randomized response with parameter eps0 (label mode).

Epsilons are exact, from dp-accounting: N Gaussians with multiplier z compose to one Gaussian with multiplier
z / sqrt(N), whose (eps, delta) curve dp-accounting computes analytically; the privacy loss of randomized response
takes only the values -eps0, 0, +eps0, so its privacy-loss distribution (PLD) on a grid of step eps0 composes
without rounding error. An RDP figure is reported beside it as a cross-check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import dp_accounting
import numpy as np
from dp_accounting import gaussian_mechanism
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from dpdistill.errors import BudgetExceededError, PrivacyParameterError

ACCOUNTANT_NAME = "dp-accounting, exact (analytic Gaussian; PLD for randomized response)"


@dataclass(frozen=True)
class GaussianQuery:
    """One Gaussian-noised answer, described by noise std / L2 sensitivity."""

    noise_multiplier: float

    def __post_init__(self) -> None:
        if not self.noise_multiplier > 0 or not math.isfinite(self.noise_multiplier):
            raise PrivacyParameterError(f"noise multiplier must be positive and finite, got {self.noise_multiplier}")

    def dp_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.GaussianDpEvent(self.noise_multiplier)

    def epsilon(self, count: int, delta: float) -> float:
        return gaussian_mechanism.get_epsilon_gaussian(self.noise_multiplier / math.sqrt(count), delta)

    def rdp_accountant(self) -> dp_accounting.rdp.RdpAccountant:
        return dp_accounting.rdp.RdpAccountant()


@dataclass(frozen=True)
class RandomizedResponseQuery:
    """One k-ary randomized-response answer with parameter eps0 (eps0-label-DP on its own)."""

    epsilon0: float
    num_candidates: int

    def __post_init__(self) -> None:
        if not self.epsilon0 > 0 or not math.isfinite(self.epsilon0):
            raise PrivacyParameterError(f"randomized-response epsilon must be positive and finite, got {self.epsilon0}")
        if self.num_candidates < 2:
            raise PrivacyParameterError(f"randomized response needs at least 2 candidates, got {self.num_candidates}")

    @property
    def noise_parameter(self) -> float:
        """dp-accounting's parameterisation: probability of answering a uniformly random bucket."""
        return self.num_candidates / (math.exp(self.epsilon0) + self.num_candidates - 1)

    def dp_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.RandomizedResponseDpEvent(self.noise_parameter, self.num_candidates)

    def epsilon(self, count: int, delta: float) -> float:
        # Under the true label the loss is +eps0 w.p. p, -eps0 w.p. q, 0 on the k - 2 other buckets.
        p_true = math.exp(self.epsilon0) / (math.exp(self.epsilon0) + self.num_candidates - 1)
        p_other = 1.0 / (math.exp(self.epsilon0) + self.num_candidates - 1)
        pmf = {1: p_true, -1: p_other}
        if self.num_candidates > 2:
            pmf[0] = (self.num_candidates - 2) * p_other
        single = pld_lib.PrivacyLossDistribution.create_from_rounded_probability(pmf, 0.0, self.epsilon0)
        composed = single.self_compose(count) if count > 1 else single
        return composed.get_epsilon_for_delta(delta)

    def rdp_accountant(self) -> dp_accounting.rdp.RdpAccountant:
        # dp-accounting supports randomized response only under replace-one neighbours, which is ours.
        return dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)


QuerySpec = GaussianQuery | RandomizedResponseQuery


def validate_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise PrivacyParameterError(f"delta must be in (0, 1), got {delta}")


def validate_epsilon(epsilon: float) -> None:
    if not epsilon > 0 or not math.isfinite(epsilon):
        raise PrivacyParameterError(f"epsilon must be positive and finite, got {epsilon}")


def composed_epsilon(query: QuerySpec, count: int, delta: float) -> float:
    """Sound (eps, delta) of `count` answers of `query`."""
    validate_delta(delta)
    if count <= 0:
        return 0.0
    return float(query.epsilon(count, delta))


def composed_epsilon_rdp(query: QuerySpec, count: int, delta: float) -> float:
    """The RDP accountant's (looser) figure for the same composition: a cross-check of the PLD figure."""
    validate_delta(delta)
    if count <= 0:
        return 0.0
    accountant = query.rdp_accountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(query.dp_event(), count))
    return float(accountant.get_epsilon(delta))


def _largest_true_int(predicate: Callable[[int], bool], upper: int) -> int:
    """Largest n in [0, upper] with predicate(n) true, for a predicate that holds up to a point.

    Gallops up from 1 before bisecting, so it never evaluates counts far beyond the answer (a PLD over a
    billion compositions would not fit in memory).
    """
    low, high = 0, 1  # predicate(0) holds: zero queries cost nothing
    while predicate(high):
        low = high
        if high >= upper:
            return upper
        high = min(2 * high, upper)
    while high - low > 1:
        middle = (low + high) // 2
        if predicate(middle):
            low = middle
        else:
            high = middle
    return low


def max_queries(query: QuerySpec, epsilon: float, delta: float, upper: int = 10**8) -> int:
    """The most answers of `query` whose composition stays within (epsilon, delta)."""
    validate_epsilon(epsilon)
    return _largest_true_int(lambda n: composed_epsilon(query, n, delta) <= epsilon, upper)


def calibrate_randomized_response(count: int, num_candidates: int, epsilon: float, delta: float) -> RandomizedResponseQuery:
    """Largest per-query eps0 (to 0.01%, on the safe side) with which `count` answers stay within (epsilon, delta)."""
    validate_epsilon(epsilon)
    validate_delta(delta)

    def fits(epsilon0: float) -> bool:
        return composed_epsilon(RandomizedResponseQuery(epsilon0, num_candidates), count, delta) <= epsilon

    safe, unsafe = 1e-9, epsilon  # one answer at eps0 = epsilon already spends about epsilon
    if fits(unsafe):
        return RandomizedResponseQuery(unsafe, num_candidates)
    if not fits(safe):
        raise PrivacyParameterError(f"cannot reach epsilon={epsilon} with {count} randomized-response queries")
    for _ in range(100):
        middle = math.sqrt(safe * unsafe)
        if fits(middle):
            safe = middle
        else:
            unsafe = middle
        if abs(safe - unsafe) <= 1e-4 * safe:
            break
    return RandomizedResponseQuery(safe, num_candidates)


def calibrate_gaussian(count: int, epsilon: float, delta: float) -> GaussianQuery:
    """Smallest noise multiplier with which `count` Gaussian answers stay within (epsilon, delta).

    Exact: the composition is one Gaussian of multiplier z / sqrt(count), calibrated analytically; a relative
    margin of 1e-9 absorbs the solver's tolerance so the result never overspends.
    """
    validate_epsilon(epsilon)
    validate_delta(delta)
    query = GaussianQuery(gaussian_mechanism.get_sigma_gaussian(epsilon, delta) * math.sqrt(count) * (1 + 1e-9))
    if composed_epsilon(query, count, delta) > epsilon:
        raise PrivacyParameterError(f"could not calibrate Gaussian noise to epsilon={epsilon} for {count} queries")
    return query


def paper_epsilon_dpsd_data(beta: float, num_classes: int, batch_size: int, iterations: int, sigma: float,
                            delta: float) -> float:
    """DPSD's Theorem 1, minimised over the RDP order q. NOT a privacy guarantee (kept for comparison only).

    It keeps a beta^2 factor that cancels in a correct analysis (the noise std is sigma * beta), so it reports
    far smaller epsilons than the mechanism has.
    """
    validate_delta(delta)
    orders = 1.0 + np.logspace(-4, 7, 20001)
    values = (2 * beta**2 * num_classes * batch_size * iterations * orders / sigma**2
              + np.log((orders - 1) / orders) - (math.log(delta) + np.log(orders)) / (orders - 1))
    return float(values.min())


@dataclass
class PrivacyLedger:
    """Counts answered queries and refuses any that would take the run past its cap.

    The cap is fixed when the run is planned (the largest number of queries the budget affords), so the check
    per batch is an integer comparison; epsilon is monotone in the number of queries.
    """

    query: QuerySpec
    max_queries: int
    answered: int = 0

    def charge(self, count: int) -> None:
        """Record `count` answers before they are computed; raise if that would exceed the budget."""
        if self.answered + count > self.max_queries:
            raise BudgetExceededError(
                f"answering {count} more queries would exceed the privacy budget "
                f"({self.answered} of at most {self.max_queries} already answered)"
            )
        self.answered += count

    def epsilon(self, delta: float) -> float:
        return composed_epsilon(self.query, self.answered, delta)
