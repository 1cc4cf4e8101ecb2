"""Which owners share keys in SecAgg+ (Bell et al. 2020): the full graph, or a sparse one with a stated failure
probability that is added to delta.

Flower's SecAgg+ places the owners of a round on a ring in a fresh random order and makes each the neighbour of the
`(k - 1) / 2` owners on either side (a Harary graph; k counts the owner itself). An owner Shamir-shares its two
secrets among its k neighbours only, with reconstruction threshold t, so a round costs O(n k) sharing instead of
O(n^2). Against a server that follows the protocol (curious, not malicious: it draws the ring at random) and C
colluding owners, with at most D owners dropping out, independently of the ring, three things can go wrong:

- exposure: an honest owner with at least t colluding neighbours; they hold enough shares of its pairwise-mask key
  for the server to strip its masks and read its answer alone. Its k - 1 neighbours are a uniformly random subset
  of the other owners in the ring, so the colluders among them are hypergeometric; the ring is drawn among the
  owners present at the round's roll call, at least n - D, where colluders are densest:
  P <= (n - D - C) P[Hyp(n - D - 1, C, k - 1) >= t].
- split: the honest owners that stay are split into parts with no key between them; the server then learns each
  part's sum, which holds fewer honest noise shares than the accounting assumes. On the ring two remaining owners
  next to each other in ring order share a key unless at least (k - 1) / 2 positions between them are lost, and
  the remaining owners stay connected unless that happens twice, so P <= n C(C + D, h) / C(n, h), h = (k - 1) / 2
  (some window of h positions all colluding or dropped).
- a stalled round (not a privacy failure: SecAgg+ then stops before unmasking): an owner with fewer than t of its
  neighbourhood left, P <= (n - D) P[Hyp(n - 1, D, k - 1) > k - t] + D P[Hyp(n - 1, D - 1, k - 1) >= k - t].

The sparse graph takes the smallest odd k (and for it the smallest t) whose exposure and split bounds, over every
round of the run, stay within `FAILURE_SHARE` of delta, and whose stall bound stays below `STALL_LIMIT` a round;
where none is below the fewest owners a round may have (n - D), the full graph (k = n, t = n - D: no failure) is
used. The privacy guarantee is then (epsilon, delta)-DP with the noise calibrated at delta minus the rounds'
failure bound; the server additionally refuses to unmask a round with fewer than n - D contributors, which the
full graph's threshold enforces by itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from dpdistill.errors import ConfigError

GRAPHS = ("sparse", "full")
FAILURE_SHARE = 0.1  # of the run's delta, at most, spent on the sparse graph's failure over all rounds
STALL_LIMIT = 1e-4  # a round's chance of stopping for want of shares, at most


@dataclass(frozen=True)
class SecAggGraph:
    """The key-sharing graph of every round: `shares` neighbours each (the owner included), unmasked with
    `threshold` of their shares; `failure` bounds one round's chance of exposing an answer or splitting the sum."""

    kind: str
    owners: int
    shares: int
    threshold: int
    failure: float = 0.0
    stall: float = 0.0

    @property
    def full(self) -> bool:
        return self.shares >= self.owners

    def workflow_settings(self) -> tuple[int | float, int]:
        """Flower's `num_shares` and integer `reconstruction_threshold` (a float 1.0: every owner, as Flower reads
        it)."""
        return (1.0 if self.full else self.shares), self.threshold

    def run_failure(self, rounds: int) -> float:
        """The chance that any of `rounds` unmasked rounds failed: added to the run's delta."""
        return min(1.0, rounds * self.failure)


def full_graph(owners: int, dropouts: int) -> SecAggGraph:
    return SecAggGraph("full", owners, owners, owners - dropouts)


def plan_graph(kind: str, owners: int, dropouts: int, colluders: int, rounds: int, delta: float) -> SecAggGraph:
    """The graph of `kind` for `rounds` rounds of `owners` (at most `dropouts` missing, `colluders` colluding)."""
    if kind not in GRAPHS:
        raise ConfigError(f"unknown secure-aggregation graph {kind!r}; choose one of {', '.join(GRAPHS)}")
    if kind == "full":
        return full_graph(owners, dropouts)
    allowed = FAILURE_SHARE * delta / max(1, rounds)
    # Flower needs an integer number of shares above 2 (an odd one is a ring), fewer than the owners present
    for shares in range(3, owners - dropouts, 2):
        split = split_bound(owners, dropouts + colluders, shares)
        if split > allowed:
            continue
        for threshold in range(2, shares):
            failure = graph_failure(owners, dropouts, colluders, shares, threshold)
            if failure <= allowed:
                stall = stall_bound(owners, dropouts, shares, threshold)
                if stall <= STALL_LIMIT:
                    return SecAggGraph("sparse", owners, shares, threshold, failure, stall)
                break  # a larger threshold only stalls more often
    return full_graph(owners, dropouts)


def graph_failure(owners: int, dropouts: int, colluders: int, shares: int, threshold: int) -> float:
    """One round's exposure and split bound for a given graph (0 for the full graph): what an owner recomputes
    from the run's terms instead of trusting the server's figure."""
    if shares >= owners:
        return 0.0
    return split_bound(owners, dropouts + colluders, shares) + exposure_bound(owners - dropouts, colluders, shares,
                                                                               threshold)


def exposure_bound(owners: int, colluders: int, shares: int, threshold: int) -> float:
    """Union over the honest owners of a ring of `owners` of P[at least `threshold` of its `shares` - 1 neighbours
    collude]."""
    return min(1.0, (owners - colluders) * hypergeometric_tail(owners - 1, colluders, shares - 1, threshold))


def split_bound(owners: int, lost: int, shares: int) -> float:
    """Union over ring windows of h = (shares - 1) / 2 positions of P[every position in it is lost]."""
    half = (shares - 1) // 2
    if lost < half:
        return 0.0
    return min(1.0, owners * math.exp(_log_comb(lost, half) - _log_comb(owners, half)))


def stall_bound(owners: int, dropouts: int, shares: int, threshold: int) -> float:
    """Union over owners of P[fewer than `threshold` of its neighbourhood left]: more than shares - threshold of
    the other neighbours of an owner that stays dropped, or at least that many of one that dropped itself."""
    lost = shares - threshold
    return min(1.0, (owners - dropouts) * hypergeometric_tail(owners - 1, dropouts, shares - 1, lost + 1)
               + dropouts * hypergeometric_tail(owners - 1, dropouts - 1, shares - 1, lost))


def hypergeometric_tail(population: int, marked: int, draws: int, at_least: int) -> float:
    """P[X >= at_least] for X the marked among `draws` drawn without replacement from `population`."""
    top = min(marked, draws)
    if at_least > top:
        return 0.0
    log_total = _log_comb(population, draws)
    return min(1.0, sum(math.exp(_log_comb(marked, x) + _log_comb(population - marked, draws - x) - log_total)
                        for x in range(max(0, at_least), top + 1)))


@lru_cache(maxsize=None)
def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
