"""The jobs that are not a method's release: training a teacher or a teacher ensemble, pretraining an encoder on
public images, importing a model trained elsewhere, measuring a saved model. Each takes the --out lock and
refuses an occupied --out as a method's run does (runs.py)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import Tensor

from dpdistill import __version__
from dpdistill.data import load_dataset
from dpdistill.data.base import ImageDataset
from dpdistill.data.partition import dirichlet_partition_indices, new_partition_key, partition_indices
from dpdistill.data.public import PUBLIC_POOL, PoolSource, public_split
from dpdistill.errors import ConfigError
from dpdistill.evaluation.metrics import accuracy, share_correct
from dpdistill.methods.base import data_read
from dpdistill.methods.teachers import DATA_DIGEST, classifier_meta, evaluation_set, model_class_names
from dpdistill.models.checkpoint import CLASS_NAMES, ENCODER, load_classifier, save_model, saved_class_names
from dpdistill.models.ensemble import (DIRICHLET, KEYED_HASH, PARTITION_ASSUMPTIONS, PARTITION_KEY_FILE,
                                       HeadEnsemble, MemberEnsemble, TeacherEnsemble, is_ensemble, load_saved,
                                       member_directory, plurality_counts, read_partition_key, save_head_ensemble,
                                       write_ensemble_description, write_partition_key)
from dpdistill.models.features import frozen_features
from dpdistill.models.registry import build_classifier
from dpdistill.privacy.provenance import PROVENANCE, Provenance
from dpdistill.progress import Progress, announce_start, in_phase
from dpdistill.reporting.jobs import job_markdown
from dpdistill.reporting.report import write_json, write_report
from dpdistill.runs import ENSEMBLE_STATE, check_out_dir, claim_out_dir, exclusive, write_config
from dpdistill.training.teacher import SCATTER_INIT, TeacherConfig, load_encoder, train_classifier, train_heads

if TYPE_CHECKING:
    from dpdistill.training.self_supervised import ContrastiveConfig

ENSEMBLE_PLAN = "ensemble-plan.json"
NEAR_CHANCE = 2  # an imported teacher below this many times chance accuracy is warned about


def train_teacher(dataset_name: str, out_dir: Path, config: TeacherConfig, progress: Progress | None = None,
                  overwrite: bool = False) -> dict:
    """Train the (non-private) teacher: model.safetensors and meta.json, with config.json and the report."""
    with exclusive(out_dir):
        clear_previous = claim_out_dir(out_dir, False, overwrite, False, "teacher training")
        return _train_teacher(dataset_name, out_dir, config, progress, clear_previous)


def _train_teacher(dataset_name: str, out_dir: Path, config: TeacherConfig, progress: Progress | None,
                   clear_previous: Callable[[], None]) -> dict:
    dataset = load_dataset(dataset_name)
    clear_previous()
    announce_start(progress)
    model, training = train_classifier(dataset, config, progress)
    save_model(out_dir, model, {**classifier_meta(config.arch, dataset.input_shape, dataset.class_names, dataset_name,
                                                  config.init), DATA_DIGEST: data_read(dataset, dataset_name)[0]})
    report = {"dataset": dataset.describe(), "arch": config.arch, "config": dataclasses.asdict(config),
              "accuracy": {"teacher": training["test_accuracy"]}, "history": training["history"],
              "timing": {"wall_seconds": training["wall_seconds"]}, "seed": config.seed,
              "privacy": {"guarantee": "none: this is the private model that dpdistill converts"}}
    _publish(out_dir, {"dataset": dataset_name, "config": dataclasses.asdict(config)}, report, "Teacher")
    return report


def pretrain(dataset_name: str, public: str | None, public_size: int, config: "ContrastiveConfig", out_dir: Path,
             progress: Progress | None = None, overwrite: bool = False) -> dict:
    """Contrastive pretraining on PATE's public pool (the same `public` and `public_size` images a PATE run on
    `dataset_name` sees, never the images it measures accuracy on): writes an encoder (encoder.safetensors + .json)
    that `train-teacher --init`, `pate --student-init` and `train-private --student-init` start from, and
    the report."""
    with exclusive(out_dir):
        clear_previous = claim_out_dir(out_dir, False, overwrite, False, "pretraining")
        return _pretrain(dataset_name, public, public_size, config, out_dir, progress, clear_previous)


def _pretrain(dataset_name: str, public: str | None, public_size: int, config: "ContrastiveConfig", out_dir: Path,
              progress: Progress | None, clear_previous: Callable[[], None]) -> dict:
    from dpdistill.training.self_supervised import pretrain_contrastive

    evaluation = load_dataset(dataset_name)
    split = public_split(evaluation, public, public_size)
    clear_previous()
    announce_start(progress)
    encoder, training = pretrain_contrastive(split.pool, evaluation.num_classes, config, progress)
    meta = {**classifier_meta(config.arch, evaluation.input_shape, evaluation.class_names, dataset_name),
            "kind": "encoder", "pretrained_on": split.description, PUBLIC_POOL: dataclasses.asdict(split.source)}
    save_model(out_dir, encoder, meta, name=ENCODER)
    report = {"method": "contrastive pretraining (SimCLR)", "dataset": dataset_name, "public": split.description,
              "config": dataclasses.asdict(config), "history": training["history"],
              "timing": {"wall_seconds": training["wall_seconds"]}, "seed": config.seed,
              "privacy": {"guarantee": "none needed: public images only, no private example and no teacher"}}
    _publish(out_dir, {"dataset": dataset_name, "public": public, "public_size": public_size,
             "config": dataclasses.asdict(config)}, report, "Encoder (contrastive pretraining)")
    return report


def train_teacher_ensemble(dataset_name: str, out_dir: Path, config: TeacherConfig, partitions: int,
                           alpha: float | None = None, progress: Progress | None = None,
                           resume: bool = False, overwrite: bool = False, holding: Tensor | None = None) -> dict:
    """Train one teacher per disjoint partition of the training split into `out_dir/member-XXX/`, then mark
    `out_dir` as an ensemble; report each member's and the ensemble's accuracy.

    Partitions are a keyed hash of each example's id (data/partition.py), the key drawn afresh from OS entropy
    (not from the seed) and kept in `out_dir` (models/ensemble.py: PARTITION_KEY_FILE); with `alpha`, a seeded
    Dirichlet(alpha) split per class instead, which only simulates owners who hold their data apart.

    Members are kept as they finish (hundreds of them take hours): with `resume`, an interrupted run continues
    with its saved settings and partition key after the last finished member. `holding`: positions of the
    training split that are all this ensemble may learn from (one data owner's examples in a federation)."""
    with exclusive(out_dir):
        clear_previous = claim_out_dir(out_dir, resume, overwrite, interrupted_ensemble(out_dir) is not None,
                                       "ensemble training")
        return _train_teacher_ensemble(dataset_name, out_dir, config, partitions, alpha, progress, resume,
                                       clear_previous, holding)


def _train_teacher_ensemble(dataset_name: str, out_dir: Path, config: TeacherConfig, partitions: int,
                            alpha: float | None, progress: Progress | None, resume: bool,
                            clear_previous: Callable[[], None], holding: Tensor | None) -> dict:
    state = out_dir / ENSEMBLE_STATE
    plan_path = state / ENSEMBLE_PLAN
    plan = interrupted_ensemble(out_dir)
    if resume:
        dataset_name, partitions, alpha = plan["dataset"], plan["partitions"], plan["alpha"]
        config = TeacherConfig(**plan["config"])
    dataset = load_dataset(dataset_name)
    # an owner's holding is part of the data set: its releases count for the data set's examples
    digest, _ = data_read(dataset, dataset_name)
    if holding is not None:
        dataset = dataset.train_subset(holding)
    clear_previous()
    announce_start(progress)
    if alpha is None:
        key = read_partition_key(out_dir) if resume else new_partition_key()
        parts = partition_indices(dataset.ids_train, partitions, key)
        partition = {"scheme": KEYED_HASH, "key": f"{PARTITION_KEY_FILE} (private: never release it)",
                     "ids": dataset.ids_source}
        if not resume:  # kept before any member trains, so that a resumed run splits the data the same way
            write_partition_key(out_dir, key)
    else:
        parts = dirichlet_partition_indices(dataset.y_train, partitions, alpha, config.seed)
        partition = {"scheme": DIRICHLET, "alpha": alpha, "seed": config.seed}
    partition["assumption"] = PARTITION_ASSUMPTIONS[partition["scheme"]].statement
    # the settings: what a resumed run continues with, and the finished ensemble's config.json
    settings = {"dataset": dataset_name, "partitions": partitions, "alpha": alpha, "config": dataclasses.asdict(config)}
    if config.heads_only:  # a minute of work: nothing to resume
        return _train_head_ensemble(dataset, settings, out_dir, config, parts, partition, progress, digest)
    if not resume:
        state.mkdir(parents=True)
        write_json(plan_path, settings)
    meta = classifier_meta(config.arch, dataset.input_shape, dataset.class_names, dataset_name, config.init)
    members, models = [], []
    for index, part in enumerate(parts):
        record_path = state / f"member-{index:03d}.json"
        if record_path.exists():  # finished before the interruption: its record is written after its weights
            model, _ = load_classifier(member_directory(out_dir, index))
            record = json.loads(record_path.read_text())
        else:
            subset = dataset.train_subset(part)
            model, training = train_classifier(subset, dataclasses.replace(config, seed=config.seed + index),
                                               in_phase(progress, f"member {index + 1}/{partitions}"),
                                               evaluate_each_epoch=False)  # a member can train for minutes
            save_model(member_directory(out_dir, index), model, meta)
            record = {"member": index + 1, "examples": len(part), "test_accuracy": training["test_accuracy"],
                      "wall_seconds": training["wall_seconds"]}
            write_json(record_path, record)
        models.append(model)
        members.append(record)
        if progress:
            progress(record)
    # Kept in ensemble.json: M forward passes over the test split cost minutes, and every transcription reports it
    started = time.perf_counter()
    test_accuracy, vote_accuracy, _ = _ensemble_accuracies(MemberEnsemble(models).eval(), dataset, config.device)
    evaluation_seconds = time.perf_counter() - started
    write_ensemble_description(out_dir, partitions, {"partition": partition, "dataset": dataset_name,
                                                     "arch": config.arch, "test_accuracy": test_accuracy,
                                                     DATA_DIGEST: digest})
    # the members' own times (also those trained before an interruption) and the ensemble's evaluation
    timing = {"wall_seconds": sum(member["wall_seconds"] for member in members) + evaluation_seconds,
              "evaluation_seconds": evaluation_seconds}
    report = _ensemble_report(dataset, config, partition, members, test_accuracy, vote_accuracy, timing)
    _publish(out_dir, settings, report, "Teacher ensemble")
    shutil.rmtree(state)
    return report


def _train_head_ensemble(dataset: ImageDataset, settings: dict[str, Any], out_dir: Path, config: TeacherConfig,
                         parts: list[Tensor], partition: dict, progress: Progress | None, digest: str) -> dict:
    """Members as linear heads on the frozen encoder `config.init`: the training split's features once, then
    all heads at once (training/teacher.train_heads); `settings`, the ensemble's (its config.json); `digest`, the
    data set's (its ledger's key)."""
    dataset_name = settings["dataset"]
    started = time.perf_counter()
    if config.init == SCATTER_INIT:  # a fixed transform: nothing pretrained, no public images
        encoder = build_classifier(config.arch, dataset.input_shape, dataset.num_classes)
    else:
        encoder = load_encoder(Path(str(config.init)), config.arch, dataset.input_shape, dataset.num_classes)
    encoder = encoder.to(config.device)
    train_features = frozen_features(encoder.backbone, dataset.x_train, torch.device(config.device),
                                     fixed=encoder.fixed_backbone, progress=progress)
    weight, bias, training = train_heads(train_features, dataset.y_train, parts, dataset.num_classes, config,
                                         progress)
    ensemble = HeadEnsemble(encoder, weight, bias).eval()
    training_seconds = time.perf_counter() - started
    test_accuracy, vote_accuracy, member_accuracies = _ensemble_accuracies(ensemble, dataset, config.device)
    meta = classifier_meta(config.arch, dataset.input_shape, dataset.class_names, dataset_name, config.init)
    save_head_ensemble(out_dir, ensemble, {**meta, "encoder": str(config.init)},
                       {"partition": partition, "dataset": dataset_name, "arch": config.arch,
                        "test_accuracy": test_accuracy, DATA_DIGEST: digest})
    members = [{"member": index + 1, "examples": len(part), "test_accuracy": member_accuracy}
               for index, (part, member_accuracy) in enumerate(zip(parts, member_accuracies.tolist()))]
    wall_seconds = time.perf_counter() - started
    timing = {"wall_seconds": wall_seconds, "training_seconds": training_seconds,
              "evaluation_seconds": wall_seconds - training_seconds}
    report = {**_ensemble_report(dataset, config, partition, members, test_accuracy, vote_accuracy, timing),
              "history": training["history"]}
    _publish(out_dir, settings, report, "Teacher ensemble")
    return report


def _ensemble_report(dataset: ImageDataset, config: TeacherConfig, partition: dict, members: list[dict],
                     test_accuracy: float, vote_accuracy: float, timing: dict) -> dict:
    member_accuracies = [member["test_accuracy"] for member in members]
    layout = ("separate networks" if not config.heads_only
              else "linear heads on scattering features (no encoder)" if config.init == SCATTER_INIT
              else "linear heads on the frozen encoder " + str(config.init))
    return {"dataset": dataset.describe(), "arch": config.arch, "config": dataclasses.asdict(config),
            "ensemble": {"members": len(members), "partition": partition, "layout": layout},
            "accuracy": {"teacher": test_accuracy,
                         "plurality_vote": vote_accuracy,
                         "member_mean": sum(member_accuracies) / len(members),
                         "member_min": min(member_accuracies), "member_max": max(member_accuracies)},
            "members": members, "seed": config.seed, "timing": timing,
            "privacy": {"guarantee": "none: these are the private models that dpdistill converts; one private "
                                     f"example is in exactly one member's partition; partition: "
                                     f"{partition['assumption']}"}}


def interrupted_ensemble(out_dir: Path) -> dict | None:
    """The settings of the unfinished ensemble training in `out_dir` (dataset, partitions, alpha, config), if any."""
    plan_path = out_dir / ENSEMBLE_STATE / ENSEMBLE_PLAN
    return json.loads(plan_path.read_text()) if plan_path.exists() else None


@torch.inference_mode()
def _ensemble_accuracies(ensemble: TeacherEnsemble, dataset: ImageDataset, device: str
                         ) -> tuple[float, float, Tensor]:
    """Test accuracy of the members' mean probability, of their plurality vote (what label-mode aggregation
    counts, before noise) and of each member, from one pass of every member over the test split. Heads on a
    fixed transform read its cached coefficients of the test split (a federation's owners share them)."""
    ensemble.to(device)
    fixed = isinstance(ensemble, HeadEnsemble) and ensemble.encoder.fixed_backbone
    features = (frozen_features(ensemble.encoder.backbone, dataset.x_test, torch.device(device), fixed=True)
                if fixed else None)
    mean, vote, member_correct = [], [], torch.zeros(len(ensemble))
    for i in range(0, len(dataset.x_test), 1024):
        member_logits = (ensemble.head_logits(features[i:i + 1024].to(device)) if fixed
                         else ensemble.member_logits(dataset.x_test[i:i + 1024].to(device)))
        mean.append(ensemble.combine(member_logits).argmax(1).cpu())
        vote.append(plurality_counts(member_logits, dataset.num_classes).argmax(1).cpu())
        member_correct += (member_logits.argmax(-1).cpu() == dataset.y_test[i:i + 1024]).sum(1)
    mean_accuracy, vote_accuracy = (share_correct(torch.cat(predictions), dataset.y_test)
                                    for predictions in (mean, vote))
    return mean_accuracy, vote_accuracy, member_correct / len(dataset.y_test)


def evaluate(model_dir: Path, dataset_name: str, name: str | None = None) -> dict[str, Any]:
    """Accuracy of a saved model (models/ensemble.load_saved picks it) on a data set's real test split, its classes'
    names, and which images that was: test images the model learnt from as public images (its starting encoder's
    pool, or a PATE student's) are left out and said so, or, where none would remain, warned about."""
    model, meta, path = load_saved(model_dir, name)
    dataset = evaluation_set(dataset_name, tuple(meta["in_shape"]), int(meta["num_classes"]), saved_class_names(meta))
    total = len(dataset.y_test)
    seen = PoolSource(**meta[PUBLIC_POOL]).shared_test_images(dataset.name) if meta.get(PUBLIC_POOL) else 0
    start = seen if seen < total else 0
    warnings = []
    if seen:
        how = (f"started from the encoder {meta['init']}, pretrained on them" if meta.get("init")
               else "learnt from them as its public images")
        outcome = (f"they are left out: accuracy on the other {total - seen}" if start
                   else "none would remain, so this accuracy includes images it has seen")
        warnings.append(f"the first {seen} test images of {dataset.name} are public images to this model (it {how}); "
                        f"{outcome}")
    measured = {"dataset": dataset.name, "split": "test", "images": total - start, "indices": [start, total],
                "of": total}
    return {"model": str(path), "dataset": dataset_name, CLASS_NAMES: list(model_class_names(meta, dataset)),
            "accuracy": accuracy(model, dataset.x_test[start:], dataset.y_test[start:]), "n_test": total - start,
            "measured_on": measured, "warnings": warnings}


def import_teacher(factory: str, weights: Path, dataset_name: str, out_dir: Path,
                   input_transform: dict[str, Any] | None = None, overwrite: bool = False,
                   declared: Provenance | None = None, code: Path | None = None) -> dict[str, Any]:
    """Make a classifier trained outside dpdistill a teacher (models/imported.py): its weights, description and
    factory (with the code beside it, or in the folder `code`) in `out_dir`, and a report with its test accuracy, warned about when near chance (the usual sign
    of inputs in another range or normalisation than the model was trained on). `declared`: the DP guarantee its
    owner declares it was trained under, kept as that claim (its transcriptions then cost nothing more).

    `overwrite` replaces the teacher files of a non-empty `out_dir` and keeps its release ledger: releases made
    from the private model it held still count."""
    from dpdistill.models.code import factory_code, keep_factory
    from dpdistill.models.imported import import_classifier

    _check_import_out(out_dir, overwrite)
    dataset = load_dataset(dataset_name)
    model = import_classifier(factory, weights, dataset.input_shape, dataset.num_classes, input_transform)
    code_kept = factory_code(factory, code)  # refused before anything is written: a folder that is not its code
    out_dir.mkdir(parents=True, exist_ok=True)
    arch, kept = keep_factory(factory, code_kept, out_dir)
    meta = {**classifier_meta(arch, dataset.input_shape, dataset.class_names, dataset_name), "factory": kept,
            "input_transform": input_transform, "imported_from": str(weights.expanduser().resolve())}
    if declared is None:  # a model trained without DP on these data (as --dataset says): its releases are theirs
        meta[DATA_DIGEST] = data_read(dataset, dataset_name)[0]
    save_model(out_dir, model, meta, provenance=declared)
    teacher, _ = load_classifier(out_dir)  # as every later command will: from the copied factory
    test_accuracy = accuracy(teacher, dataset.x_test, dataset.y_test)
    chance = 1 / dataset.num_classes
    warnings = [] if test_accuracy >= NEAR_CHANCE * chance else [
        f"test accuracy {100 * test_accuracy:.1f}% is near chance ({100 * chance:.1f}%): dpdistill feeds images in "
        f"[-1, 1]; if the model was trained on other inputs, import it again with --input-range 0,1 and/or "
        f"--normalize MEAN,STD as in its training (and --overwrite)"]
    report = {"dataset": dataset.describe(), "arch": arch, "factory": kept, "weights": meta["imported_from"],
              "input_transform": input_transform, "accuracy": {"teacher": test_accuracy}, "chance": chance,
              "warnings": warnings, "dpdistill_version": __version__,
              "privacy": {"guarantee": "none: this is the private model that dpdistill converts"} if declared is None
              else {"guarantee": declared.statement(), "declared": declared.to_json()}}
    _publish(out_dir, {"dataset": dataset_name, "factory": factory, "weights": str(weights),
             "input_transform": input_transform, "declared": None if declared is None else declared.to_json()},
             report, "Imported teacher")
    return report


def _check_import_out(out_dir: Path, overwrite: bool) -> None:
    """An import writes into a new or empty directory, or with `overwrite` over a single teacher (an ensemble's
    ensemble.json would hide it)."""
    check_out_dir(out_dir)
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    if not overwrite:
        raise ConfigError(f"--out {out_dir} is not empty: choose a new directory, or pass --overwrite to replace "
                          f"the teacher there")
    if is_ensemble(out_dir):
        raise ConfigError(f"--out {out_dir} holds a teacher ensemble; an imported model is a single teacher: choose "
                          f"another --out")


def _publish(out_dir: Path, settings: dict[str, Any], report: dict[str, Any], title: str) -> None:
    """What every job leaves, as a method's run does: its settings (config.json), report.json and report.md."""
    write_config(out_dir, settings)
    write_report(out_dir, report, job_markdown(report, title))
