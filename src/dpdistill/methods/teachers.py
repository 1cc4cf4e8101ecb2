"""What the methods that ask a teacher share: loading it, the data set that measures accuracy, the teacher's own
accuracy (a private figure), and the description saved beside every classifier."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Sequence

from torch import nn

from dpdistill import __version__
from dpdistill.data import load_dataset
from dpdistill.data.base import ImageDataset, label_names
from dpdistill.data.public import PUBLIC_POOL
from dpdistill.errors import CheckpointError, DatasetError, DpDistillError
from dpdistill.evaluation.metrics import accuracy
from dpdistill.models.checkpoint import CLASS_NAMES, ENCODER, STUDENT, description_path, read_meta, saved_class_names
from dpdistill.models.ensemble import is_ensemble, load_teacher, teacher_checkpoint
from dpdistill.privacy.provenance import PROVENANCE, Provenance
from dpdistill.reporting.report import PRIVATE_DIR, PRIVATE_RECORD, describe_classes
from dpdistill.runs import REPORT_FILE
from dpdistill.training.teacher import SCATTER_INIT


DATA_DIGEST = "data_digest (private)"  # a teacher's (or ensemble's) description: the digest of its data set


def teacher_data_set(meta: dict[str, Any]) -> tuple[str, str] | None:
    """The data set a teacher (or ensemble) learnt from, as a ledger names it (digest, name); None where dpdistill
    did not train it (imported, or older)."""
    digest = meta.get(DATA_DIGEST) or meta.get("ensemble", {}).get(DATA_DIGEST)
    return None if digest is None else (digest, str(meta.get("ensemble", {}).get("dataset") or meta.get("dataset")))


def released_data_set(model_dir: Path) -> tuple[str, str] | None:
    """The data set whose examples a DP model's release read (digest, name), from its run's private record; None
    where the record does not say (an older run, or a model brought in from elsewhere)."""
    record = model_dir / PRIVATE_DIR / PRIVATE_RECORD
    try:
        digest, name = json.loads(record.read_text())["data_set"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    return str(digest), str(name)


def data_digest(meta: dict[str, Any], dataset: ImageDataset | None) -> str | None:
    """The digest of the data a run on this teacher concerns: the teacher's own, where dpdistill trained it, else
    that of the data set the run measures on (by its name, the teacher's data); None where there is neither."""
    learnt_from = teacher_data_set(meta)
    return learnt_from[0] if learnt_from else None if dataset is None else dataset.digest


def read_teacher(teacher_dir: Path) -> tuple[nn.Module, dict[str, Any]]:
    """The teacher (or ensemble) in `teacher_dir` and its description, with its provenance (`teacher_provenance`)."""
    teacher, meta = load_teacher(teacher_dir)
    provenance = teacher_provenance(teacher_dir, meta)
    return teacher, meta if provenance is None else {**meta, PROVENANCE: provenance.to_json()}


def teacher_provenance(teacher_dir: Path, meta: dict[str, Any] | None = None) -> Provenance | None:
    """Whether the teacher in `teacher_dir` (described by `meta`, read here if not given) is a DP release, as its
    description's provenance says: refused unless the provenance binds the weights beside it and, where its run's
    report is present, the release that report states (privacy/provenance.py). None: a teacher trained without DP
    (or an ensemble); a run's student without a provenance whose report states a DP release is refused."""
    name = teacher_checkpoint(teacher_dir)
    if meta is None:
        if is_ensemble(teacher_dir):
            return None
        meta = read_meta(teacher_dir, name)
    description = description_path(teacher_dir, name)
    provenance = Provenance.of_meta(meta, description)
    if provenance is None:
        report = teacher_dir / REPORT_FILE
        if name == STUDENT and stated_release(report, str(teacher_dir.resolve())) is not None:
            raise CheckpointError(f"{description} carries no provenance, yet {report} states a DP release: the "
                                  f"description was altered or saved by an older dpdistill; release the model again")
        return None
    provenance.check_weights(teacher_dir / f"{name}.safetensors", description)
    run = [Path(provenance.run)] if provenance.run else []
    report = next((directory / REPORT_FILE for directory in [teacher_dir, *run] if (directory / REPORT_FILE).is_file()),
                  None)
    if report is not None and (provenance.verified or provenance.report_sha256):  # a run's, not an import's
        provenance.check_report(report, stated_release(report, provenance.run), description)
    return provenance


def stated_release(report: Path, run: str | None) -> Provenance | None:
    """The provenance that the run whose report is `report` (in the directory `run`) gives its models; None: its
    models are no DP release, or there is no report."""
    if not report.is_file():
        return None
    try:
        stated = json.loads(report.read_text())
        return Provenance.of_run(str(stated["method"]), dict(stated["privacy"]), run)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError,
            DpDistillError) as error:
        raise CheckpointError(f"{report} does not state the run's privacy readably ({error}); restore it") from error


def classifier_meta(arch: str, in_shape: tuple[int, ...], class_names: Sequence[str], dataset_name: str | None,
                    init: str | None = None) -> dict:
    """The description saved beside a classifier's weights, enough to rebuild it and to name its classes; with
    `init`, the pretrained encoder it started from and the public pool that encoder saw (so `evaluate` can leave
    those images out)."""
    meta = {"kind": "classifier", "arch": arch, "arch_options": {}, "in_shape": list(in_shape),
            "num_classes": len(class_names), CLASS_NAMES: list(class_names), "dataset": dataset_name,
            "normalisation": "[-1, 1]", "dpdistill_version": __version__}
    if init is None or init == SCATTER_INIT:  # random weights, or a fixed transform: no image seen
        return meta
    encoder = read_meta(Path(init), ENCODER)
    return {**meta, "init": init, "pretrained_on": encoder.get("pretrained_on"),
            PUBLIC_POOL: encoder.get(PUBLIC_POOL)}


def evaluation_set(name: str, in_shape: tuple[int, ...], num_classes: int,
                   class_names: Sequence[str] | None = None) -> ImageDataset:
    """The data set `name`, refused unless its images and number of classes are the model's; warned about where it
    names its classes otherwise than the model (`class_names`): its accuracy then compares labels, not names."""
    dataset = load_dataset(name)
    if tuple(dataset.input_shape) != tuple(in_shape) or dataset.num_classes != num_classes:
        raise DatasetError(
            f"dataset {name!r} has inputs {dataset.input_shape} and {dataset.num_classes} classes, but the model "
            f"expects {tuple(in_shape)} and {num_classes}"
        )
    if class_names is not None and tuple(class_names) != dataset.class_names:
        warnings.warn(f"dataset {name!r} names its classes {describe_classes(dataset.class_names)}, the model "
                      f"{describe_classes(class_names)}: accuracy compares them by label", stacklevel=2)
    return dataset


def model_class_names(meta: dict[str, Any], dataset: ImageDataset | None) -> tuple[str, ...]:
    """The classes a saved model tells apart, by label: as its description names them, else (a model saved before
    descriptions held them) as its evaluation data set does, else by their labels."""
    saved = saved_class_names(meta)
    if saved is not None:
        return saved
    return dataset.class_names if dataset is not None else label_names(int(meta["num_classes"]))


def teacher_accuracy(teacher: nn.Module, meta: dict[str, Any], dataset: ImageDataset | None,
                     dataset_name: str | None, device: str) -> float | None:
    """The teacher's test accuracy; an ensemble's as measured when it was trained, on the same data set."""
    if dataset is None:
        return None
    known = meta.get("ensemble", {})
    if "test_accuracy" in known and known.get("dataset") == dataset_name:
        return known["test_accuracy"]
    return accuracy(teacher, dataset.x_test, dataset.y_test, device=device)
