"""Whether a model is itself a DP release, and under which guarantee: its provenance travels with it.

A model released by a differentially private mechanism (a DP-SGD student, a PATE or DGD student, a federated
student, the classifier of a private synthetic set, a covered transcription's student) is a function of noisy
releases only. Anything computed from it alone, with no other private input, has its guarantee (post-processing):
such a model is a teacher that costs nothing to transcribe, and the student, the generator and the synthetic set
distilled from it carry its epsilon. A model trained without DP has no provenance, and every answer it gives is
charged in full (the capacity bound).

Each covered run writes its provenance into the description of every model it saves (key `provenance`): computed
by dpdistill's accounting (`verified`), or, for a model brought in by `import-teacher --dp-epsilon`, the guarantee
its owner declares (reported as that claim, never as something dpdistill checked). It also carries the notes of
settings chosen on data (privacy/selection.py), so that a transcription of the model repeats them.

A provenance is bound to what it describes, and every read checks the binding (methods/teachers.py):
- `weights_sha256`, the SHA-256 of the safetensors file's bytes: save_model serialises the weights in memory,
  digests them and writes both files at once, so a description pasted onto other weights, or weights replaced
  under a description, are refused.
- `report_sha256` (verified provenances only), the SHA-256 of the run's `privacy` section as report.json writes
  it (sorted keys, infinities as 'inf'). The lifecycle saves the models before the report, but the privacy
  section is final before either, so the digest is computed from it then: no second file and no rewrite. Where
  the run's report is present (beside the model, or in the run directory the provenance names), the provenance a
  read derives from that report must be the one stored, digest included: an edited epsilon, an edited report or
  a verified provenance without a report digest is refused.
- A description that records its private data's digest (`data_digest (private)`: a model trained without DP)
  never carries a provenance: nothing private goes into a DP release's description, and such a pair is refused.

The digests are no signature: whoever edits the files can compute them again. They catch a description moved
onto other weights or another run, and weights or a report changed under it; a teacher from elsewhere is as
trustworthy as whoever hands it over.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import dp_accounting

from dpdistill.errors import CheckpointError, PrivacyParameterError
from dpdistill.privacy.accounting import validate_delta, validate_epsilon
from dpdistill.privacy.ledger import Release
from dpdistill.privacy.selection import SELECTION
from dpdistill.reporting.report import as_written, is_covered

PROVENANCE = "provenance"  # the key of a model description that holds it
ADD_REMOVE, REPLACE_ONE = "add-remove", "replace-one"
RELATIONS = (ADD_REMOVE, REPLACE_ONE)
RELATION_UNITS = {ADD_REMOVE: "adding or removing one private training example",
                  REPLACE_ONE: "replacing one private training example"}
DECLARED = "declared by the model's owner"
PRIVATE_MARK = "(private)"  # how a description names an entry computed from the private data without noise


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
    weights_sha256: str | None = None  # the weights it describes (their safetensors file)
    report_sha256: str | None = None  # its run's report's `privacy` section (privacy_digest)
    notes: tuple[str, ...] = ()  # settings chosen on data (privacy/selection.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "notes", tuple(self.notes))  # a list, read from JSON
        validate_epsilon(self.epsilon)
        validate_delta(self.delta)
        if self.relation not in RELATIONS:
            raise PrivacyParameterError(f"unknown neighbouring relation {self.relation!r}: choose "
                                        f"{' or '.join(RELATIONS)}")

    @classmethod
    def of_run(cls, method: str, privacy: dict[str, Any], run: str | None) -> "Provenance | None":
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
                   verified=bool(inherited.get("verified", True)), covers=str(privacy.get("covered", "")), run=run,
                   report_sha256=privacy_digest(privacy), notes=tuple(privacy.get(SELECTION, ())))

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
    def of_meta(cls, meta: dict[str, Any], description: Path | str = "the model's description"
                ) -> "Provenance | None":
        """The provenance the model description `meta` (the file `description`) carries; None: the model was
        trained without DP. A description with private entries and a provenance is refused."""
        data = meta.get(PROVENANCE)
        if data is None:
            return None
        private = private_entries(meta)
        if private:
            raise CheckpointError(f"{description} carries a DP provenance beside {private[0]!r}, the private data's "
                                  f"record of a model trained without DP: the description was altered; remove its "
                                  f"provenance (the model is then charged in full)")
        try:
            return cls(**data)
        except (TypeError, ValueError, PrivacyParameterError) as error:
            raise CheckpointError(f"{description} holds a damaged provenance ({error}); save the model "
                                  f"again") from error

    def describing(self, meta: dict[str, Any], weights: bytes) -> dict[str, Any]:
        """The description `meta` of the safetensors file `weights`, carrying this provenance bound to it (a DP
        release's description is public: it may hold nothing private)."""
        private = private_entries(meta)
        if private:
            raise CheckpointError(f"a DP release's description may hold nothing private, and this one holds "
                                  f"{private[0]!r}")
        bound = dataclasses.replace(self, weights_sha256=hashlib.sha256(weights).hexdigest())
        return {**meta, PROVENANCE: bound.to_json()}

    def check_weights(self, weights: Path, description: Path) -> None:
        """Refuse unless this provenance binds the weights in `weights` (and, verified, a report)."""
        if self.weights_sha256 is None or (self.verified and self.report_sha256 is None):
            raise CheckpointError(f"{description} holds a provenance bound to no weights or no report (pasted in, "
                                  f"or saved by an older dpdistill): release the model again, or import it with "
                                  f"`import-teacher --dp-epsilon` as a declared claim")
        if file_digest(weights) != self.weights_sha256:
            raise CheckpointError(f"{weights} is not the model its provenance in {description} describes (another "
                                  f"SHA-256): the weights were replaced or the description altered; restore both as "
                                  f"released")

    def check_report(self, report: Path, stated: "Provenance | None", description: Path) -> None:
        """Refuse unless the run's report `report`, which states the release `stated`, states this one."""
        if stated is None or stated != dataclasses.replace(self, weights_sha256=None):
            raise CheckpointError(f"{report} does not state the release the provenance in {description} describes "
                                  f"(another privacy section or digest): the report or the description was altered, "
                                  f"or the model is not this run's; restore them as released")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "notes": list(self.notes)}

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
                "teacher_release": self.to_json(), **({SELECTION: list(self.notes)} if self.notes else {})}


def privacy_digest(privacy: dict[str, Any]) -> str:
    """The SHA-256 of a report's `privacy` section as report.json holds it (keys sorted)."""
    return hashlib.sha256(json.dumps(as_written(privacy), sort_keys=True).encode()).hexdigest()


def file_digest(path: Path) -> str:
    """The SHA-256 of a file's bytes."""
    with path.open("rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def private_entries(meta: dict[str, Any]) -> list[str]:
    """The keys of a description (at any depth) that name an entry computed from private data without noise."""
    found = []
    for key, value in meta.items():
        if str(key).endswith(PRIVATE_MARK):
            found.append(str(key))
        if isinstance(value, dict):
            found += private_entries(value)
    return found
