"""The wire between owners and server: integers cross SecAgg+'s fixed-point encoding exactly, the owner's
boundary refuses or clips what would break the accounting, each owner's noise share has the planned size, and an
owner answers only on the terms it derives itself."""

import dataclasses
import math
import re

import numpy as np
import pytest
import torch
from flwr.common.secure_aggregation.quantization import dequantize, quantize

from dpdistill.errors import ConfigError, PrivacyParameterError
from dpdistill.federated.answers import owner_answer, owner_of
from dpdistill.federated.protocol import (REFUSED_FILE, AnswerRejected, Encoding, Owner, RunTerms, SecAggSettings,
                                          Wire, accept, admit, check_dropouts, checked_answer, noisy_share, query_cost,
                                          refusal)
from dpdistill.models.ensemble import MemberEnsemble
from dpdistill.models.registry import build_classifier
from dpdistill.privacy.ledger import LEDGER_FILE, Release, ReleaseLedger
from dpdistill.privacy.randomness import noise_source

VOTES = Wire(10, (1, 8, 8), 3.0, 128, 4.0, math.sqrt(2))  # as planned: C = 128 holds 4 votes + 40 shares
OWNER = Owner(10, (1, 8, 8), 4, 1e-5)  # VOTES's owner: four members voting on 10 classes of 1x8x8 images


def test_integers_cross_secure_aggregation_exactly():
    """Flower's quantisation, summed as SecAgg+ sums and dequantised as its server does, gives back the owners'
    integer sum: with Q = 2C an integer is its own quantisation."""
    encoding = Encoding.for_answers(largest=20, share_sigma=3.0, owners=3)
    owners = [torch.randint(-200, 200, (50, 10)) for _ in range(3)]
    quantised = [quantize([encoding.encode(answer)], encoding.clipping_range, encoding.quantization_range)[0]
                 for answer in owners]
    total = dequantize([sum(q.astype(np.int64) for q in quantised)], encoding.clipping_range,
                       encoding.quantization_range)[0]
    mean = (total - (len(owners) - 1) * encoding.clipping_range) / len(owners)  # SecAgg+'s offset and weighting
    assert torch.equal(Encoding.decode_sum(mean, len(owners)), sum(owners))


def test_the_clipping_range_leaves_room_for_the_noise_and_fits_the_modulus():
    encoding = Encoding.for_answers(largest=20, share_sigma=3.0, owners=50)
    assert encoding.clipping_range >= 20 + 40 * 3.0 and encoding.clipping_range & (encoding.clipping_range - 1) == 0
    with pytest.raises(PrivacyParameterError, match="overflow"):
        Encoding.for_answers(largest=1e6, share_sigma=1e3, owners=3000)
    with pytest.raises(AnswerRejected, match="clipping range"):
        encoding.encode(torch.tensor([encoding.clipping_range]))


def test_the_owner_boundary_refuses_bad_answers_and_clips_large_rows():
    with pytest.raises(AnswerRejected, match="shape"):
        checked_answer(torch.zeros(5, 9), 5, VOTES)
    with pytest.raises(AnswerRejected, match="non-finite"):
        checked_answer(torch.full((5, 10), float("nan")), 5, VOTES)
    rows = torch.zeros(2, 10)
    rows[0, :2] = 3.0  # norm 4.24 > the bound 4
    rows[1, 0] = 2.0
    checked = checked_answer(rows, 2, VOTES)
    assert checked[0].norm().item() == pytest.approx(4.0) and torch.equal(checked[1], rows[1].double())


def test_each_owner_adds_integer_noise_of_the_planned_size():
    share = noisy_share(torch.zeros(1000, 10, dtype=torch.float64), VOTES, noise_source())
    assert share.dtype == np.float64 and np.array_equal(share, np.rint(share))
    assert abs(share.mean()) < 0.1 and share.std() == pytest.approx(3.0, rel=0.05)


def test_a_query_costs_what_one_vote_moves_and_a_clipped_row_stays_within_its_bound():
    assert query_cost(VOTES, 5, 0, 1).sensitivity == pytest.approx(math.sqrt(2))  # one vote: two counts by one
    rows = torch.zeros(1, 10)
    rows[0, :2] = 3.0  # no honest vote row (4 members) looks like this: clipped, then back onto the integers
    share = noisy_share(checked_answer(rows, 1, VOTES), dataclasses.replace(VOTES, share_sigma=1e-9), noise_source())
    assert np.linalg.norm(share) <= VOTES.row_bound


def test_secure_aggregation_needs_a_threshold_above_half():
    check_dropouts(5, 2)
    for owners, dropouts in ((5, 3), (4, 2), (1, 0)):
        with pytest.raises(ConfigError):
            check_dropouts(owners, dropouts)


def test_secure_aggregation_unmasks_only_sums_of_owners_minus_dropouts_whoever_answers_the_roll_call():
    from dpdistill.federated.server_app import FederationPlan, secagg_workflow

    plan = FederationPlan(VOTES, owners=5, dropouts=2, journal_dir="", stage_timeout=None)
    workflow = secagg_workflow(plan, Encoding(VOTES.clipping_range))
    # an integer is a count: Flower scales a float by the owners present at each round's roll call, and with 3 of 5
    # present a fraction 3 / 5 would let SecAgg+ unmask a sum of 2
    assert workflow.reconstruction_threshold == 3 and isinstance(workflow.reconstruction_threshold, int)


@pytest.mark.parametrize("owners, dropouts", [(2, 0), (5, 2)])
def test_the_stated_epsilon_holds_against_an_owner_who_knows_its_own_share(owners: int, dropouts: int):
    from dpdistill.federated.config import FederatedConfig
    from dpdistill.federated.method import calibrated_wire

    config = FederatedConfig(epsilon=1.0, dataset="digits", clients=owners, dropouts=dropouts)
    assert config.colluders == 1  # every owner is one: the default
    wire, query = calibrated_wire(config, VOTES, 100, 0.0)
    assert query.epsilon(100, 1e-5) <= 1.0
    # what a curious owner sees: the sums minus its own share, protected by the others' shares alone
    others = dataclasses.replace(query, owners=owners - 1, dropouts=dropouts, colluders=0)
    assert others.epsilon(100, 1e-5) == pytest.approx(query.epsilon(100, 1e-5), rel=1e-9)
    careless = calibrated_wire(dataclasses.replace(config, colluders=0), VOTES, 100, 0.0)[1]  # shares for all owners
    assert dataclasses.replace(careless, owners=owners - 1, colluders=0).epsilon(100, 1e-5) > 1.2


def test_colluders_must_leave_an_honest_share():
    with pytest.raises(ConfigError, match="colluders"):
        check_dropouts(5, 2, 3)


TERMS = RunTerms("run-a", 100, 5, 1, 1, 1e-5)
SECAGG = SecAggSettings(5, 5, 4, 128.0, 256, 1.0)  # TERMS's rounds: every owner holds shares, M - T unmask


def test_an_owners_client_charges_its_own_ledger_for_the_planned_run_then_every_row_past_it(tmp_path):
    wire = dataclasses.replace(VOTES, terms=TERMS)
    query = query_cost(wire, 5, 1, 1)
    admit(tmp_path, wire, 60)
    state = ReleaseLedger(tmp_path).read()
    assert state.spent() == pytest.approx(Release.of_query(query, 100, 1e-5).epsilon)  # the plan, from the first
    admit(tmp_path, wire, 60)  # 120 rows: a round asked again after a failure costs more
    (entry,) = ReleaseLedger(tmp_path).read().entries
    assert entry.answered == 120 and entry.release.epsilon == pytest.approx(Release.of_query(query, 120, 1e-5).epsilon)


def test_an_owners_client_refuses_past_its_total_with_its_local_releases_and_keeps_the_reason(tmp_path):
    wire = dataclasses.replace(VOTES, terms=TERMS)
    run_cost = Release.of_query(query_cost(wire, 5, 1, 1), 100, 1e-5).epsilon
    ledger = ReleaseLedger(tmp_path)
    ledger.reserve(tmp_path / "local-pate", "pate", Release.of_query(query_cost(wire, 5, 1, 1), 100, 1e-5))
    ledger.set_total(1.5 * run_cost)  # room for one of the two: the local release composes with the federation's
    with pytest.raises(AnswerRejected, match="past its privacy budget"):
        admit(tmp_path, wire, 10)
    assert "past its privacy budget" in refusal(tmp_path, "run-a") and refusal(tmp_path, "run-b") is None
    assert len(ledger.read().entries) == 1  # the refused run charged nothing


def test_an_owners_client_refuses_a_run_without_terms_or_whose_noise_drops(tmp_path):
    with pytest.raises(AnswerRejected, match="no run terms"):
        accept(tmp_path, VOTES, OWNER, SECAGG)
    admit(tmp_path, dataclasses.replace(VOTES, terms=TERMS), 10)
    with pytest.raises(AnswerRejected, match="changed its noise"):
        admit(tmp_path, dataclasses.replace(VOTES, share_sigma=1.0, terms=TERMS), 10)


def four_members() -> MemberEnsemble:
    torch.manual_seed(0)
    return MemberEnsemble([build_classifier("cnn", (1, 8, 8), 10) for _ in range(4)]).eval()


def test_an_owner_derives_its_terms_from_its_own_teachers():
    meta = {"num_classes": 10, "in_shape": [1, 8, 8]}
    assert owner_of(four_members(), meta, 1e-5) == OWNER
    assert owner_of(build_classifier("cnn", (1, 8, 8), 10), meta, 1e-5).members == 1
    assert OWNER.wire(dataclasses.replace(VOTES, terms=TERMS)) == dataclasses.replace(VOTES, terms=TERMS)


def test_an_owner_accepts_the_terms_a_server_plans(tmp_path):
    ring = dataclasses.replace(TERMS, shares=3, threshold=2, rounds=2)
    for terms, secagg in ((TERMS, SECAGG), (ring, dataclasses.replace(SECAGG, shares=3, threshold=2))):
        assert accept(tmp_path, dataclasses.replace(VOTES, terms=terms), OWNER, secagg) == dataclasses.replace(
            VOTES, terms=terms)
    assert not (tmp_path / REFUSED_FILE).exists()


def test_an_owner_refuses_a_wire_that_understates_its_sensitivity_and_reveals_nothing(tmp_path):
    """The server's word was taken for the sensitivity: a wire stating 1e-3 for one vote's sqrt(2) was charged a
    fraction of what the owner's answers cost. Every owner now computes it from the answers it computes itself."""
    honest = dataclasses.replace(VOTES, terms=TERMS)
    understated = dataclasses.replace(honest, member_sensitivity=1e-3)
    images = torch.rand(8, 1, 8, 8).numpy()
    with pytest.raises(AnswerRejected, match="member_sensitivity 0.001"):
        owner_answer(tmp_path, four_members(), OWNER, SECAGG, [images], understated.to_json())
    assert not (tmp_path / LEDGER_FILE).exists()  # nothing charged, nothing answered
    assert "member_sensitivity 0.001 (this owner's: 1.414" in refusal(tmp_path, TERMS.run)
    owner_answer(tmp_path, four_members(), OWNER, SECAGG, [images], honest.to_json())
    (entry,) = ReleaseLedger(tmp_path).read().entries  # the honest run, charged at the owner's own sqrt(2)
    assert entry.release.epsilon == pytest.approx(Release.of_query(query_cost(VOTES, 5, 1, 1), 100, 1e-5).epsilon)


@pytest.mark.parametrize("change, named", [(dict(num_classes=9), "num_classes 9"),
                                           (dict(in_shape=(1, 28, 28)), "in_shape (1, 28, 28)"),
                                           (dict(row_bound=2.0), "row_bound 2.0"),
                                           (dict(terms=dataclasses.replace(TERMS, delta=1e-3)), "delta 0.001")])
def test_an_owner_refuses_classes_shapes_members_and_a_delta_other_than_its_own(tmp_path, change, named):
    """A delta of 1e-3 would have stated the owner's epsilon smaller; the owner states it at its own."""
    with pytest.raises(AnswerRejected, match=re.escape(named)):
        accept(tmp_path, dataclasses.replace(VOTES, **{"terms": TERMS, **change}), OWNER, SECAGG)
    assert not (tmp_path / LEDGER_FILE).exists() and refusal(tmp_path, TERMS.run) is not None
    assert accept(tmp_path, dataclasses.replace(VOTES, terms=dataclasses.replace(TERMS, delta=1e-3)),
                  dataclasses.replace(OWNER, delta=1e-3), SECAGG)  # an owner that set 1e-3 itself


@pytest.mark.parametrize("change, reason", [
    (dict(owners=5.0), "owners=5.0: not a whole number"),
    (dict(dropouts=3), "tolerate 0 to 2 dropouts"),
    (dict(colluders=4), "colluders"),
    (dict(shares=3), "shares alone"),
    (dict(shares=4, threshold=2), "ring of 4 shares"),
    (dict(shares=3, threshold=3), "ring of 3 shares"),
    (dict(queries=0), "plan 0 rows"),
])
def test_an_owner_refuses_terms_no_federation_could_have(tmp_path, change, reason):
    with pytest.raises(AnswerRejected, match=re.escape(reason)):
        accept(tmp_path, dataclasses.replace(VOTES, terms=dataclasses.replace(TERMS, **change)), OWNER, SECAGG)
    assert reason in refusal(tmp_path, TERMS.run) and not (tmp_path / LEDGER_FILE).exists()


def test_an_owner_refuses_a_clipping_range_its_noisy_answers_would_reach(tmp_path):
    needed = Encoding.for_answers(OWNER.members, VOTES.share_sigma, TERMS.owners).clipping_range
    assert accept(tmp_path, dataclasses.replace(VOTES, clipping_range=needed, terms=TERMS), OWNER, SECAGG)
    with pytest.raises(AnswerRejected, match=f"clipping range {needed // 2} is below the {needed}"):
        accept(tmp_path, dataclasses.replace(VOTES, clipping_range=needed // 2, terms=TERMS), OWNER, SECAGG)
    assert "clipping range" in refusal(tmp_path, TERMS.run) and not (tmp_path / LEDGER_FILE).exists()


@pytest.mark.parametrize("change", [dict(threshold=2), dict(shares=3), dict(clipping_range=64.0),
                                    dict(quantization_range=2**22), dict(max_weight=3.0)])
def test_an_owner_refuses_a_round_whose_secure_aggregation_is_not_the_planned_one(tmp_path, change):
    """A threshold of 2 would unmask a sum of fewer shares than the noise was sized for; a ring of 3 on the full
    graph's terms has a failure the owner did not charge; another encoding would clip or round its noisy answer."""
    with pytest.raises(AnswerRejected, match="secure aggregation runs this round with"):
        accept(tmp_path, dataclasses.replace(VOTES, terms=TERMS), OWNER, dataclasses.replace(SECAGG, **change))
    with pytest.raises(AnswerRejected, match="did not come through secure aggregation"):
        accept(tmp_path, dataclasses.replace(VOTES, terms=TERMS), OWNER, None)
    assert not (tmp_path / LEDGER_FILE).exists()
