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
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpdistill.atomic import write_atomically
from dpdistill.errors import CheckpointError
from dpdistill.models.base import Classifier
from dpdistill.models.checkpoint import load_classifier, load_module, rebuild_classifier, save_model

ENSEMBLE_FILE = "ensemble.json"
HEADS = "heads"  # the weights of a head ensemble: heads.safetensors + heads.json


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


def load_teacher(directory: Path) -> tuple[Classifier | TeacherEnsemble, dict[str, Any]]:
    """A saved teacher or teacher ensemble in eval mode, with the description of its (first) member; an
    ensemble's description also carries `ensemble` (the contents of ensemble.json)."""
    if not is_ensemble(directory):
        return load_classifier(directory)
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
