"""What crosses the wire between the server and the data owners, and the checks on both sides of it.

Each round the server sends query images (PATE: public images; FedDPSD: synthetic images with the student's logits
on them); each owner answers with its members' vote counts, or their bounded distillation gradients on a fixed
integer grid, plus its own share of discrete Gaussian noise, drawn from secret randomness; secure aggregation
(Flower's SecAgg+) reveals only the sum. Three things keep that sum exactly what the accounting describes:

1. The owner's boundary (`checked_answer`): an answer of the wrong shape or with a non-finite value is refused (the
   owner then takes no part in the round, like a dropout); rows above their L2 bound are clipped to it. Nothing
   the owner's model does can raise the sensitivity. What the sensitivity, the row bound and the classes are, the
   owner derives from its own teachers (`Owner`), never from the server's wire (`accept`).
2. Exact integer encoding (`Encoding`): SecAgg+ shifts values by its clipping range C and quantises them with
   Q / 2C levels per unit; with Q = 2C an integer is its own quantisation, so the server's sum is exact. C is a
   power of two far beyond any answer plus noise: the chance that a share is clipped is below `CLIP_TAIL` over the
   whole run (a term of delta far below any stated delta, and stated in the report).
3. The threshold: the server unmasks a sum only with at least `owners - dropouts` contributors, more than half the
   owners, so it never sees a sum of fewer noise shares than the accounting assumes. On the full graph SecAgg+'s
   reconstruction threshold enforces it; on a sparse graph (federated/graph.py) the server checks it before
   unmasking, and the graph's failure bound is part of delta.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
from torch import Tensor

from dpdistill.errors import BudgetExceededError, ConfigError, PrivacyParameterError
from dpdistill.federated.graph import SecAggGraph, full_graph, graph_failure
from dpdistill.privacy.accounting import DistributedDiscreteGaussianQuery
from dpdistill.privacy.ledger import ReleaseLedger
from dpdistill.privacy.randomness import NoiseSource
from dpdistill.reporting.report import write_json

TAIL_SIGMAS = 40  # C >= largest answer + 40 share sigmas: a discrete Gaussian share passes it w.p. < exp(-800)
CLIP_TAIL = 1e-300  # a bound on the chance that any share in a run is clipped, at TAIL_SIGMAS
MODULUS_BITS = 32  # SecAgg+'s modulus: the sum of every owner's shifted answer must stay below 2^32
REFUSED_FILE = "refused.json"  # an owner's last refusal to answer, with the run and the reason
GRID_STEPS = 1024  # FedDPSD: a member's gradient of norm up to beta is sent in units of beta / GRID_STEPS


class AnswerRejected(Exception):
    """An owner's answer failed its boundary check: the owner sits the round out."""


@dataclass(frozen=True)
class Encoding:
    """SecAgg+'s fixed-point settings that carry integers exactly: clipping range C, quantisation range 2C."""

    clipping_range: int

    @classmethod
    def for_answers(cls, largest: float, share_sigma: float, owners: int) -> "Encoding":
        """The smallest power-of-two C above the largest possible answer plus TAIL_SIGMAS noise shares; refused
        when the owners' shifted sum could overflow SecAgg+'s modulus."""
        needed = largest + TAIL_SIGMAS * share_sigma
        clipping = 2 ** max(1, math.ceil(math.log2(needed)))
        if owners * 2 * clipping >= 2**MODULUS_BITS:
            raise PrivacyParameterError(f"{owners} owners' answers up to {largest:g} with noise shares of sigma "
                                        f"{share_sigma:.3g} overflow secure aggregation's 32-bit sums: use fewer "
                                        f"owners or a smaller grid")
        return cls(clipping)

    @property
    def quantization_range(self) -> int:
        return 2 * self.clipping_range

    def encode(self, values: Tensor) -> np.ndarray:
        """An integer tensor as the float64 array SecAgg+ quantises to exactly itself."""
        array = values.to(torch.int64).numpy().astype(np.float64)
        if np.abs(array).max(initial=0) >= self.clipping_range:  # beyond CLIP_TAIL: never under the planned noise
            raise AnswerRejected(f"a noisy answer reached the clipping range {self.clipping_range}")
        return array

    @staticmethod
    def decode_sum(mean: np.ndarray, contributors: int) -> Tensor:
        """SecAgg+ hands over the contributors' mean; their integer sum, exactly."""
        return torch.from_numpy(np.rint(np.asarray(mean, dtype=np.float64) * contributors)).to(torch.int64)


@dataclass(frozen=True)
class GradientAnswer:
    """FedDPSD's data-sensitive answer (seed 000, Algorithm 2's Fed-FlexPer): per sample, each member's
    distillation-loss gradient at the student's logits (or, `space` "probabilities", at its prediction: Alg. 2 line
    25's Phi_s), top-k masked and normalised (or clipped) to GRID_STEPS grid units, summed over the owner's
    members."""

    loss: str = "dkd"
    dkd_alpha: float = 1.0
    dkd_beta: float = 8.0
    temperature: float = 1.0
    top_k: int | None = 3
    operation: str = "normalize"
    space: str = "logits"

    def sensitivity(self, num_classes: int) -> float:
        """How far one example moves an owner's integer row: its one member's bounded gradient by at most
        2 GRID_STEPS, and the truncation to integers (each coordinate's error within (-1, 1)) by less than
        sqrt(classes)."""
        return 2 * GRID_STEPS + math.sqrt(num_classes)


@dataclass(frozen=True)
class RunTerms:
    """What an owner's client needs to account a run in its own ledger, whatever the server reports: the run's
    name, the plan its noise was sized for, and the secure-aggregation graph, whose failure bound the owner
    recomputes itself."""

    run: str  # random, drawn when the run is planned; a resumed run keeps it
    queries: int  # query rows the run plans to ask
    owners: int
    dropouts: int
    colluders: int
    delta: float
    shares: int | None = None  # SecAgg+ neighbours of each owner, itself included; None: every owner (full graph)
    threshold: int | None = None  # of those shares, needed to unmask (None: owners - dropouts)
    rounds: int = 1  # secure-aggregation rounds the run plans, each with the graph's failure bound

    def graph(self) -> SecAggGraph:
        if self.shares is None or self.threshold is None:
            return full_graph(self.owners, self.dropouts)
        return SecAggGraph("sparse", self.owners, self.shares, self.threshold,
                           graph_failure(self.owners, self.dropouts, self.colluders, self.shares, self.threshold))

    def failure(self) -> float:
        """The part of delta the graph takes, over the run's rounds."""
        return self.graph().run_failure(self.rounds)


@dataclass(frozen=True)
class Wire:
    """Everything an owner needs to answer a round, fixed by the server's plan and sent with each round."""

    num_classes: int
    in_shape: tuple[int, ...]
    share_sigma: float  # each owner's discrete Gaussian share, in the answer's integer units (votes, grid steps)
    clipping_range: int
    row_bound: float  # L2 bound of one owner's answer row: votes, its member count (all votes on one class);
    # gradients, its member count times GRID_STEPS
    member_sensitivity: float  # how far one example moves that row: one vote, two counts by one (gradients:
    # GradientAnswer.sensitivity)
    gradient: GradientAnswer | None = None  # None: the owners vote
    terms: RunTerms | None = None  # set once the run is planned

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Wire":
        gradient, terms = data.get("gradient"), data.get("terms")
        return cls(**{**data, "in_shape": tuple(data["in_shape"]),
                      "gradient": None if gradient is None else GradientAnswer(**gradient),
                      "terms": None if terms is None else RunTerms(**terms)})


def answer_wire(num_classes: int, in_shape: tuple[int, ...], members: int, gradient: GradientAnswer | None = None
                ) -> Wire:
    """The terms that follow from what an owner of `members` members answers, before any noise is sized (share
    sigma 1, clipping range 2): its row bound (votes: all its members on one class; gradients: each member's
    GRID_STEPS) and how far one example moves the row (one member's vote: two counts by one; a member's bounded
    gradient: `GradientAnswer.sensitivity`). The server plans with it; each owner derives the same from its own
    teachers and answers only a run that states them."""
    if gradient is None:
        return Wire(num_classes, tuple(in_shape), 1.0, 2, float(members), math.sqrt(2))
    return Wire(num_classes, tuple(in_shape), 1.0, 2, float(members * GRID_STEPS), gradient.sensitivity(num_classes),
                gradient)


@dataclass(frozen=True)
class Owner:
    """What a data owner knows of itself, whatever a server states: its teachers' classes, input shape and
    members, and the delta it states its epsilon at (`federated owner --delta`)."""

    num_classes: int
    in_shape: tuple[int, ...]
    members: int
    delta: float

    def wire(self, asked: Wire) -> Wire:
        """`asked` with every term the owner derives itself in place of the server's; the noise share, the
        clipping range, the gradient's settings (each bounded by GRID_STEPS whatever they are) and the run's terms
        but its delta stay the server's word, checked by `accept`."""
        own = answer_wire(self.num_classes, self.in_shape, self.members, asked.gradient)
        terms = None if asked.terms is None else replace(asked.terms, delta=self.delta)
        return replace(own, share_sigma=asked.share_sigma, clipping_range=asked.clipping_range, terms=terms)


@dataclass(frozen=True)
class SecAggSettings:
    """What secure aggregation runs a round with, as the owner's own SecAgg+ took it at the round's setup: the
    owners sampled, how many hold shares of each one's keys and how many of those unmask, and the fixed-point
    encoding its answer crosses."""

    sampled: int
    shares: int
    threshold: int
    clipping_range: float
    quantization_range: int
    max_weight: float

    def check(self, wire: Wire) -> None:
        """Refused (ConfigError) unless the round unmasks as the run's terms say (the full graph: every sampled
        owner holds shares and M - T unmask; a ring: its shares and threshold) and carries the owner's integers
        exactly (`Encoding`: quantization range 2C, and weight 1, which SecAgg+ multiplies the answer by)."""
        graph = wire.terms.graph()
        planned = (self.sampled if graph.full else graph.shares, graph.threshold, float(wire.clipping_range),
                   2 * wire.clipping_range, 1.0)
        actual = (self.shares, self.threshold, self.clipping_range, self.quantization_range, self.max_weight)
        if actual != planned:
            raise ConfigError(f"secure aggregation runs this round with {self.shares} shares, threshold "
                              f"{self.threshold}, clipping range {self.clipping_range:g}, quantization range "
                              f"{self.quantization_range} and weight {self.max_weight:g}; the run's terms plan "
                              f"{planned[0]}, {planned[1]}, {planned[2]:g}, {planned[3]} and 1")


def accept(owner_dir: Path, asked: Wire, owner: Owner, secagg: SecAggSettings | None) -> Wire:
    """The wire the owner answers by, checked before it computes anything: its own terms (`Owner.wire`), refused
    (`AnswerRejected`, the reason kept in REFUSED_FILE, nothing charged) when the server's disagree with them, when
    the server sent no run terms, or when the terms only the server can state are impossible: counts that are not
    whole numbers, dropouts and colluders the threshold does not allow (`check_dropouts`), a key-sharing graph
    other than the full one or a ring below the owners present, or a clipping range that would clip the owner's
    noisy answer more often than CLIP_TAIL; and when the round's secure aggregation (`secagg`, None: the round did
    not come through it) is not the one the terms plan."""
    terms = asked.terms
    if terms is None:
        refuse(owner_dir, None, "the server sent no run terms: an owner answers only runs its own ledger can account")
    if secagg is None:
        refuse(owner_dir, terms.run, "the round did not come through secure aggregation: its answer would leave the "
                                     "owner unmasked")
    own = owner.wire(asked)
    differing = _differences(asked, own)
    if differing:
        refuse(owner_dir, terms.run, f"the run states terms this owner computes otherwise: {'; '.join(differing)}")
    try:
        check_terms(own)
        secagg.check(own)
    except (ConfigError, PrivacyParameterError) as error:
        refuse(owner_dir, terms.run, str(error))
    return own


def _differences(stated: Wire | RunTerms, own: Wire | RunTerms) -> list[str]:
    """Each term of `stated` (a wire, or its run terms) that is not the owner's own, with both values."""
    found = []
    for name in (field.name for field in fields(own)):
        said, derived = getattr(stated, name), getattr(own, name)
        if isinstance(derived, RunTerms) and isinstance(said, RunTerms):
            found += _differences(said, derived)
        elif not _same(said, derived):
            found.append(f"{name} {said!r} (this owner's: {derived!r})")
    return found


def _same(stated: Any, own: Any) -> bool:
    """Equal, floats to rounding."""
    if isinstance(own, float):
        return type(stated) in (int, float) and math.isclose(stated, own, rel_tol=1e-12)
    return type(stated) is type(own) and stated == own


def check_terms(wire: Wire) -> None:
    """The run's terms that only the server can state (M, T, C, the graph, the rows and rounds, the noise share and
    the clipping range), checked for what an owner can check of them: refused as impossible."""
    terms = wire.terms
    counts = {name: getattr(terms, name) for name in ("queries", "owners", "dropouts", "colluders", "rounds")}
    graph = {name: getattr(terms, name) for name in ("shares", "threshold") if getattr(terms, name) is not None}
    for name, value in {**counts, **graph}.items():
        if type(value) is not int:
            raise ConfigError(f"the run's terms state {name}={value!r}: not a whole number")
    if terms.queries < 1 or terms.rounds < 1:
        raise ConfigError(f"the run's terms plan {terms.queries} rows in {terms.rounds} rounds")
    check_dropouts(terms.owners, terms.dropouts, terms.colluders)
    if len(graph) == 1:
        raise ConfigError(f"the run's terms state {', '.join(graph)} alone: a sparse graph needs shares and "
                          f"threshold, the full one neither")
    if graph and not (terms.shares % 2 == 1 and 3 <= terms.shares < terms.owners - terms.dropouts
                      and 2 <= terms.threshold < terms.shares):
        raise ConfigError(f"the run's terms state a ring of {terms.shares} shares with threshold {terms.threshold}: "
                          f"a sparse graph of {terms.owners} owners with {terms.dropouts} dropouts has an odd number "
                          f"of shares from 3 to {terms.owners - terms.dropouts - 1}, and a threshold from 2 to one "
                          f"below its shares")
    query_cost(wire, terms.owners, terms.dropouts, terms.colluders)  # a share sigma it can account, or refused
    needed = Encoding.for_answers(wire.row_bound, wire.share_sigma, terms.owners).clipping_range
    if wire.clipping_range < needed:
        raise PrivacyParameterError(f"the run's clipping range {wire.clipping_range} is below the {needed} this "
                                    f"owner's answers (up to {wire.row_bound:g}) and its noise share need")


def refuse(owner_dir: Path, run: str | None, reason: str) -> NoReturn:
    """Answer nothing of `run`, keeping the reason in the owner's folder for the operator (and the server's error)."""
    write_json(owner_dir / REFUSED_FILE, {"run": run, "reason": reason})
    raise AnswerRejected(reason)


def checked_answer(answer: Tensor, rows: int, wire: Wire) -> Tensor:
    """The owner's boundary: refuse the wrong shape or a non-finite value, clip each row to its L2 bound."""
    expected = (rows, wire.num_classes)
    if tuple(answer.shape) != expected:
        raise AnswerRejected(f"answer of shape {tuple(answer.shape)}, the round asks {expected}")
    if not torch.isfinite(answer).all():
        raise AnswerRejected("answer with a non-finite value")
    answer = answer.double()
    norms = answer.norm(dim=1, keepdim=True)
    return answer * torch.clamp(wire.row_bound / norms.clamp(min=1e-300), max=1.0)


def noisy_share(answer: Tensor, wire: Wire, noise: NoiseSource) -> np.ndarray:
    """The owner's contribution: its checked integer answer plus its discrete Gaussian share."""
    counts = torch.trunc(answer).to(torch.int64)  # a clipped row back onto the integers, towards zero: still bounded
    share = noise.discrete_gaussian(tuple(counts.shape), wire.share_sigma)
    return Encoding(wire.clipping_range).encode(counts + share)


def admit(owner_dir: Path, wire: Wire, rows: int) -> None:
    """The owner's own budget, checked by its client before it answers: `rows` answers of this run are charged to
    the ledger in the owner's folder (where its local releases are recorded too), at the cost the owner computes
    from the noise it adds, its own sensitivity (`wire` is the one `accept` returned) and the run's terms. Refused
    (`AnswerRejected`, the reason kept in REFUSED_FILE) past the owner's total or when the noise changes within a
    run."""
    terms = wire.terms
    try:
        query = query_cost(wire, terms.owners, terms.dropouts, terms.colluders)
        ReleaseLedger(owner_dir).answer(terms.run, query, rows, terms.queries, terms.delta, terms.failure())
    except (BudgetExceededError, PrivacyParameterError) as error:
        refuse(owner_dir, terms.run, str(error))


def refusal(owner_dir: Path, run: str) -> str | None:
    """Why the owner refused to answer `run`, if it did."""
    path = owner_dir / REFUSED_FILE
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    return str(record["reason"]) if record.get("run") == run else None


def query_cost(wire: Wire, owners: int, dropouts: int, colluders: int) -> DistributedDiscreteGaussianQuery:
    """One query row's privacy cost: one example changes one member of one owner, moving that owner's row by
    `member_sensitivity`; protected by the shares of the honest owners among those that answer."""
    return DistributedDiscreteGaussianQuery(wire.share_sigma, wire.member_sensitivity, wire.num_classes, owners,
                                            dropouts, colluders)


def check_dropouts(owners: int, dropouts: int, colluders: int = 0) -> None:
    """SecAgg+ is secure only while the reconstruction threshold owners - dropouts exceeds half the owners, and the
    noise protects only while an honest share remains beside the colluders'."""
    if owners < 2:
        raise ConfigError(f"secure aggregation needs at least 2 data owners, got {owners}")
    if not 0 <= dropouts or 2 * (owners - dropouts) <= owners:
        raise ConfigError(f"{owners} owners tolerate 0 to {(owners - 1) // 2} dropouts (the threshold must stay "
                          f"above half), got {dropouts}")
    if not 0 <= colluders < owners - dropouts:
        raise ConfigError(f"{owners} owners with {dropouts} dropouts tolerate 0 to {owners - dropouts - 1} colluders "
                          f"(one honest share must remain in every sum), got {colluders}")
