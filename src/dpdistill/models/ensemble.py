"""Teacher ensembles: M teachers trained on disjoint partitions of the private data, saved side by side.

One private example changes one member only, so a mechanism that sums the members' bounded answers before one
noise draw has the sensitivity of a single answer while its signal grows with M: the way to accuracy at a small
sound epsilon. On disk an ensemble is a directory with `ensemble.json` and one teacher directory per member
(`member-000/model.safetensors` + `meta.json`, ...), each loadable on its own.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpdistill.atomic import write_atomically
from dpdistill.errors import CheckpointError
from dpdistill.models.base import Classifier
from dpdistill.models.checkpoint import load_classifier

ENSEMBLE_FILE = "ensemble.json"


class TeacherEnsemble(nn.Module):
    """forward(x) is the log of the members' mean probabilities (for evaluation and as one teacher's logits);
    mechanisms read each member's answer through `member_logits`."""

    def __init__(self, members: list[Classifier]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        self.members = nn.ModuleList(members)

    def __len__(self) -> int:
        return len(self.members)

    def member_logits(self, x: Tensor) -> Tensor:
        """(M, N, classes): every member's logits on the batch."""
        return torch.stack([member(x) for member in self.members])

    def forward(self, x: Tensor) -> Tensor:
        return self.combine(self.member_logits(x))

    def combine(self, member_logits: Tensor) -> Tensor:
        """The log of the members' mean probabilities, from `member_logits` (M, N, classes)."""
        log_probabilities = F.log_softmax(member_logits, dim=-1)
        return torch.logsumexp(log_probabilities, dim=0) - math.log(len(self.members))


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
    members, metas = [], []
    for index in range(count):
        model, meta = load_classifier(member_directory(directory, index))
        members.append(model)
        metas.append(meta)
    shapes = {(tuple(meta["in_shape"]), int(meta["num_classes"])) for meta in metas}
    if len(shapes) != 1:
        raise CheckpointError(f"the members of {directory} disagree on input shape or classes: {sorted(shapes)}")
    return TeacherEnsemble(members).eval(), {**metas[0], "ensemble": description}
