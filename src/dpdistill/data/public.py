"""The public images a student or an encoder may see, and the labelled images accuracy is then measured on.

PATE's protocol: public images are unlabelled and disjoint from the images that measure accuracy, so a figure
never rewards having seen its own test images. An encoder pretrained on a pool records the pool's description,
and a run that starts from it measures accuracy only where that pool ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from dpdistill.data import load_dataset
from dpdistill.data.base import ImageDataset
from dpdistill.defaults import PUBLIC_POOL_SIZE
from dpdistill.errors import ConfigError, DatasetError


PUBLIC_POOL = "public_pool"  # the key of a PoolSource in the description of a model that saw the pool


@dataclass(frozen=True)
class PoolSource:
    """Where a public pool comes from: the first `size` images of the `split` ("test" or "train") of `dataset`.
    Kept in the description of every model that saw them, so that an evaluation can leave them out."""

    dataset: str
    split: str
    size: int

    def shared_test_images(self, dataset: str) -> int:
        """How many leading images of `dataset`'s test split belong to this pool."""
        return self.size if self.split == "test" and self.dataset == dataset else 0


@dataclass(frozen=True)
class PublicSplit:
    """The student's public images and the labelled images its accuracy is measured on, never the same ones."""

    pool: Tensor  # (public_size, C, H, W), unlabelled
    x_eval: Tensor
    y_eval: Tensor
    description: str
    source: PoolSource
    measured_on: str  # which labelled images: what a report says accuracy is measured on
    pool_labels: Tensor | None = None  # the pool's true labels where known: to report answer quality, never to train


def pool_size(public_size: int | None, public: str | None, test_images: int) -> int:
    """The public pool's size: as given, else PUBLIC_POOL_SIZE, from the evaluation set's test split at most half
    of its `test_images` (the other half measures accuracy)."""
    if public_size is not None:
        return public_size
    return PUBLIC_POOL_SIZE if public else min(PUBLIC_POOL_SIZE, test_images // 2)


def public_split(evaluation: ImageDataset, public: str | None, size: int) -> PublicSplit:
    """`size` public images from the data set `public` (default: the evaluation set itself).

    From the evaluation set, the pool is the first `size` test images and accuracy is measured on the
    rest (PATE's protocol). From another data set, the pool is the first `size` of its training images
    and accuracy is measured on the whole evaluation test split."""
    if public is None or public == evaluation.name:
        if size >= len(evaluation.y_test):
            raise ConfigError(f"{evaluation.name}'s test split has {len(evaluation.y_test)} images: a public pool "
                              f"of {size} leaves none to measure accuracy on; lower --public-size")
        return PublicSplit(evaluation.x_test[:size], evaluation.x_test[size:], evaluation.y_test[size:],
                           f"the first {size} test images of {evaluation.name} (unlabelled); accuracy on the other "
                           f"{len(evaluation.y_test) - size}", PoolSource(evaluation.name, "test", size),
                           f"the last {len(evaluation.y_test) - size} test images of {evaluation.name}, outside the "
                           f"public pool (its first {size} test images)", evaluation.y_test[:size])
    source = load_dataset(public)
    if source.input_shape != evaluation.input_shape:
        raise DatasetError(f"public data set {public!r} has inputs {source.input_shape}, the teachers "
                           f"expect {evaluation.input_shape}")
    if size > len(source.x_train):
        raise ConfigError(f"{public} has {len(source.x_train)} training images, fewer than --public-size {size}")
    return PublicSplit(source.x_train[:size], evaluation.x_test, evaluation.y_test,
                       f"the first {size} training images of {source.name} (unlabelled); accuracy on the "
                       f"{len(evaluation.y_test)} test images of {evaluation.name}",
                       PoolSource(source.name, "train", size),
                       f"{whole_test_split(evaluation)}; the public pool is {source.name}'s first {size} training "
                       f"images")


def whole_test_split(dataset: ImageDataset) -> str:
    """Where accuracy is measured when no public pool takes test images: every one of them."""
    return f"the whole test split of {dataset.name} ({len(dataset.y_test)} images)"
