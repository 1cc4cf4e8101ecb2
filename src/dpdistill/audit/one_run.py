"""The one-run audit of Steinke, Nasr and Jagielski (2023, "Privacy Auditing with One (1) Training Run").

m canaries are each included in the private data with probability 1/2, independently; the route runs once; every
canary gets a score from what was released (higher: more likely included). The auditor guesses "in" for the k_in
highest scores and "out" for the k_out lowest and abstains on the rest. Under (epsilon, delta)-DP the number of
right guesses among r = k_in + k_out is dominated by Binomial(r, e^eps / (1 + e^eps)), up to a delta term (their
Theorem 3.3 and its Proposition 5.2 form):

    P[right >= v] <= P[Bin(r, q) >= v] + 2 m delta max_{1 <= i <= v} P[v - i <= Bin(r, q) < v] / i,

so every epsilon whose p-value falls below 1 - confidence is refuted: the largest such epsilon is a lower bound
that holds with that confidence. The guess counts are fixed before the scores are seen, or searched over a grid
with the confidence split evenly among its points (Bonferroni), so the search costs confidence, not soundness.
With 1,000 canaries even a perfect attack certifies at most about 5.8: a one-run audit refutes a broken claim, it
does not confirm a large epsilon.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from dpdistill.errors import ConfigError

CONFIDENCE = 0.95
SEARCH_STEPS = 60  # bisection steps on epsilon: far below any reported precision


def p_value(canaries: int, guesses: int, right: int, epsilon: float, delta: float = 0.0) -> float:
    """The probability of at least `right` right guesses out of `guesses` under (epsilon, delta)-DP."""
    if not 0 <= right <= guesses <= canaries:
        raise ConfigError(f"an audit needs 0 <= right ({right}) <= guesses ({guesses}) <= canaries ({canaries})")
    q = 1 / (1 + math.exp(-epsilon))
    tail = float(stats.binom.sf(right - 1, guesses, q))  # P[Bin >= right]
    if delta == 0 or right == 0:
        return min(tail, 1.0)
    below = stats.binom.pmf(np.arange(right - 1, -1, -1), guesses, q).cumsum()  # P[right - i <= Bin < right], i = 1..
    worst = float(np.max(below / np.arange(1, right + 1)))
    return min(tail + 2 * canaries * delta * worst, 1.0)


def epsilon_lower_bound(canaries: int, guesses: int, right: int, delta: float = 0.0,
                        confidence: float = CONFIDENCE) -> float:
    """The largest epsilon refuted at `confidence` by `right` right guesses out of `guesses` (0: none is)."""
    level = 1 - confidence
    if p_value(canaries, guesses, right, 0.0, delta) >= level:
        return 0.0
    low, high = 0.0, 1.0
    while p_value(canaries, guesses, right, high, delta) < level:
        low, high = high, 2 * high
    for _ in range(SEARCH_STEPS):
        middle = (low + high) / 2
        low, high = (middle, high) if p_value(canaries, guesses, right, middle, delta) < level else (low, middle)
    return low


@dataclass(frozen=True)
class AuditResult:
    """The audit's figures: the bound, the guesses that gave it, and the attack's AUC and TPR at 1% FPR."""

    epsilon_lower_bound: float
    confidence: float
    canaries: int
    included: int
    guesses_in: int
    guesses_out: int
    right: int
    auc: float
    tpr_at_1pct_fpr: float

    def to_dict(self) -> dict[str, float | int]:
        return dict(self.__dict__)


def guess_grid(canaries: int) -> list[int]:
    """Guess counts tried on each side: 1%, 2%, 5%, 10%, 20% and 50% of the canaries (at least one)."""
    return sorted({max(1, round(canaries * share)) for share in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)})


def audit(scores: np.ndarray, included: np.ndarray, delta: float = 0.0, confidence: float = CONFIDENCE,
          grid: list[int] | None = None) -> AuditResult:
    """The one-run audit of canaries with `scores` (higher: guessed in) and the truth `included` (bool): the best
    bound over guessing the k highest in and the k lowest out, k on `grid` (default `guess_grid`), each point at
    confidence 1 - (1 - confidence) / len(grid)."""
    scores, included = np.asarray(scores, dtype=float), np.asarray(included, dtype=bool)
    if scores.shape != included.shape or scores.ndim != 1 or len(scores) < 2:
        raise ConfigError("an audit needs one score and one inclusion flag per canary, at least two canaries")
    if not np.isfinite(scores).all():
        raise ConfigError("canary scores must be finite")
    canaries = len(scores)
    grid = guess_grid(canaries) if grid is None else grid
    per_point = 1 - (1 - confidence) / len(grid)
    order = np.argsort(-scores, kind="stable")
    best = None
    for k in grid:
        if 2 * k > canaries:
            continue
        right = int(included[order[:k]].sum() + (~included[order[-k:]]).sum())
        bound = epsilon_lower_bound(canaries, 2 * k, right, delta, per_point)
        if best is None or bound > best[0]:
            best = (bound, k, right)
    if best is None:
        raise ConfigError(f"no guess count on the grid fits {canaries} canaries")
    bound, k, right = best
    return AuditResult(bound, confidence, canaries, int(included.sum()), k, k, right, auc(scores, included),
                       tpr_at(scores, included, 0.01))


def auc(scores: np.ndarray, included: np.ndarray) -> float:
    """The probability that an included canary outscores an excluded one (ties count half)."""
    if included.all() or not included.any():
        return float("nan")
    ranks = stats.rankdata(scores)
    positives = included.sum()
    return float((ranks[included].sum() - positives * (positives + 1) / 2) / (positives * (~included).sum()))


def tpr_at(scores: np.ndarray, included: np.ndarray, fpr: float) -> float:
    """The share of included canaries scored above the threshold that lets through at most `fpr` of the others."""
    if included.all() or not included.any():
        return float("nan")
    negatives = np.sort(scores[~included])[::-1]
    allowed = int(math.floor(fpr * len(negatives)))
    threshold = negatives[allowed] if allowed < len(negatives) else -np.inf
    return float((scores[included] > threshold).mean())
