"""Sound privacy accounting on dp-accounting, plus the papers' formulas for comparison only.

Neighbouring relation: the private data trained the teacher(s) without DP, so a change of one private example
can change every answer of the teacher it touched. Every query is therefore charged at the mechanism's full
sensitivity and all queries compose. The per-query mechanisms are:

- `GaussianQuery`: an answer of L2 sensitivity Delta plus N(0, std^2) noise, described by its noise multiplier
  std / Delta. DPSD data mode: answers of norm <= beta differ by <= 2 beta, noise std sigma * beta, so the
  multiplier is sigma / 2.
- `RandomizedResponseQuery`: k-ary randomized response with parameter eps0 (label mode).
- `DiscreteGaussianQuery`: an ensemble's vote histogram plus exact discrete Gaussian noise on each count (GNMax
  over integer counts): one example moves one member's vote, so two counts change by one.
- `DiscreteLaplaceQuery`: the same histogram with exact discrete Laplace noise instead (LNMax, DGD's aggregation).
- `DistributedDiscreteGaussianQuery`: the same kind of integer answer summed over data owners by secure
  aggregation, each owner adding a share of the noise (federated runs).

The private-training baselines (`dpdistill train-private`) read the private data themselves; a query is one step:

- `SampledGaussianQuery`: a DP-SGD step (Poisson-subsampled Gaussian on a sum of clipped gradients), by
  dp-accounting's PLD accountant; add-or-remove-one neighbours by default, as in Opacus, or replace-one (the
  relation of every other route here), under which the same noise costs more.
- `SampledReleaseQuery`: a step of per-example noisy answers (dpdfd-direct), exact without amplification by
  subsampling, because each answer shows that its example took part.

Epsilons are exact, from dp-accounting: N Gaussians with multiplier z compose to one Gaussian with multiplier
z / sqrt(N), whose (eps, delta) curve dp-accounting computes analytically; the privacy loss of randomized response
takes only the values -eps0, 0, +eps0, so its privacy-loss distribution (PLD) on a grid of step eps0 composes
without rounding error. The discrete Gaussian has no closed form: its PLD is discretised pessimistically, so its
epsilon is an upper bound. An RDP figure is reported beside each as a cross-check.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from typing import Callable, TypeVar

import dp_accounting
import numpy as np
import scipy.optimize
import scipy.special
import scipy.stats
from dp_accounting import gaussian_mechanism
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from dpdistill.errors import BudgetExceededError, PrivacyParameterError
from dpdistill.privacy.gaussian_pld import sampled_gaussian_pld

ACCOUNTANT_NAME = ("dp-accounting, exact (analytic Gaussian; PLD for randomized response) or an upper bound "
                   "(pessimistic PLD for discrete-Gaussian votes)")


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
        return _pld_epsilon(single.self_compose(count) if count > 1 else single, delta)

    def rdp_accountant(self) -> dp_accounting.rdp.RdpAccountant:
        # dp-accounting supports randomized response only under replace-one neighbours, which is ours.
        return dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)


ADD_REMOVE, REPLACE_ONE = "add-remove", "replace-one"
NEIGHBOURING_RELATIONS = {ADD_REMOVE: dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
                          REPLACE_ONE: dp_accounting.NeighboringRelation.REPLACE_ONE}


def epsilon_key(relation: str) -> str:
    """A report's key of the epsilon under `relation`: epsilon_add_remove or epsilon_replace_one."""
    return f"epsilon_{relation.replace('-', '_')}"


def validate_relation(relation: str) -> None:
    if relation not in NEIGHBOURING_RELATIONS:
        raise PrivacyParameterError(f"unknown neighbouring relation {relation!r}: choose one of "
                                    f"{', '.join(NEIGHBOURING_RELATIONS)}")


@dataclass(frozen=True)
class DiscreteGaussianQuery:
    """One vote histogram plus exact discrete Gaussian noise N_Z(0, sigma^2) on each count (GNMax on integers).

    One example changes one member's vote: two counts move by one, each a discrete Gaussian mechanism of
    sensitivity 1, so a query's privacy loss is that of two such mechanisms composed. `epsilon` is the smaller
    of two proven upper bounds: dp-accounting's pessimistic PLD of the discrete Gaussian (connect-the-dots), on a
    grid a hundred times finer than a query's privacy-loss spread, so that its rounding stays near 0.01% at any
    sigma and count, and the RDP bound of the continuous Gaussian of multiplier sigma / sqrt(2), which holds for
    the discrete one through zero-concentrated DP (Canonne, Kamath and Steinke 2020). A continuous Gaussian PLD
    is NOT a proven bound for the discrete mechanism.
    """

    sigma: float
    discrete = True  # integer answers: a ledger must not account them as a continuous Gaussian

    def __post_init__(self) -> None:
        if not self.sigma > 0 or not math.isfinite(self.sigma):
            raise PrivacyParameterError(f"the vote noise sigma must be positive and finite, got {self.sigma}")

    @property
    def noise_multiplier(self) -> float:
        """sigma / L2 sensitivity (sqrt 2): the continuous Gaussian with the same zCDP."""
        return self.sigma / math.sqrt(2)

    def dp_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.GaussianDpEvent(self.noise_multiplier)

    def epsilon(self, count: int, delta: float) -> float:
        return min(self._pld_epsilon(count, delta), composed_epsilon_rdp(self, count, delta))

    def _pld_epsilon(self, count: int, delta: float) -> float:
        interval = math.sqrt(2) / self.sigma / 100  # a hundredth of the spread of a query's privacy loss
        single = pld_lib.from_discrete_gaussian_mechanism(self.sigma, sensitivity=1, use_connect_dots=True,
                                                          value_discretization_interval=interval)
        query = single.compose(single)  # the two counts that move
        return _pld_epsilon(query.self_compose(count), delta)

    def rdp_accountant(self) -> dp_accounting.rdp.RdpAccountant:
        return dp_accounting.rdp.RdpAccountant()


@dataclass(frozen=True)
class DiscreteLaplaceQuery:
    """One vote histogram plus exact discrete Laplace noise, P(x) proportional to exp(-|x| / scale), on each count
    (PATE's LNMax; DGD's Lap(2 / eps0) with 2 / eps0 = 40).

    One example moves two counts by one: L1 sensitivity 2, so a query is (2 / scale)-DP. `epsilon` is the smaller
    of two proven bounds: dp-accounting's PLD of the discrete Laplace mechanism (its privacy losses take the values
    -1/scale, 0 and 1/scale only, so the grid is exact) for the two counts composed, and the RDP of pure DP
    through zero-concentrated DP (Bun and Steinke 2016: eps0-DP is eps0^2 / 2-zCDP, the RDP curve of a Gaussian
    with multiplier 1 / eps0), which is also what a ledger composes. The scale is an integer: the exact sampler
    takes one.
    """

    scale: int
    discrete = True  # integer answers: a ledger must not account them as a continuous mechanism

    def __post_init__(self) -> None:
        if not isinstance(self.scale, int) or self.scale < 1:
            raise PrivacyParameterError(f"the discrete Laplace scale must be a positive integer, got {self.scale}")

    @property
    def epsilon0(self) -> float:
        """Each answer's pure-DP epsilon: L1 sensitivity 2 over the scale."""
        return 2 / self.scale

    @property
    def noise_multiplier(self) -> float:
        """The continuous Gaussian whose RDP curve bounds this query's (through zCDP)."""
        return 1 / self.epsilon0

    @property
    def noise_std(self) -> float:
        """The discrete Laplace's standard deviation: sqrt(2 q) / (1 - q), q = exp(-1 / scale) (about scale sqrt 2)."""
        q = math.exp(-1 / self.scale)
        return math.sqrt(2 * q) / (1 - q)

    def dp_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.GaussianDpEvent(self.noise_multiplier)

    def epsilon(self, count: int, delta: float) -> float:
        single = pld_lib.from_discrete_laplace_mechanism(1 / self.scale, sensitivity=1,
                                                         value_discretization_interval=1 / self.scale)
        pld = _pld_epsilon(single.compose(single).self_compose(count), delta)
        return min(pld, count * self.epsilon0, composed_epsilon_rdp(self, count, delta))

    def rdp_accountant(self) -> dp_accounting.rdp.RdpAccountant:
        return dp_accounting.rdp.RdpAccountant()


@dataclass(frozen=True)
class DistributedDiscreteGaussianQuery:
    """One query answered by data owners through secure aggregation: each owner adds its own discrete Gaussian share
    N_Z(0, share_sigma^2) to its integer answer, and only the sum of at least `owners - dropouts` owners' answers is
    ever revealed (SecAgg+'s reconstruction threshold). An owner knows its own share, and `colluders` owners may
    pool theirs: against them only the other contributors' shares protect, so a query is charged at the fewest
    honest shares a revealed sum holds, owners - dropouts - colluders.

    The sum of n independent discrete Gaussians is not a discrete Gaussian; Kairouz, Liu and Steinke (2021, "The
    Distributed Discrete Gaussian Mechanism", Theorem 1) prove it (1/2) eps^2-concentrated DP with
    eps^2 = Delta_2^2 / (n share_sigma^2) + tau d / 2, tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 share_sigma^2 k / (k+1)),
    for an integer answer of L2 sensitivity Delta_2 in d coordinates. A query is charged at the worst n the
    threshold allows; zCDP rho bounds every RDP order by alpha rho, which is the RDP curve of the Gaussian with
    multiplier 1 / sqrt(2 rho): that event, on the RDP accountant only (a Gaussian PLD is no proven bound here).
    """

    share_sigma: float
    sensitivity: float  # L2, in the integer units of the answers
    dimension: int  # coordinates of one query's answer
    owners: int
    dropouts: int = 0
    colluders: int = 0  # owners whose shares the adversary may know (each owner knows its own)
    discrete = True  # integer answers: a ledger must not account them as a continuous Gaussian

    def __post_init__(self) -> None:
        if not self.share_sigma > 0 or not math.isfinite(self.share_sigma):
            raise PrivacyParameterError(f"the noise share sigma must be positive and finite, got {self.share_sigma}")
        if not self.sensitivity > 0 or self.dimension < 1:
            raise PrivacyParameterError("a distributed query needs a positive sensitivity and at least one coordinate")
        if not 0 <= self.dropouts < self.owners:
            raise PrivacyParameterError(f"{self.owners} owners tolerate 0 to {self.owners - 1} dropouts, "
                                        f"got {self.dropouts}")
        if not 0 <= self.colluders < self.owners - self.dropouts:
            raise PrivacyParameterError(f"{self.owners} owners with {self.dropouts} dropouts leave no honest share "
                                        f"against {self.colluders} colluders: at most {self.owners - self.dropouts - 1}")

    @property
    def honest(self) -> int:
        """The fewest shares in a revealed sum that the adversary does not know."""
        return self.owners - self.dropouts - self.colluders

    def rho(self) -> float:
        """zCDP of one query, at the fewest honest shares a revealed sum holds (the bound's worst case)."""
        return max(self._rho(summands) for summands in range(self.honest, self.owners - self.colluders + 1))

    def _rho(self, summands: int) -> float:
        exponents = [-2 * math.pi**2 * self.share_sigma**2 * k / (k + 1) for k in range(1, summands)]
        tau = 10 * math.exp(scipy.special.logsumexp(exponents)) if exponents else 0.0
        return self.sensitivity**2 / (2 * summands * self.share_sigma**2) + tau * self.dimension / 4

    @property
    def noise_multiplier(self) -> float:
        """The continuous Gaussian (unit sensitivity) whose RDP curve alpha * rho bounds this query's."""
        return 1 / math.sqrt(2 * self.rho())

    @property
    def total_sigma(self) -> float:
        """The noise std that protects a sum at the fewest honest shares: share_sigma sqrt(honest)."""
        return self.share_sigma * math.sqrt(self.honest)

    def dp_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.GaussianDpEvent(self.noise_multiplier)

    def epsilon(self, count: int, delta: float) -> float:
        return composed_epsilon_rdp(self, count, delta)

    def rdp_accountant(self) -> dp_accounting.rdp.RdpAccountant:
        return dp_accounting.rdp.RdpAccountant()


@dataclass(frozen=True)
class SampledGaussianQuery:
    """One DP-SGD step: each example joins the batch with probability `sample_rate` (Poisson sampling), and the sum
    of the batch's clipped per-example gradients gets Gaussian noise of `noise_multiplier` times the clipping norm.

    Neighbouring relation: add or remove one example by default (Opacus' and the DP-SGD literature's), or replace
    one (`relation="replace-one"`: the clipped sum moves by up to twice the clipping norm, which dp-accounting's PLD
    analyses exactly). `epsilon` is dp-accounting's PLD figure, pessimistic, so an upper bound, built as its
    `PLDAccountant` builds it with the grid's cut-offs computed at once (`gaussian_pld.py`); `discretization`
    trades its tightness for speed.
    """

    noise_multiplier: float
    sample_rate: float
    discretization: float = 1e-4
    relation: str = ADD_REMOVE

    def __post_init__(self) -> None:
        _validate_sampled(self.noise_multiplier, self.sample_rate)
        validate_relation(self.relation)

    def dp_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.PoissonSampledDpEvent(self.sample_rate, dp_accounting.GaussianDpEvent(self.noise_multiplier))

    def epsilon(self, count: int, delta: float) -> float:
        step = sampled_gaussian_pld(self.noise_multiplier, self.sample_rate, self.discretization,
                                    replace_one=self.relation == REPLACE_ONE)
        return _pld_epsilon(step.self_compose(count), delta)

    def rdp_accountant(self) -> dp_accounting.rdp.RdpAccountant:
        if self.relation != ADD_REMOVE:  # dp-accounting's RDP accountant has no replace-one subsampled Gaussian
            raise PrivacyParameterError("the RDP cross-check of DP-SGD exists only for add/remove neighbours")
        return dp_accounting.rdp.RdpAccountant()


@dataclass(frozen=True)
class SampledReleaseQuery:
    """One step of per-example releases (dpdfd-direct): each example joins the batch with probability
    `sample_rate`, and then its own answer plus Gaussian noise is released, tied to that example.

    No amplification by subsampling: the release shows whether the example took part, so a step's privacy loss
    is 0 or a full Gaussian's (replace-one neighbours; the noise multiplier is std / L2 sensitivity). Over
    `count` steps the example takes part K ~ Binomial(count, q) times, and delta(eps) = sum_k P(K = k) delta_k(eps)
    with delta_k the exact curve of k composed Gaussians (Balle & Wang 2018): exact, not a bound. dp-accounting's
    PoissonSampledDpEvent would assume the released batch hides whether the example was in it, which holds for a
    noisy sum (DP-SGD) but not for per-example answers.
    """

    noise_multiplier: float
    sample_rate: float

    def __post_init__(self) -> None:
        _validate_sampled(self.noise_multiplier, self.sample_rate)

    def dp_event(self) -> dp_accounting.DpEvent:
        """dp-accounting has no event for a step whose loss is 0 or a full Gaussian's: the full Gaussian bounds
        it (a ledger composing events counts every step as taken part; the stated epsilon is the exact one)."""
        return dp_accounting.GaussianDpEvent(self.noise_multiplier)

    def epsilon(self, count: int, delta: float) -> float:
        takes_part = np.arange(1, count + 1)
        log_weights = scipy.stats.binom.logpmf(takes_part, count, self.sample_rate)
        mu = np.sqrt(takes_part) / self.noise_multiplier

        def excess(epsilon: float) -> float:
            return scipy.special.logsumexp(log_weights + _log_gaussian_delta(mu, epsilon)) - math.log(delta)

        if excess(0.0) <= 0:
            return 0.0
        # Taking part in every step (the full composition) bounds every term, so its epsilon brackets the root.
        every_step = GaussianQuery(self.noise_multiplier).epsilon(count, delta) * (1 + 1e-6) + 1e-9
        root = scipy.optimize.brentq(excess, 0.0, every_step, xtol=1e-12)
        return root + 1e-9 * (1 + root)  # beyond brentq's tolerance: never below the exact epsilon


def _pld_epsilon(pld: pld_lib.PrivacyLossDistribution, delta: float) -> float:
    """dp-accounting's epsilon of a privacy-loss distribution, without its harmless overflow warning.

    Where the losses exceed about 709, dp-accounting's search divides by a probability mass that has underflowed
    to a subnormal and numpy warns of the overflow; the quotient becomes inf, so the search stops there and returns
    inf, an upper bound of an epsilon that is above 709 anyway (calibration probes such runs first: eps0 = epsilon
    on every answer). No figure within any budget changes.
    """
    with np.errstate(over="ignore"):
        return pld.get_epsilon_for_delta(delta)


def _validate_sampled(noise_multiplier: float, sample_rate: float) -> None:
    GaussianQuery(noise_multiplier)  # the same check of the multiplier
    if not 0 < sample_rate <= 1:
        raise PrivacyParameterError(f"the sampling rate must be in (0, 1], got {sample_rate}")


def _log_gaussian_delta(mu: np.ndarray, epsilon: float) -> np.ndarray:
    """log delta(eps) of Gaussian mechanisms with mu = sensitivity / noise std, vectorised (Balle & Wang 2018)."""
    head = scipy.stats.norm.logcdf(mu / 2 - epsilon / mu)
    tail = epsilon + scipy.stats.norm.logcdf(-mu / 2 - epsilon / mu)
    with np.errstate(divide="ignore"):  # delta = 0 where the two terms cancel: log 0 = -inf
        return head + np.log1p(-np.exp(np.minimum(tail - head, 0.0)))


QuerySpec = (GaussianQuery | RandomizedResponseQuery | DiscreteGaussianQuery | DiscreteLaplaceQuery
             | DistributedDiscreteGaussianQuery | SampledGaussianQuery | SampledReleaseQuery)
Q = TypeVar("Q", bound=QuerySpec)
# What a plan spends with `count` answers of a query: their own epsilon, or (a sample source's release composed
# with them) the run's total. Calibration and the query cap search against it.
Cost = Callable[[QuerySpec, int], float]


def validate_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise PrivacyParameterError(f"delta must be in (0, 1), got {delta}")


def validate_epsilon(epsilon: float) -> None:
    if not epsilon > 0 or not math.isfinite(epsilon):
        raise PrivacyParameterError(f"epsilon must be positive and finite, got {epsilon}")


@functools.lru_cache(maxsize=4096)
def composed_epsilon(query: QuerySpec, count: int, delta: float) -> float:
    """Sound (eps, delta) of `count` answers of `query`. Kept per (query, count, delta), which fix it: a PLD figure
    takes up to seconds, and a run asks for the same one when it plans, reports and records its release."""
    validate_delta(delta)
    if count <= 0:
        return 0.0
    return float(query.epsilon(count, delta))


def composed_epsilon_rdp(query: QuerySpec, count: int, delta: float) -> float:
    """The RDP accountant's (looser) figure for the same composition: a cross-check of the PLD figure."""
    validate_delta(delta)
    if count <= 0:
        return 0.0
    return rdp_epsilon(query.rdp_accountant(), dp_accounting.SelfComposedDpEvent(query.dp_event(), count), delta)


def rdp_epsilon(accountant: dp_accounting.rdp.RdpAccountant, event: dp_accounting.DpEvent, delta: float) -> float:
    """Epsilon of `event` by a fresh RDP `accountant`."""
    absl = logging.getLogger("absl")  # at small noise a few fractional orders do not converge and are skipped,
    level = absl.level  # which only loosens the bound: not worth a warning per order on the user's screen
    absl.setLevel(logging.ERROR)
    try:
        accountant.compose(event)
        return float(accountant.get_epsilon(delta))
    finally:
        absl.setLevel(level)


def _largest_true_int(predicate: Callable[[int], bool], upper: int, low: int = 0) -> int:
    """Largest n in [low, upper] with predicate(n) true, for a predicate that holds up to a point and at `low`.

    Gallops up from `low` in steps 1, 2, 4, ... before bisecting, so it never evaluates counts far beyond the
    answer (a PLD over a billion compositions would not fit in memory), and few when `low` is near it.
    """
    if low >= upper:
        return upper
    step, high = 1, low + 1  # predicate(0) holds: zero queries cost nothing
    while predicate(high):
        low = high
        if high >= upper:
            return upper
        step *= 2
        high = min(low + step, upper)
    while high - low > 1:
        middle = (low + high) // 2
        if predicate(middle):
            low = middle
        else:
            high = middle
    return low


def max_queries(query: QuerySpec, epsilon: float, delta: float, upper: int = 10**8, guess: int = 0,
                cost: Cost | None = None) -> int:
    """The most answers of `query` whose composition (by `cost`: their own by default) stays within
    (epsilon, delta). A `guess` near the answer (a calibrated plan's count) only saves evaluations: the search
    continues up from it when it fits."""
    validate_epsilon(epsilon)
    spent = cost or own_cost(delta)

    def fits(count: int) -> bool:
        return spent(query, count) <= epsilon

    return _largest_true_int(fits, upper, guess if 0 < guess <= upper and fits(guess) else 0)


def dpsgd_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float, accountant: str = "pld",
                  discretization: float = 1e-4, relation: str = ADD_REMOVE) -> float:
    """Epsilon of `steps` DP-SGD steps: PoissonSampledDpEvent(q, GaussianDpEvent(z)) self-composed, by
    dp-accounting's PLD accountant (the guarantee, under either relation) or its RDP accountant (the looser
    cross-check, add/remove only)."""
    query = SampledGaussianQuery(noise_multiplier, sample_rate, discretization, relation)
    if accountant == "pld":
        return composed_epsilon(query, steps, delta)
    if accountant == "rdp":
        return composed_epsilon_rdp(query, steps, delta)
    raise ValueError(f"unknown accountant {accountant!r}: choose pld or rdp")


def own_cost(delta: float) -> Cost:
    """The epsilon of a query's answers alone, at `delta`."""
    return lambda query, count: composed_epsilon(query, count, delta)


def calibrate(query_of: Callable[[float], Q], count: int, epsilon: float, delta: float, start: float = 1.0,
              tolerance: float = 1e-4, cost: Cost | None = None, guess: float | None = None) -> Q:
    """The query with the least noise whose `count` answers stay within (epsilon, delta): one search for every
    mechanism, so each is calibrated the same way and on the safe side.

    `query_of` maps a noise parameter (larger: more noise, a smaller epsilon) to a query: a noise multiplier or
    sigma itself, or 1 / eps0 for randomized response. The answer lies on the grid start * (1 + tolerance)^n
    (within a factor of a million of `start`), so it is within a factor 1 + tolerance of the least noise that fits,
    never below it. The search gallops from the grid point nearest `guess` (default: `start`) in whichever direction is
    needed and then bisects, so it evaluates the (sometimes costly) composed epsilon only near the answer; a guess
    close to it (the figure of a similar mechanism that is cheap to account) leaves two or three evaluations and
    the same answer, as the grid does not move with it. `cost` measures what the answers spend (default: their
    own epsilon).
    """
    validate_epsilon(epsilon)
    validate_delta(delta)
    ratio = 1 + tolerance
    limit = int(math.log(1e6) / math.log(ratio))  # search at most a factor of a million either way
    spent = cost or own_cost(delta)
    origin = 0 if guess is None else min(max(round(math.log(guess / start) / math.log(ratio)), -limit), limit)

    def fits(steps: int) -> bool:
        return spent(query_of(start * ratio**steps), count) <= epsilon

    if fits(origin):
        steps = origin - _largest_true_int(lambda down: fits(origin - down), origin + limit)
    else:
        steps = origin + _largest_true_int(lambda up: not fits(origin + up), limit - origin) + 1
        if steps > limit:
            raise PrivacyParameterError(f"no noise up to {start * ratio**limit:.3g} fits epsilon={epsilon} over "
                                        f"{count} queries")
    return query_of(start * ratio**steps)


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
