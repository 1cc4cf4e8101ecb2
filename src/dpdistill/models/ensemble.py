"""Teacher ensembles: M teachers trained on disjoint partitions of the private data, saved side by side.

One private example changes one member only, so a mechanism that sums the members' bounded answers before one
noise draw has the sensitivity of a single answer while its signal grows with M: the way to accuracy at a small
sound epsilon. Two layouts:
- separate members (`MemberEnsemble`): each a whole network trained on its partition. On disk: `ensemble.json`
  and one teacher directory per member (`member-000/model.safetensors` + `meta.json`, ...), each loadable alone.
- heads on a shared frozen backbone (`HeadEnsemble`, layout "heads"): the backbone is a pretrained encoder that
  saw public images only, and each member is a linear head trained on its partition's features. One private
  example still changes one head only, and all members answer from one pass of the backbone, so thousands of
  members cost what one teacher costs. On disk: `ensemble.json` and `heads.safetensors` + `heads.json`.

"One example changes one member" also needs a partition in which no example moves another (data/partition.py).
ensemble.json's `partition` says which: scheme "keyed-hash" (the secret key in `partition-key.json`, hex under
"partition_key (private)", which must never leave this private directory) or "dirichlet" (a simulation of owners
who hold their data apart); older dpdistill wrote scheme "iid" with a "seed". `partition_assumption` states what
each rests on, and every release from the ensemble reports it.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpdistill.atomic import write_atomically
from dpdistill.data.partition import KEY_BYTES
from dpdistill.errors import CheckpointError
from dpdistill.models.base import Classifier
from dpdistill.models.checkpoint import STUDENT, TEACHER, load_classifier, load_module, rebuild_classifier, save_model
from dpdistill.privacy.ledger import UncoveredRead

ENSEMBLE_FILE = "ensemble.json"
HEADS = "heads"  # the weights of a head ensemble: heads.safetensors + heads.json
PARTITION_KEY_FILE = "partition-key.json"
PARTITION_KEY_FIELD = "partition_key (private)"
KEYED_HASH, DIRICHLET = "keyed-hash", "dirichlet"
SHUFFLED_POSITIONS = "iid"  # what older dpdistill wrote: a seeded permutation of positions, cut into parts


@dataclass(frozen=True)
class PartitionAssumption:
    """What "one private example changes one member" rests on, and whether it holds for this very run."""

    statement: str
    holds: bool


PARTITION_ASSUMPTIONS = {
    KEYED_HASH: PartitionAssumption("a keyed hash of each example's id (secret key from OS entropy): adding, "
                                    "removing or replacing one example changes one member", True),
    DIRICHLET: PartitionAssumption("the members' data are held apart by their owners (simulated here: the split "
                                   "was derived from the labels, so this central run has NO formal guarantee; the "
                                   "epsilon holds only for owners who hold their data apart)", False),
    SHUFFLED_POSITIONS: PartitionAssumption("a shuffled split of positions (older dpdistill): one example can "
                                            "move others, NO formal guarantee", False),
}
SINGLE_TEACHER = PartitionAssumption("one teacher, no partition", True)


def partition_assumption(ensemble: dict[str, Any] | None) -> PartitionAssumption:
    """The assumption behind an ensemble's partition, from its description (ensemble.json); None: one teacher."""
    if ensemble is None:
        return SINGLE_TEACHER
    scheme = ensemble.get("partition", {}).get("scheme")
    return PARTITION_ASSUMPTIONS.get(scheme, PartitionAssumption(
        f"an unknown partition scheme {scheme!r}: NO formal guarantee", False))


def partition_reads(privacy: dict[str, Any], ensemble: dict[str, Any] | None) -> list[UncoveredRead]:
    """Say in a release's `privacy` section what the partition assumes; where that does not hold, the members'
    data are read without the protection the epsilon assumes: an uncovered read, whose words begin the report's
    `covered`. A keyed partition of positional ids (older dpdistill) holds for replacing an example in place, not
    for adding or removing one, which renumbers the rest: no add/remove epsilon is claimed for it."""
    assumption = partition_assumption(ensemble)
    privacy["partition_assumption"] = assumption.statement
    if ensemble is not None and assumption.holds and not stable_ids(ensemble):
        privacy["epsilon_add_remove"] = None
        privacy["relation_note"] = ("the members' examples were assigned by their positions (older dpdistill): one "
                                    "example replaced in place changes one member, but one added or removed "
                                    "renumbers the rest, so no add/remove epsilon is claimed")
    if assumption.holds:
        return []
    return [UncoveredRead("the members' private data, under a partition that does not hold",
                          f"NO formal guarantee: {assumption.statement}", condition="with a sound partition")]


def stable_ids(ensemble: dict[str, Any]) -> bool:
    """Whether the ensemble's keyed partition hashed ids that no other example moves (the data's own, or content
    digests), as its description (ensemble.json's partition.ids) records; older ensembles hashed positions."""
    return ensemble.get("partition", {}).get("ids") is not None


def write_partition_key(directory: Path, key: bytes) -> None:
    """Keep the partition key in the private ensemble directory only (owner-readable), so a resumed training
    splits the data as the interrupted one did."""
    text = json.dumps({PARTITION_KEY_FIELD: key.hex(),
                       "why": "the secret key of the keyed-hash partition: whoever holds it can tell which member "
                              "trained on an example; never release it"}, indent=2)

    def write(path: Path) -> None:
        path.touch(mode=0o600)
        path.write_text(text)

    write_atomically({directory / PARTITION_KEY_FILE: write})


def read_partition_key(directory: Path) -> bytes:
    """The key `write_partition_key` saved in `directory`."""
    path = directory / PARTITION_KEY_FILE
    try:
        key = bytes.fromhex(json.loads(path.read_text())[PARTITION_KEY_FIELD])
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"no valid partition key at {path} ({error!r}); train the ensemble again in a new "
                              f"directory") from error
    if len(key) != KEY_BYTES:
        raise CheckpointError(f"the partition key at {path} has {len(key)} bytes, not {KEY_BYTES}; train the "
                              f"ensemble again in a new directory")
    return key


class TeacherEnsemble(nn.Module, ABC):
    """forward(x) is the log of the members' mean probabilities (for evaluation and as one teacher's logits);
    mechanisms read each member's answer through `member_logits`."""

    @abstractmethod
    def __len__(self) -> int:
        """M, the number of members (of disjoint partitions)."""

    @abstractmethod
    def member_logits(self, x: Tensor) -> Tensor:
        """(M, N, classes): every member's logits on the batch."""

    def forward(self, x: Tensor) -> Tensor:
        return self.combine(self.member_logits(x))

    def combine(self, member_logits: Tensor) -> Tensor:
        """The log of the members' mean probabilities, from `member_logits` (M, N, classes)."""
        log_probabilities = F.log_softmax(member_logits, dim=-1)
        return torch.logsumexp(log_probabilities, dim=0) - math.log(len(self))


class MemberEnsemble(TeacherEnsemble):
    """Separate networks, one per partition."""

    def __init__(self, members: list[Classifier]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        self.members = nn.ModuleList(members)

    def __len__(self) -> int:
        return len(self.members)

    def member_logits(self, x: Tensor) -> Tensor:
        return torch.stack([member(x) for member in self.members])


class HeadEnsemble(TeacherEnsemble):
    """M linear heads (`weight` (M, features, classes), `bias` (M, classes)) on the features of one frozen,
    publicly pretrained `encoder`."""

    def __init__(self, encoder: Classifier, weight: Tensor, bias: Tensor) -> None:
        super().__init__()
        if weight.dim() != 3 or bias.shape != (weight.shape[0], weight.shape[2]):
            raise ValueError(f"heads need weight (M, features, classes) and bias (M, classes), got "
                             f"{tuple(weight.shape)} and {tuple(bias.shape)}")
        self.encoder = encoder.requires_grad_(False)
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias)

    def __len__(self) -> int:
        return self.weight.shape[0]

    def member_logits(self, x: Tensor) -> Tensor:
        return self.head_logits(self.encoder.features(x))

    def head_logits(self, features: Tensor) -> Tensor:
        """(M, N, classes) from the encoder's features (N, F), for callers that computed them once."""
        return torch.einsum("nf,mfc->mnc", features, self.weight) + self.bias[:, None]


def save_head_ensemble(directory: Path, ensemble: HeadEnsemble, meta: dict[str, Any],
                       description: dict[str, Any]) -> None:
    """Write the heads and their encoder as one checkpoint, then mark `directory` as an ensemble (layout "heads");
    `meta` describes the encoder's architecture (arch, in_shape, num_classes, ...)."""
    members, feature_dim, _ = ensemble.weight.shape
    save_model(directory, ensemble, {**meta, "kind": "head-ensemble", "members": members, "feature_dim": feature_dim},
               name=HEADS)
    write_ensemble_description(directory, members, {**description, "layout": HEADS})


def _rebuild_head_ensemble(meta: dict[str, Any]) -> HeadEnsemble:
    members, feature_dim, classes = int(meta["members"]), int(meta["feature_dim"]), int(meta["num_classes"])
    return HeadEnsemble(rebuild_classifier(meta), torch.zeros(members, feature_dim, classes),
                        torch.zeros(members, classes))


def plurality_counts(member_logits: Tensor, num_classes: int) -> Tensor:
    """(N, classes) counts of the members' top classes, from `member_logits` (M, N, classes): what GNMax noises."""
    return F.one_hot(member_logits.argmax(-1), num_classes).sum(0)


def member_directory(directory: Path, index: int) -> Path:
    return directory / f"member-{index:03d}"


def write_ensemble_description(directory: Path, members: int, description: dict[str, Any]) -> None:
    """Mark `directory` as an ensemble of `members` saved teachers; written last, so a partial one is refused."""
    text = json.dumps({"kind": "ensemble", "members": members, **description}, indent=2)
    write_atomically({directory / ENSEMBLE_FILE: lambda path: path.write_text(text)})


def is_ensemble(directory: Path) -> bool:
    return (directory / ENSEMBLE_FILE).exists()


def teacher_checkpoint(directory: Path) -> str:
    """The checkpoint of `directory` that is its teacher: a trained or imported teacher (model.safetensors), else a
    run's released student (student.safetensors: a DP release is a teacher that costs nothing to transcribe)."""
    if not (directory / f"{TEACHER}.safetensors").exists() and (directory / f"{STUDENT}.safetensors").exists():
        return STUDENT
    return TEACHER


def holds_teacher(directory: Path) -> bool:
    """Whether `directory` holds a teacher, a teacher ensemble or a run's student."""
    return is_ensemble(directory) or (directory / f"{teacher_checkpoint(directory)}.safetensors").exists()


def load_teacher(directory: Path) -> tuple[Classifier | TeacherEnsemble, dict[str, Any]]:
    """A saved teacher or teacher ensemble in eval mode, with the description of its (first) member; an
    ensemble's description also carries `ensemble` (the contents of ensemble.json). A run's student is a teacher
    too; its description's `provenance` says whether it is a DP release (privacy/provenance.py)."""
    if not is_ensemble(directory):
        return load_classifier(directory, teacher_checkpoint(directory))
    try:
        description = json.loads((directory / ENSEMBLE_FILE).read_text())
        count = int(description["members"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{directory / ENSEMBLE_FILE} is not a valid ensemble description ({error!r}); "
                              f"train the ensemble again") from error
    if description.get("kind") != "ensemble" or count < 1:
        raise CheckpointError(f"{directory / ENSEMBLE_FILE} does not describe a dpdistill teacher ensemble")
    if description.get("layout") == HEADS:
        heads, meta = load_module(directory, HEADS, "head-ensemble", _rebuild_head_ensemble)
        if len(heads) != count:
            raise CheckpointError(f"{directory / ENSEMBLE_FILE} announces {count} members, {HEADS}.safetensors "
                                  f"holds {len(heads)}; train the ensemble again")
        return heads, {**meta, "ensemble": description}
    members, metas = [], []
    for index in range(count):
        model, meta = load_classifier(member_directory(directory, index))
        members.append(model)
        metas.append(meta)
    shapes = {(tuple(meta["in_shape"]), int(meta["num_classes"])) for meta in metas}
    if len(shapes) != 1:
        raise CheckpointError(f"the members of {directory} disagree on input shape or classes: {sorted(shapes)}")
    return MemberEnsemble(members).eval(), {**metas[0], "ensemble": description}


def load_saved(directory: Path, name: str | None = None) -> tuple[nn.Module, dict[str, Any], Path]:
    """Any saved classifier in eval mode, with its description and the file it came from: the checkpoint `name`
    (model, student, ...) in `directory`; by default its teacher or teacher ensemble, else a run's student."""
    if name is None and is_ensemble(directory):
        model, meta = load_teacher(directory)
        return model, meta, directory / ENSEMBLE_FILE
    if name is None:
        has = {stem: (directory / f"{stem}.safetensors").exists() for stem in (TEACHER, STUDENT)}
        name = STUDENT if has[STUDENT] and not has[TEACHER] else TEACHER
    model, meta = load_classifier(directory, name)
    return model, meta, directory / f"{name}.safetensors"
