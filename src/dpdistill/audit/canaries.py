"""Canaries for a black-box audit: training examples given a wrong label, each included in the private data with
probability 1/2, scored by how well the released student fits the wrong label.

A mislabelled example is what a model must memorise to fit: an included canary leaves the clearest trace a
student can carry. Excluded canaries are removed with their true label too, so that in and out differ by the
canary alone. The inclusion draws are the audit's own secret (seeded: an audit is a test of the implementation,
repeatable by design), never any mechanism's noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from dpdistill.atomic import write_atomically
from dpdistill.data.base import ImageDataset
from dpdistill.errors import ConfigError


@dataclass(frozen=True)
class Canaries:
    indices: Tensor  # int64 (m,): positions in the training split the canaries replace
    images: Tensor  # float32 (m, C, H, W) in [-1, 1]
    labels: Tensor  # int64 (m,): a wrong label each
    included: Tensor  # bool (m,)


def make_canaries(dataset: ImageDataset, count: int, seed: int) -> Canaries:
    """`count` training examples with a uniformly drawn wrong label, each included with probability 1/2."""
    if not 2 <= count <= len(dataset.y_train) // 2:
        raise ConfigError(f"--canaries must be between 2 and half the training set ({len(dataset.y_train) // 2}), "
                          f"got {count}")
    generator = torch.Generator().manual_seed(seed)
    indices = torch.randperm(len(dataset.y_train), generator=generator)[:count]
    shift = torch.randint(1, dataset.num_classes, (count,), generator=generator)
    labels = (dataset.y_train[indices] + shift) % dataset.num_classes
    included = torch.rand(count, generator=generator) < 0.5
    return Canaries(indices, dataset.x_train[indices].clone(), labels, included)


def write_audited_data(dataset: ImageDataset, canaries: Canaries, path: Path) -> None:
    """The private data the audited route trains on, as an .npz `load_dataset` reads: the training split without
    the canaries' originals, plus the included canaries with their wrong labels (ids kept), and the test split."""
    keep = torch.ones(len(dataset.y_train), dtype=torch.bool)
    keep[canaries.indices] = False
    chosen = canaries.indices[canaries.included]
    x_train = torch.cat([dataset.x_train[keep], canaries.images[canaries.included]])
    arrays = {"x_train": _storable(x_train),
              "y_train": torch.cat([dataset.y_train[keep], canaries.labels[canaries.included]]).numpy(),
              "ids_train": torch.cat([dataset.ids_train[keep], dataset.ids_train[chosen]]).numpy(),
              "x_test": _storable(dataset.x_test), "y_test": dataset.y_test.numpy()}
    if dataset.declared_size is not None:  # the original's, whichever canaries are in; without one, a route that
        arrays["declared_size"] = np.int64(dataset.declared_size)  # needs a size counts the audited data noisily
    write_atomically({path: lambda temporary: _save_npz(temporary, arrays)})


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as file:  # a file object: np.savez would add .npz to a temporary name
        np.savez(file, **arrays)


def _storable(images: Tensor) -> np.ndarray:
    """[-1, 1] images as `load_dataset` reads them back: the 0..255 bytes they came from where they are bytes
    (exact), otherwise floats in [0, 1]."""
    unit = (images + 1) / 2
    as_bytes = (unit * 255).round().clamp(0, 255).to(torch.uint8)
    if torch.equal(as_bytes.float() / 255 * 2 - 1, images):
        return as_bytes.numpy()
    return unit.clamp(0, 1).numpy()


@torch.inference_mode()
def label_log_probabilities(model: nn.Module, images: Tensor, labels: Tensor, device: str = "cpu"
                            ) -> tuple[Tensor, Tensor]:
    """log p of each example's label under `model`, and the log of the other classes' total probability (both
    from the logits: stable where p is near 0 or 1)."""
    model = model.to(device).eval()
    own, others = [], []
    for batch, targets in zip(images.split(512), labels.split(512)):
        log_p = model(batch.to(device)).log_softmax(-1).cpu()
        own.append(log_p.gather(1, targets[:, None]).squeeze(1))
        others.append(log_p.scatter(1, targets[:, None], -torch.inf).logsumexp(1))
    return torch.cat(own).double(), torch.cat(others).double()


def loss_scores(model: nn.Module, images: Tensor, labels: Tensor, device: str = "cpu") -> np.ndarray:
    """Minus each example's cross-entropy under the released model: higher where the model fits the label (a
    canary's wrong one; a member's true one)."""
    return label_log_probabilities(model, images, labels, device)[0].numpy()
