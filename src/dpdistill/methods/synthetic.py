"""What every private synthesiser (`dpdistill synthesize`) hands back beside its own figures: the labelled synthetic
set as a file and a grid, and the standard evaluation of private synthetic data, a classifier trained on the
synthetic set alone and tested on the whole real test split (its final model, never the best epoch)."""

from __future__ import annotations

import dataclasses
import math
import time
from abc import abstractmethod
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

import numpy as np
import torch
from torch import Tensor

from dpdistill.data.base import ImageDataset
from dpdistill.errors import ConfigError
from dpdistill.methods.base import Method
from dpdistill.methods.teachers import classifier_meta
from dpdistill.models.base import Classifier
from dpdistill.progress import Pace, Progress, in_phase
from dpdistill.reporting.report import save_image_grid
from dpdistill.training.teacher import TeacherConfig, train_classifier

SYNTHETIC_FILE = "synthetic.npz"
SYNTHETIC_STATE, CLASSIFIER_STATE = "synthetic", "classifier"  # in a run's resume directory: the synthetic set once
# drawn, the classifier on it under way
GRID_PER_CLASS = 10
SYNTHETIC_PHASE = "synthetic set"  # a progress display's names: drawing the synthetic set, and the classifier
CLASSIFIER_PHASE = "classifier on the synthetic set"  # trained on it
EVALUATION_LR, EVALUATION_BATCH = 1e-3, 128  # DataLens' evaluation classifier: Adam's learning rate, batch size


class SynthesisMethod(Method):
    """A method that learns a labelled synthetic set from the private data (`dpdistill synthesize`)."""

    command = "synthesize"
    config_type: ClassVar[type]  # its settings, with `from_dict` (what --resume reads back)

    @property
    def settings_type(self) -> type:
        """The configuration whose fields --set reaches: its own settings, unless they nest others."""
        return self.config_type

    @abstractmethod
    def build_config(self, preset: str | None, values: dict[str, Any]) -> Any:
        """Settings from a preset and explicit values (None: not given); a value the method does not take, or a
        bad one, is one ConfigError."""


def given_settings(method: str, values: dict[str, Any], takes: set[str], advice: str) -> dict[str, Any]:
    """The values given to `method` (None: not given): --dataset and --epsilon among them, every other a setting it
    `takes`; else one ConfigError, naming the settings of another synthesiser (DataLens') and `advice`."""
    given = {key: value for key, value in values.items() if value is not None}
    if "epsilon" not in given or "dataset" not in given:
        raise ConfigError(f"{method} needs --dataset and --epsilon")
    foreign = sorted(set(given) - takes)
    if foreign:
        raise ConfigError(f"{', '.join(name.replace('_', '-') for name in foreign)}: not a {method} setting "
                          f"(datalens takes it); {advice}")
    return given


@dataclasses.dataclass(frozen=True)
class StudentSettings:
    """The evaluation classifier: its architecture and training, seeded like the run."""

    arch: str
    epochs: int
    lr: float
    batch_size: int
    seed: int
    device: str
    every_epoch: bool = True  # test accuracy after each epoch (the report's curve), else after the last only


def evaluate_synthetic(dataset: ImageDataset, images: Tensor, labels: Tensor, method: str,
                       settings: StudentSettings, progress: Progress | None = None, state_dir: Path | None = None
                       ) -> tuple[Classifier, dict[str, Any], float]:
    """The student trained on (`images`, `labels`) only, scored on `dataset`'s real test split: the model, the
    report's entries (accuracy, what it was measured on, the synthetic set's shape, the student's curve) and the
    seconds it took. Its epochs show as the CLASSIFIER_PHASE of `progress` (minutes on 60,000 images), and its
    training is resumable from `state_dir` (the run's private resume directory's CLASSIFIER_STATE)."""
    started = time.perf_counter()
    synthetic = dataclasses.replace(dataset, name=f"{dataset.name} ({method} synthetic)", x_train=images,
                                    y_train=labels, ids_train=None)
    student, trained = train_classifier(synthetic, TeacherConfig(
        arch=settings.arch, epochs=settings.epochs, batch_size=settings.batch_size, lr=settings.lr, min_steps=0,
        seed=settings.seed, device=settings.device), in_phase(progress, CLASSIFIER_PHASE),
        evaluate_each_epoch=settings.every_epoch, state_dir=state_dir)
    report = {"accuracy": {"student": trained["history"][-1]["test_accuracy"]},
              "student_arch": settings.arch,
              "measured_on": f"the whole real test split of {dataset.name} ({len(dataset.y_test)} images)",
              "synthetic": {"file": SYNTHETIC_FILE, "images": len(labels),
                            "per_class": torch.bincount(labels, minlength=dataset.num_classes).tolist()},
              "student_history": trained["history"]}
    return student, report, time.perf_counter() - started


@torch.no_grad()
def balanced_draw(generate: Callable[[int], Tensor], label: Callable[[Tensor], Tensor], size: int, num_classes: int,
                  batch: int = 1024, max_batches: int = 200, draws_per_image: int = 20,
                  progress: Progress | None = None) -> tuple[Tensor, Tensor]:
    """`size` images from `generate(n)`, each class given its share (size / classes, the first classes one more
    where it does not divide) of the draws `label` assigns to it. A class the generator rarely draws may end short
    after `draws_per_image` draws an image (at most `max_batches` batches): the counts say so. `progress` hears the
    images kept so far (60,000 take minutes where a scattering teacher labels them)."""
    shares = [size // num_classes + (label_index < size % num_classes) for label_index in range(num_classes)]
    starts = [sum(shares[:class_index]) for class_index in range(num_classes)]
    drawn: Tensor | None = None  # each class's share in one tensor, allocated once (features.joined: why)
    counts = [0] * num_classes
    pace = Pace(in_phase(progress, SYNTHETIC_PHASE, size))
    for _ in range(min(max_batches, math.ceil(draws_per_image * size / batch))):
        pace.within({"done": sum(counts)})
        if counts == shares:
            break
        images = generate(batch).cpu()
        if drawn is None:
            drawn = images.new_empty((size, *images.shape[1:]))
        labels = label(images)
        for class_index in range(num_classes):
            missing = shares[class_index] - counts[class_index]
            if missing > 0:
                chosen = images[labels == class_index][:missing]
                start = starts[class_index] + counts[class_index]
                drawn[start:start + len(chosen)] = chosen
                counts[class_index] += len(chosen)
    pace({"done": sum(counts)})
    if drawn is None:
        raise ValueError("a synthetic set of no images")
    images = drawn if counts == shares else torch.cat([drawn[start:start + count]
                                                       for start, count in zip(starts, counts)])
    labels = torch.cat([torch.full((count,), class_index) for class_index, count in enumerate(counts)])
    return images, labels


def student_model(student: Classifier, arch: str, dataset: ImageDataset,
                  dataset_name: str) -> tuple[Classifier, dict[str, Any]]:
    """The student as a public checkpoint."""
    return student, classifier_meta(arch, dataset.input_shape, dataset.class_names, dataset_name)


def synthetic_files(images: Tensor, labels: Tensor, class_names: Sequence[str]
                    ) -> Callable[[Path, dict[str, Any]], None]:
    """Writes synthetic.npz (x float32 in [-1, 1], y int64) and samples.png (ten per class, titled with its name)."""

    def write(out_dir: Path, _report: dict[str, Any]) -> None:
        np.savez(out_dir / SYNTHETIC_FILE, x=images.numpy().astype(np.float32), y=labels.numpy().astype(np.int64))
        shown = [torch.nonzero(labels == label).squeeze(1)[:GRID_PER_CLASS] for label in range(len(class_names))]
        save_image_grid(images[torch.cat(shown)], out_dir / "samples.png", columns=GRID_PER_CLASS,
                        titles=[name for name, index in zip(class_names, shown) for _ in range(len(index))])

    return write
