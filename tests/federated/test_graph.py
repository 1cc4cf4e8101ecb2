"""The sparse SecAgg+ graph: its failure bounds hold against Flower's own ring, its choice fits the run's delta,
and the failure reaches the accounting (the owner's ledger and the report's epsilon)."""

import dataclasses
import random

import pytest

from dpdistill.federated.graph import (FAILURE_SHARE, STALL_LIMIT, exposure_bound, graph_failure, hypergeometric_tail,
                                       plan_graph, split_bound, stall_bound)
from dpdistill.federated.protocol import RunTerms, Wire, query_cost
from dpdistill.privacy.ledger import Release, ReleaseLedger, composed_epsilon

VOTES = Wire(10, (1, 8, 8), 5.0, 64, 4.0, 2**0.5)


def flower_ring(owners: int, shares: int, rng: random.Random) -> dict[int, set[int]]:
    """Flower 1.41's neighbours (secaggplus_workflow.setup_stage): a shuffled ring, shares // 2 on either side."""
    order = list(range(owners))
    rng.shuffle(order)
    half = shares >> 1
    return {node: {order[(index + offset) % owners] for offset in range(-half, half + 1)}
            for index, node in enumerate(order)}


def split(neighbours: dict[int, set[int]], kept: set[int]) -> bool:
    """Whether the kept owners fall into parts with no key between them."""
    start = next(iter(kept))
    seen, frontier = {start}, [start]
    while frontier:
        node = frontier.pop()
        for other in neighbours[node] & kept - seen:
            seen.add(other)
            frontier.append(other)
    return seen != kept


def failures(owners: int, colluders: int, dropouts: int, shares: int, threshold: int, draws: int) -> dict[str, float]:
    """How often each failure happens on Flower's ring, colluders and dropouts drawn independently of it."""
    rng = random.Random(7)
    counts = dict.fromkeys(("exposure", "split", "stall"), 0)
    for _ in range(draws):
        neighbours = flower_ring(owners, shares, rng)
        colluding = set(rng.sample(range(owners), colluders))
        dropped = set(rng.sample(sorted(set(range(owners)) - colluding), dropouts))
        honest = set(range(owners)) - colluding
        counts["exposure"] += any(len(neighbours[node] & colluding) >= threshold for node in honest)
        counts["split"] += split(neighbours, honest - dropped)
        counts["stall"] += any(len(neighbours[node] - dropped) < threshold for node in range(owners))
    return {name: count / draws for name, count in counts.items()}


@pytest.mark.parametrize("event, owners, colluders, dropouts, shares, threshold", [
    ("exposure", 60, 2, 2, 7, 2), ("split", 80, 4, 4, 5, 2), ("stall", 60, 2, 2, 7, 6)])
def test_each_bound_holds_against_flowers_ring_where_its_failure_is_frequent_enough_to_count(
        event, owners, colluders, dropouts, shares, threshold):
    bound = {"exposure": exposure_bound(owners - dropouts, colluders, shares, threshold),
             "split": split_bound(owners, colluders + dropouts, shares),
             "stall": stall_bound(owners, dropouts, shares, threshold)}[event]
    measured = failures(owners, colluders, dropouts, shares, threshold, 2000)[event]
    # measured 0.20 / 0.53, 0.105 / 0.71 and about 0.2 / 0.53: the sampling error of 2,000 draws is about 0.01
    assert 0.05 < measured <= bound < 1


def test_the_hypergeometric_tail_is_exact_on_a_case_counted_by_hand():
    # 2 marked of 5, draw 2: P[both marked] = 1 / 10, P[at least one] = 7 / 10
    assert hypergeometric_tail(5, 2, 2, 2) == pytest.approx(0.1)
    assert hypergeometric_tail(5, 2, 2, 1) == pytest.approx(0.7)
    assert hypergeometric_tail(5, 2, 2, 3) == 0.0


@pytest.mark.parametrize("owners, dropouts, colluders, rounds", [(250, 12, 12, 2), (1000, 50, 50, 4), (1000, 0, 1, 2),
                                                                 (10_000, 500, 500, 2)])
def test_a_large_federation_gets_a_sparse_graph_within_its_share_of_delta(owners, dropouts, colluders, rounds):
    graph = plan_graph("sparse", owners, dropouts, colluders, rounds, 1e-5)
    assert graph.kind == "sparse" and graph.shares <= 31 and graph.shares % 2 == 1
    assert graph.shares < owners - dropouts  # distinct neighbours on the smallest ring a round may have
    assert graph.run_failure(rounds) <= FAILURE_SHARE * 1e-5 and graph.stall <= STALL_LIMIT
    assert graph.failure == graph_failure(owners, dropouts, colluders, graph.shares, graph.threshold)
    assert graph.workflow_settings() == (graph.shares, graph.threshold)  # integers, as Flower needs them


def test_a_small_federation_and_an_explicit_choice_keep_the_full_graph():
    small = plan_graph("sparse", 5, 0, 1, 4, 1e-5)  # any window of a 3-share ring holds the colluder
    assert small.full and small.workflow_settings() == (1.0, 5) and small.failure == 0.0
    assert plan_graph("sparse", 11, 3, 0, 2, 1e-5).full  # the ring it needs (9 shares) exceeds 8 owners present
    assert plan_graph("full", 1000, 50, 50, 2, 1e-5).workflow_settings() == (1.0, 950)
    with pytest.raises(Exception, match="unknown secure-aggregation graph"):
        plan_graph("star", 10, 0, 1, 1, 1e-5)


def test_the_graphs_failure_is_part_of_delta_not_of_the_noises_epsilon():
    query = query_cost(VOTES, 250, 12, 12)
    plain, failing = Release.of_query(query, 500, 1e-5), Release.of_query(query, 500, 1e-5, 4e-6)
    assert failing.epsilon > plain.epsilon  # its noise holds at delta 6e-6 only
    assert failing.epsilon == pytest.approx(Release.of_query(query, 500, 6e-6).epsilon)
    # composed, the failures come off the delta before the events are accounted
    assert composed_epsilon([failing, failing], 1e-5) == pytest.approx(
        composed_epsilon([plain, plain], 1e-5 - 8e-6))
    assert composed_epsilon([failing, failing, failing], 1e-5) == float("inf")


def test_an_owner_charges_the_failure_it_computes_from_the_terms_and_keeps_it_in_its_ledger(tmp_path):
    graph = plan_graph("sparse", 250, 12, 12, 2, 1e-5)
    terms = RunTerms("run-a", 500, 250, 12, 12, 1e-5, graph.shares, graph.threshold, 2)
    assert terms.failure() == pytest.approx(2 * graph.failure) and terms.failure() > 0
    ledger = ReleaseLedger(tmp_path)
    ledger.answer(terms.run, query_cost(VOTES, 250, 12, 12), 250, 500, terms.delta, terms.failure())
    entry = ledger.read().entries[0]  # read back from ledger.json
    assert entry.release.failure == pytest.approx(terms.failure())
    assert entry.release.epsilon == pytest.approx(
        Release.of_query(query_cost(VOTES, 250, 12, 12), 500, 1e-5 - terms.failure()).epsilon)
    assert dataclasses.replace(terms, shares=None, threshold=None).failure() == 0.0  # the full graph
