"""Whether a model is itself a DP release, and under which guarantee: its provenance travels with it.

A model released by a differentially private mechanism (a DP-SGD student, a PATE or DGD student, a federated
student, the classifier of a private synthetic set, a covered transcription's student) is a function of noisy
releases only. Anything computed from it alone, with no other private input, has its guarantee (post-processing):
such a model is a teacher that costs nothing to transcribe, and the student, the generator and the synthetic set
distilled from it carry its epsilon. A model trained without DP has no provenance, and every answer it gives is
charged in full (the capacity bound).

Each covered run writes its provenance into the description of every model it saves (key `provenance`): computed
by dpdistill's accounting (`verified`), or, for a model brought in by `import-teacher --dp-epsilon`, the guarantee
its owner declares (reported as that claim, never as something dpdistill checked).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import dp_accounting

from dpdistill.errors import CheckpointError, PrivacyParameterError
from dpdistill.privacy.accounting import validate_delta, validate_epsilon
from dpdistill.privacy.ledger import Release
from dpdistill.reporting.report import is_covered

PROVENANCE = "provenance"  # the key of a model description that holds it
ADD_REMOVE, REPLACE_ONE = "add-remove", "replace-one"
RELATIONS = (ADD_REMOVE, REPLACE_ONE)
RELATION_UNITS = {ADD_REMOVE: "adding or removing one private training example",
                  REPLACE_ONE: "replacing one private training example"}
DECLARED = "declared by the model's owner"


@dataclass(frozen=True)
class Provenance:
    """The DP release a model came from: (epsilon, delta) under `relation`, by `release`."""

    release: str  # the dpdistill method that released it, or DECLARED
    epsilon: float
    delta: float
    relation: str  # the neighbouring relation `epsilon` is stated under
    epsilon_replace_one: float | None  # the same release under replace-one, where known
    verified: bool  # True: dpdistill's own accounting at release; False: the owner's claim
    covers: str  # what the release's guarantee covers, in the releasing run's words
    run: str | None = None  # the run directory that released it

    def __post_init__(self) -> None:
        validate_epsilon(self.epsilon)
        validate_delta(self.delta)
        if self.relation not in RELATIONS:
            raise PrivacyParameterError(f"unknown neighbouring relation {self.relation!r}: choose "
                                        f"{' or '.join(RELATIONS)}")

    @classmethod
    def of_run(cls, method: str, privacy: dict[str, Any], run: str) -> "Provenance | None":
        """The provenance of what a finished run released, from its report's `privacy` section: None unless the
        run's epsilon is a formal guarantee for its models (noise, secret, nothing read without protection)."""
        epsilon = privacy.get("epsilon")
        if not is_covered(privacy) or epsilon is None or not math.isfinite(epsilon):
            return None
        inherited = privacy.get("teacher_release") or {}
        relation = privacy.get("relation", REPLACE_ONE)
        return cls(release=method, epsilon=float(epsilon), delta=float(privacy["delta"]), relation=relation,
                   epsilon_replace_one=privacy.get("epsilon_replace_one",
                                                   epsilon if relation == REPLACE_ONE else None),
                   verified=bool(inherited.get("verified", True)), covers=str(privacy.get("covered", "")), run=run)

    @classmethod
    def declared(cls, epsilon: float, delta: float, relation: str) -> "Provenance":
        """What the owner of a model trained elsewhere declares: reported as the claim it is."""
        return cls(release=DECLARED, epsilon=epsilon, delta=delta, relation=relation,
                   epsilon_replace_one=epsilon if relation == REPLACE_ONE else None, verified=False,
                   covers="the model, as its owner declares (trained with DP elsewhere)")

    def as_release(self) -> Release:
        """The release this provenance states, as a ledger records it under replace-one: its stated epsilon there,
        or, where only an add/remove figure is known, what it implies for replacing one example (an add and a
        remove: twice epsilon, at delta (1 + e^epsilon) delta). Its mechanism unknown, a ledger adds it to the
        rest (basic composition)."""
        if self.epsilon_replace_one is not None:
            return Release(dp_accounting.NoOpDpEvent(), self.delta, self.epsilon_replace_one)
        return Release(dp_accounting.NoOpDpEvent(), min(self.delta * (1 + math.exp(self.epsilon)), 1.0),
                       2 * self.epsilon)

    @classmethod
    def of_meta(cls, meta: dict[str, Any]) -> "Provenance | None":
        """The provenance a model description carries; None: the model was trained without DP."""
        data = meta.get(PROVENANCE)
        if data is None:
            return None
        try:
            return cls(**data)
        except (TypeError, ValueError, PrivacyParameterError) as error:
            raise CheckpointError(f"the model's description holds a damaged provenance ({error}); save the model "
                                  f"again") from error

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def statement(self) -> str:
        """One line: the guarantee, who states it, and under which relation."""
        who = (f"released by dpdistill's {self.release} (its accounting)" if self.verified
               else f"{DECLARED}, NOT verified by dpdistill")
        return (f"({self.epsilon:.4g}, {self.delta:g})-DP for {RELATION_UNITS[self.relation]}, {who}")

    def privacy(self) -> dict[str, Any]:
        """The `privacy` entries of a release computed from this model alone: its guarantee, by post-processing."""
        both = {"epsilon_replace_one": self.epsilon_replace_one}
        if self.relation == ADD_REMOVE:
            both["epsilon_add_remove"] = self.epsilon
        return {"epsilon": self.epsilon, "delta": self.delta, "relation": self.relation,
                "unit": RELATION_UNITS[self.relation], **both,
                "epsilon_scope": "the teacher's own DP release (post-processing)" if self.verified
                else "the teacher's DP training as its owner declares it (post-processing; not verified)",
                "teacher_release": self.to_json()}
