"""From a privacy budget and a planned number of teacher queries to a concrete mechanism, or a refusal.

Two accountings exist. `sound` (the default) spends the budget as measured by dp-accounting (`accounting.py`).
`paper` reproduces the papers' tables: the budget is measured with the paper's formula (DPSD Theorem 1 for data
mode, Theorem 2's per-query label-DP reading for label mode); the sound epsilon is still computed and reported
next to it, because the paper's figure is not a guarantee.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import dp_accounting

from dpdistill.errors import BudgetExceededError, PrivacyParameterError
from dpdistill.privacy.accounting import (
    ACCOUNTANT_NAME,
    DiscreteGaussianQuery,
    DiscreteLaplaceQuery,
    GaussianQuery,
    PrivacyLedger,
    QuerySpec,
    RandomizedResponseQuery,
    Cost,
    calibrate,
    composed_epsilon,
    composed_epsilon_rdp,
    max_queries,
    own_cost,
    paper_epsilon_dpsd_data,
    validate_delta,
    validate_epsilon,
)
from dpdistill.privacy import preflight
from dpdistill.privacy.preflight import gradient_advice, response_advice, vote_advice

PrivacyMode = Literal["data", "label", "none"]
# A teacher's (or one member's) answers can change arbitrarily when one of its examples changes, and with keyed
# partitions adding, removing or replacing an example touches one member only: the sensitivity, and so epsilon,
# is the same under both neighbouring relations.
SAME_UNDER_BOTH = {"relation": "replace-one",
                   "relation_note": "one private example changes one teacher's (or one member's) answers whether it "
                                    "is added, removed or replaced: the same epsilon under add/remove"}
Accounting = Literal["sound", "paper"]


@dataclass(frozen=True)
class PrivacyRequest:
    """What the user asked for: a mode, a budget, and optionally a fixed noise level."""

    mode: PrivacyMode
    epsilon: float | None
    delta: float = 1e-5
    accounting: Accounting = "sound"
    sigma: float | None = None  # data mode: noise std is sigma * beta; votes: the discrete Gaussian's sigma on
    # each count; None = calibrate to the budget
    beta: float = 1e-3  # data mode: bound on each answer's L2 norm
    epsilon0: float | None = None  # label mode: per-query randomized-response epsilon; None = calibrate
    num_candidates: int = 3  # label mode: k, the size of the candidate set
    sensitivity_factor: float = 2.0  # answers of norm <= beta differ by <= 2 beta between any two teachers
    teachers: int = 1  # members of the teacher ensemble; label mode with more than one aggregates noisy votes
    vote_noise: str = "gaussian"  # votes: "gaussian" (GNMax, sigma its std) or "laplace" (LNMax, sigma its scale,
    # an integer)
    accept_noise: bool = False  # run even where the answers would be near random (privacy/preflight.py)

    @property
    def votes(self) -> bool:
        """Label mode over an ensemble: discrete Gaussian noise on vote counts (GNMax) instead of randomized
        response."""
        return self.mode == "label" and self.teachers > 1

    @property
    def sensitivity(self) -> float:
        """L2 distance between the answers on neighbouring data sets, in the unit the noise std is given in:
        2 (times beta) for bounded gradients, sqrt(2) for vote counts (one member moves two counts by one)."""
        return math.sqrt(2) if self.votes else self.sensitivity_factor

    def validate(self, num_classes: int) -> None:
        if self.mode not in ("data", "label", "none"):
            raise PrivacyParameterError(f"unknown privacy mode {self.mode!r}: choose data, label or none")
        if self.accounting not in ("sound", "paper"):
            raise PrivacyParameterError(f"unknown accounting {self.accounting!r}: choose sound or paper")
        if self.mode == "none":
            return
        if self.epsilon is None:
            raise PrivacyParameterError("a privacy budget --epsilon is required (or --privacy none)")
        validate_epsilon(self.epsilon)
        validate_delta(self.delta)
        if self.sigma is not None and not (self.sigma > 0 and math.isfinite(self.sigma)):
            raise PrivacyParameterError(f"sigma must be positive, got {self.sigma}")
        if not self.beta > 0:
            raise PrivacyParameterError(f"the norm bound beta must be positive, got {self.beta}")
        if self.epsilon0 is not None:
            validate_epsilon(self.epsilon0)
        if self.teachers < 1:
            raise PrivacyParameterError(f"an ensemble has at least one teacher, got {self.teachers}")
        if self.votes and self.accounting == "paper":
            raise PrivacyParameterError("paper accounting has no formula for an ensemble's noisy votes; use the "
                                        "sound accounting")
        if self.vote_noise not in ("gaussian", "laplace"):
            raise PrivacyParameterError(f"unknown vote noise {self.vote_noise!r}: choose gaussian or laplace")
        if self.vote_noise == "laplace" and self.sigma is not None and self.sigma != int(self.sigma):
            raise PrivacyParameterError(f"the discrete Laplace scale must be a whole number, got {self.sigma}")
        if self.votes and self.epsilon0 is not None:
            raise PrivacyParameterError("--epsilon0 sets randomized response for one teacher; an ensemble's labels "
                                        "are noisy votes: set their noise with --sigma, or leave it calibrated")
        if not 2 <= self.num_candidates <= num_classes:
            raise PrivacyParameterError(
                f"top-k must be between 2 and the number of classes ({num_classes}), got {self.num_candidates}"
            )


@dataclass(frozen=True)
class PrivacyPlan:
    """A mechanism fixed for a run, how many queries it may answer, and how to report what it spent."""

    request: PrivacyRequest
    query: QuerySpec | None
    planned_queries: int
    max_queries: int
    num_classes: int
    batch_size: int

    @property
    def sigma(self) -> float | None:
        if isinstance(self.query, GaussianQuery):
            return self.query.noise_multiplier * self.request.sensitivity
        if isinstance(self.query, DiscreteGaussianQuery):
            return self.query.sigma
        if isinstance(self.query, DiscreteLaplaceQuery):
            return self.query.scale
        return None

    @property
    def epsilon0(self) -> float | None:
        return self.query.epsilon0 if isinstance(self.query, RandomizedResponseQuery) else None

    def near_random(self) -> str | None:
        """Why these answers would carry nothing, from public quantities alone (privacy/preflight.py); None where
        they need not."""
        request = self.request
        if self.query is None:
            return None
        if isinstance(self.query, RandomizedResponseQuery):
            return response_advice(self.query.epsilon0, self.query.num_candidates)
        if request.votes:
            return vote_advice(self.sigma, request.teachers, request.num_candidates, request.vote_noise,
                               "the ensemble")
        return gradient_advice(self.planned_queries, self.sigma, request.teachers, self.num_classes)

    def refuse_near_random(self) -> None:
        """Refuse a run whose answers would be near random, before it spends anything, unless accepted."""
        preflight.refuse_near_random(self.near_random(), self.request.accept_noise)

    def epsilon(self, count: int) -> float:
        """Sound epsilon of `count` answers: infinite without a mechanism (the teacher read unprotected)."""
        return math.inf if self.query is None else composed_epsilon(self.query, count, self.request.delta)

    def release_event(self, count: int) -> dp_accounting.DpEvent:
        """The dp-accounting event of `count` answers, what a teacher's release ledger records."""
        if self.query is None:
            return dp_accounting.NonPrivateDpEvent()
        if count == 0:
            return dp_accounting.NoOpDpEvent()
        return dp_accounting.SelfComposedDpEvent(self.query.dp_event(), count)

    def ledger(self, answered: int = 0) -> PrivacyLedger | None:
        if self.query is None:
            return None
        return PrivacyLedger(self.query, self.max_queries, answered)

    def paper_epsilon(self, answered: int) -> float | None:
        """The seed paper's figure for `answered` queries (not a guarantee)."""
        if self.query is None:
            return None
        if isinstance(self.query, RandomizedResponseQuery):
            return self.query.epsilon0
        if self.request.votes:
            return None  # no seed states a formula for noisy votes over the student's candidates
        iterations = answered / self.batch_size
        return paper_epsilon_dpsd_data(self.request.beta, self.num_classes, self.batch_size, iterations,
                                       self.sigma, self.request.delta)

    def summary(self, answered: int) -> dict:
        """The `privacy` section of a report."""
        request = self.request
        if self.query is None:
            return {"mode": "none", "epsilon": math.inf, "delta": None, "queries": answered, **SAME_UNDER_BOTH,
                    "epsilon_replace_one": math.inf, "epsilon_add_remove": math.inf,
                    "guarantee": "none: the student is trained on the teacher's unprotected answers"}
        epsilon = self.epsilon(answered)
        summary = {
            "mode": request.mode,
            "epsilon": epsilon,
            **SAME_UNDER_BOTH,
            "epsilon_replace_one": epsilon,
            "epsilon_add_remove": epsilon,
            "epsilon_rdp": composed_epsilon_rdp(self.query, answered, request.delta),
            "delta": request.delta,
            "accountant": ACCOUNTANT_NAME,
            "accounting": request.accounting,
            "budget_epsilon": request.epsilon,
            "queries": answered,
            "max_queries": self.max_queries,
            "paper_epsilon": self.paper_epsilon(answered),
            "paper_epsilon_label": ("paper formula (DPSD Theorem 1 = DPDFD Theorem 3), NOT a guarantee" if request.mode == "data"
                                    else "paper reading (DPSD Theorem 2, SRR: per-query eps0), NOT a guarantee"),
            "teachers": request.teachers,
        }
        if request.mode == "data":
            summary.update(sigma=self.sigma, beta=request.beta, noise_std=self.sigma * request.beta,
                           noise_multiplier=self.query.noise_multiplier)
        elif request.votes:
            summary.update(aggregation="noisy plurality of the members' votes among the student's top-k (GNMax, "
                                       "exact discrete Gaussian noise on the integer counts)",
                           sigma=self.sigma, noise_std=getattr(self.query, "noise_std", self.sigma),
                           noise_multiplier=self.query.noise_multiplier,
                           num_candidates=request.num_candidates)
        else:
            summary.update(epsilon0=self.query.epsilon0, num_candidates=self.query.num_candidates,
                           label_dp_per_query_epsilon=self.query.epsilon0)
        return summary


def plan_privacy(request: PrivacyRequest, num_classes: int, batch_size: int, iterations: int,
                 cost: Cost | None = None) -> PrivacyPlan:
    """Fix the mechanism for `iterations` x `batch_size` queries; refuse plans that cannot meet the budget. `cost`
    is what the answers spend against the budget (default: their own epsilon; with a sample source, its release
    composed with them): the noise is calibrated and the queries capped by it (sound accounting only)."""
    request.validate(num_classes)
    planned = batch_size * iterations
    if request.mode == "none":
        return PrivacyPlan(request, None, planned, planned, num_classes, batch_size)
    if cost is not None and request.accounting == "paper":
        raise PrivacyParameterError("a sample source's release composes with the run's by sound accounting only: "
                                    "use --accounting sound")
    cost = cost or own_cost(request.delta)
    query = _choose_query(request, num_classes, batch_size, iterations, cost)
    if request.accounting == "paper":
        cap = _paper_max_queries(request, query, num_classes, batch_size, planned)
    else:
        cap = max_queries(query, request.epsilon, request.delta, upper=max(planned, 1) * 4, guess=planned, cost=cost)
    if cap < planned:
        spent = cost(query, planned)
        raise BudgetExceededError(
            f"the plan needs {planned} teacher queries ({iterations} iterations x batch {batch_size}), which would "
            f"spend epsilon={spent:.4g} ({request.accounting} accounting) > budget {request.epsilon}; the budget "
            f"affords {cap} queries ({cap // batch_size} iterations). Lower --iterations, raise --sigma, "
            f"or leave --sigma/--epsilon0 unset to calibrate the noise to the budget."
        )
    return PrivacyPlan(request, query, planned, cap, num_classes, batch_size)


def _choose_query(request: PrivacyRequest, num_classes: int, batch_size: int, iterations: int,
                  cost: Cost) -> QuerySpec:
    planned = batch_size * iterations
    if request.votes and request.vote_noise == "laplace":
        if request.sigma is not None:
            return DiscreteLaplaceQuery(int(request.sigma))
        return calibrate(lambda scale: DiscreteLaplaceQuery(math.ceil(scale)), planned, request.epsilon,
                         request.delta, start=2 * planned / request.epsilon, cost=cost)
    if request.votes:
        if request.sigma is not None:
            return DiscreteGaussianQuery(request.sigma)
        # the continuous Gaussian of the same sigma spends a hair less: the search starts there
        continuous = calibrate(GaussianQuery, planned, request.epsilon, request.delta, cost=cost).noise_multiplier
        return calibrate(DiscreteGaussianQuery, planned, request.epsilon, request.delta,
                         start=continuous * request.sensitivity, cost=cost)
    if request.mode == "data":
        if request.sigma is not None:
            return GaussianQuery(request.sigma / request.sensitivity)
        if request.accounting == "paper":
            raise PrivacyParameterError("paper accounting needs a fixed --sigma (the paper preset sets 100)")
        return calibrate(GaussianQuery, planned, request.epsilon, request.delta, cost=cost)
    if request.epsilon0 is not None:
        return RandomizedResponseQuery(request.epsilon0, request.num_candidates)
    if request.accounting == "paper":
        # The paper's reading: each label is eps-label-DP, whatever the number of queries.
        return RandomizedResponseQuery(request.epsilon, request.num_candidates)
    # the noise parameter of randomized response is 1 / eps0; one answer at eps0 = epsilon spends about epsilon
    return calibrate(lambda noise: RandomizedResponseQuery(1 / noise, request.num_candidates), planned,
                     request.epsilon, request.delta, start=1 / request.epsilon, cost=cost)


def _paper_max_queries(request: PrivacyRequest, query: QuerySpec, num_classes: int, batch_size: int,
                       planned: int) -> int:
    """Queries allowed when the budget is measured with the paper's formula (reproduction only)."""
    if isinstance(query, RandomizedResponseQuery):
        return planned if query.epsilon0 <= request.epsilon else 0
    sigma = query.noise_multiplier * request.sensitivity_factor
    iterations = planned // batch_size
    fits = paper_epsilon_dpsd_data(request.beta, num_classes, batch_size, iterations, sigma, request.delta)
    return planned if fits <= request.epsilon else 0
