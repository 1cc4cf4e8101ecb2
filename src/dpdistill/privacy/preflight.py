"""Before a run spends its budget: would its answers carry anything? Each estimate uses public quantities only (the
noise, the members, the classes, the queries: never the private data), and takes the best case the data could give,
so a run refused here cannot succeed whatever the data, and one that passes may still fail.

- Noisy votes (PATE, DGD, a federation's votes, an ensemble's label mode): the chance that a unanimous ensemble's
  class is still the winner after the noise. Less than a quarter of the way from chance to certainty (NEAR_RANDOM),
  answers are near random.
- Randomized response (a single teacher's label mode): the chance an answer is the true candidate, likewise.
- Noisy gradients (data mode): each answer is a Gaussian channel of capacity at most M^2 / (2 sigma^2) nats (M
  members' bounded gradients summed, noise sigma times the bound); all answers together below log2(K!) bits cannot
  even tell which class is which (docs/privacy.md, capacity bound).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from dpdistill.errors import PrivacyParameterError

NEAR_RANDOM = 0.25  # refused below chance + NEAR_RANDOM x (1 - chance): a quarter of the way to certainty
OVERRIDE = "--accept-noise"
USEFUL = 0.9  # a unanimous vote's survival the advice names the voters for
_GRID = np.linspace(-12.0, 12.0, 4001)  # standard deviations of the winner's own noise: the integral's support


def vote_survival(sigma: float, members: int, classes: int, noise: str = "gaussian") -> float:
    """P(argmax(votes + noise) is the unanimous class) for `members` votes on one class of `classes`, each count
    given independent noise of std `sigma` (gaussian) or scale `sigma` (laplace)."""
    if classes < 2:
        return 1.0
    law = stats.norm(scale=sigma) if noise == "gaussian" else stats.laplace(scale=sigma)
    own = _GRID * law.std()  # the winner's noise
    weights = law.pdf(own)
    beaten_by_none = law.cdf(members + own) ** (classes - 1)
    return float(np.trapezoid(weights * beaten_by_none, own))


def voters_for(probability: float, sigma: float, classes: int, noise: str = "gaussian") -> int:
    """The fewest unanimous voters whose class survives the noise with `probability` (bisection: survival grows
    with the voters)."""
    low, high = 0, 1
    while vote_survival(sigma, high, classes, noise) < probability:
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if vote_survival(sigma, middle, classes, noise) < probability else (low, middle)
    return high


def truthful_response(epsilon0: float, candidates: int) -> float:
    """P(randomized response over `candidates` answers the true one) at `epsilon0` per answer."""
    return 1.0 / (1.0 + (candidates - 1) * math.exp(-epsilon0))


def near_random(probability: float, choices: int) -> bool:
    chance = 1.0 / choices
    return probability < chance + NEAR_RANDOM * (1.0 - chance)


def capacity_bits(queries: int, sigma: float, members: int = 1) -> float:
    """What all data-mode answers can carry about the teacher, at most: queries x M^2 / (2 sigma^2) nats, in bits."""
    return queries * members ** 2 / (2 * sigma ** 2) / math.log(2)


def label_bits(classes: int) -> float:
    """log2(K!): the bits it takes only to tell which of K clusters is which class."""
    return math.lgamma(classes + 1) / math.log(2)


def refuse_near_random(advice: str | None, accepted: bool) -> None:
    """Refuse, before anything is spent, a run whose answers would be near random (`advice` says why), unless its
    user accepted that (--accept-noise)."""
    if advice is not None and not accepted:
        raise PrivacyParameterError(advice)


def vote_advice(sigma: float, members: int, classes: int, noise: str, what: str) -> str | None:
    """Why noisy votes would be near random, with what helps; None where they need not be."""
    survives = vote_survival(sigma, members, classes, noise)
    if not near_random(survives, classes):
        return None
    return (f"{what}'s answers would be near random: noise of {sigma:.3g} on each vote count against {members} "
            f"voters keeps even a unanimous vote's class only {100 * survives:.0f}% of the time (chance "
            f"{100 / classes:.0f}%; {voters_for(USEFUL, sigma, classes, noise)} unanimous voters would keep it "
            f"{100 * USEFUL:.0f}% of the time); raise --epsilon, ask fewer --queries, use more teachers, or where the "
            f"data is at hand train on it with `dpdistill train-private` (pass {OVERRIDE} to run anyway)")


def response_advice(epsilon0: float, candidates: int) -> str | None:
    """Why randomized response would be near random; None where it need not be."""
    truthful = truthful_response(epsilon0, candidates)
    if not near_random(truthful, candidates):
        return None
    return (f"the teacher's answers would be near random: randomized response at {epsilon0:.3g} per answer names "
            f"the true one of {candidates} candidates {100 * truthful:.0f}% of the time (chance "
            f"{100 / candidates:.0f}%); raise --epsilon or ask fewer answers (pass {OVERRIDE} to run anyway)")


def gradient_advice(queries: int, sigma: float, members: int, classes: int) -> str | None:
    """Why data-mode answers could not teach the classes; None where the capacity bound allows it."""
    bits, needed = capacity_bits(queries, sigma, members), label_bits(classes)
    if bits >= needed:
        return None
    return (f"the answers cannot teach the classes: {queries:,} noisy gradients at sigma {sigma:.3g} from "
            f"{members} teacher(s) carry at most {bits:.2g} bits, fewer than the {needed:.1f} it takes to tell "
            f"{classes} classes apart; use an ensemble, a larger --epsilon, or train privately on the data "
            f"(`dpdistill train-private`) (pass {OVERRIDE} to run anyway)")
