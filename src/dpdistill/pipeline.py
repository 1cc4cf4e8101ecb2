"""End-to-end jobs shared by the CLI and the demo: train a teacher, transcribe it, evaluate a model."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from safetensors.torch import save_file

from dpdistill import __version__
from dpdistill.data import load_dataset
from dpdistill.data.base import ImageDataset
from dpdistill.data.partition import dirichlet_partition_indices, new_partition_key, partition_indices
from dpdistill.data.public import PUBLIC_POOL, PoolSource, public_split
from dpdistill.errors import ConfigError, DatasetError
from dpdistill.evaluation.metrics import accuracy, predict
from dpdistill.methods.config import TranscriptionConfig
from dpdistill.methods.dpsd import DPSDTranscriber
from dpdistill.models.checkpoint import ENCODER, load_classifier, read_meta, save_model
from dpdistill.models.features import frozen_features
from dpdistill.models.registry import build_classifier
from dpdistill.models.ensemble import (DIRICHLET, KEYED_HASH, PARTITION_ASSUMPTIONS, PARTITION_KEY_FILE,
                                       HeadEnsemble, MemberEnsemble, TeacherEnsemble, declare_partition,
                                       is_ensemble, load_saved, load_teacher, member_directory, plurality_counts,
                                       read_partition_key, save_head_ensemble, write_ensemble_description,
                                       write_partition_key)
from dpdistill.privacy.ledger import Release, ReleaseLedger
from dpdistill.reporting.report import (PRIVATE_DIR, write_json, write_private_record,
                                        write_transcription_report)
from dpdistill.training.teacher import SCATTER_INIT, TeacherConfig, load_encoder, train_classifier, train_heads

if TYPE_CHECKING:
    from dpdistill.training.self_supervised import ContrastiveConfig

Progress = Callable[[dict], None]
ENSEMBLE_PLAN = "ensemble-plan.json"
NEAR_CHANCE = 2  # an imported teacher below this many times chance accuracy is warned about


def train_teacher(dataset_name: str, out_dir: Path, config: TeacherConfig, progress: Progress | None = None) -> dict:
    """Train the (non-private) teacher and write model.safetensors, meta.json and report.json."""
    check_out_dir(out_dir)
    dataset = load_dataset(dataset_name)
    model, training = train_classifier(dataset, config, progress)
    save_model(out_dir, model, _classifier_meta(config.arch, dataset.input_shape, dataset.num_classes, dataset_name,
                                                config.init))
    report = {"dataset": dataset.describe(), "arch": config.arch, "config": dataclasses.asdict(config),
              "accuracy": {"teacher": training["test_accuracy"]}, "history": training["history"],
              "timing": {"wall_seconds": training["wall_seconds"]}, "seed": config.seed,
              "privacy": {"guarantee": "none: this is the private model that dpdistill converts"}}
    write_json(out_dir / "report.json", report)
    return report


def pretrain(dataset_name: str, public: str | None, public_size: int, config: "ContrastiveConfig", out_dir: Path,
             progress: Progress | None = None) -> dict:
    """Contrastive pretraining on PATE's public pool (the same `public` and `public_size` images a PATE run on
    `dataset_name` sees, never the images it measures accuracy on): writes an encoder (encoder.safetensors + .json)
    that `train-teacher --init`, `pate --student-init` and `train-private --student-init` start from, and
    report.json."""
    from dpdistill.training.self_supervised import pretrain_contrastive

    check_out_dir(out_dir)
    evaluation = load_dataset(dataset_name)
    split = public_split(evaluation, public, public_size)
    encoder, training = pretrain_contrastive(split.pool, evaluation.num_classes, config, progress)
    meta = {**_classifier_meta(config.arch, evaluation.input_shape, evaluation.num_classes, dataset_name),
            "kind": "encoder", "pretrained_on": split.description, PUBLIC_POOL: dataclasses.asdict(split.source)}
    save_model(out_dir, encoder, meta, name=ENCODER)
    report = {"method": "contrastive pretraining (SimCLR)", "dataset": dataset_name, "public": split.description,
              "config": dataclasses.asdict(config), "history": training["history"],
              "timing": {"wall_seconds": training["wall_seconds"]}, "seed": config.seed,
              "privacy": {"guarantee": "none needed: public images only, no private example and no teacher"}}
    write_json(out_dir / "report.json", report)
    return report


def train_teacher_ensemble(dataset_name: str, out_dir: Path, config: TeacherConfig, partitions: int,
                           alpha: float | None = None, progress: Progress | None = None,
                           resume: bool = False) -> dict:
    """Train one teacher per disjoint partition of the training split into `out_dir/member-XXX/`, then mark
    `out_dir` as an ensemble; report each member's and the ensemble's accuracy.

    Partitions are a keyed hash of each example's id (data/partition.py), the key drawn afresh from OS entropy
    (not from the seed) and kept in `out_dir` (models/ensemble.py: PARTITION_KEY_FILE); with `alpha`, a seeded
    Dirichlet(alpha) split per class instead, which only simulates owners who hold their data apart.

    Members are kept as they finish (hundreds of them take hours): with `resume`, an interrupted run continues
    with its saved settings and partition key after the last finished member."""
    with _exclusive(out_dir):
        return _train_teacher_ensemble(dataset_name, out_dir, config, partitions, alpha, progress, resume)


def _train_teacher_ensemble(dataset_name: str, out_dir: Path, config: TeacherConfig, partitions: int,
                            alpha: float | None, progress: Progress | None, resume: bool) -> dict:
    state = out_dir / "resume"
    plan_path = state / ENSEMBLE_PLAN
    plan = interrupted_ensemble(out_dir)
    _check_resume(out_dir, state, resume, plan is not None, "ensemble training")
    if resume:
        dataset_name, partitions, alpha = plan["dataset"], plan["partitions"], plan["alpha"]
        config = TeacherConfig(**plan["config"])
    dataset = load_dataset(dataset_name)
    if alpha is None:
        key = read_partition_key(out_dir) if resume else new_partition_key()
        parts = partition_indices(dataset.ids_train, partitions, key)
        partition = {"scheme": KEYED_HASH, "key": f"{PARTITION_KEY_FILE} (private: never release it)"}
        if not resume:  # kept before any member trains, so that a resumed run splits the data the same way
            write_partition_key(out_dir, key)
    else:
        parts = dirichlet_partition_indices(dataset.y_train, partitions, alpha, config.seed)
        partition = {"scheme": DIRICHLET, "alpha": alpha, "seed": config.seed}
    partition["assumption"] = PARTITION_ASSUMPTIONS[partition["scheme"]].statement
    if config.heads_only:  # a minute of work: nothing to resume
        return _train_head_ensemble(dataset, dataset_name, out_dir, config, parts, partition, progress)
    if not resume:
        state.mkdir(parents=True)
        write_json(plan_path, {"dataset": dataset_name, "partitions": partitions, "alpha": alpha,
                               "config": dataclasses.asdict(config)})
    meta = _classifier_meta(config.arch, dataset.input_shape, dataset.num_classes, dataset_name, config.init)
    members, models = [], []
    for index, part in enumerate(parts):
        record_path = state / f"member-{index:03d}.json"
        if record_path.exists():  # finished before the interruption: its record is written after its weights
            model, _ = load_classifier(member_directory(out_dir, index))
            record = json.loads(record_path.read_text())
        else:
            subset = dataset.train_subset(part)
            model, training = train_classifier(subset, dataclasses.replace(config, seed=config.seed + index),
                                               evaluate_each_epoch=False)
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
                                                     "arch": config.arch, "test_accuracy": test_accuracy})
    # the members' own times (also those trained before an interruption) and the ensemble's evaluation
    timing = {"wall_seconds": sum(member["wall_seconds"] for member in members) + evaluation_seconds,
              "evaluation_seconds": evaluation_seconds}
    report = _ensemble_report(dataset, config, partition, members, test_accuracy, vote_accuracy, timing)
    write_json(out_dir / "report.json", report)
    shutil.rmtree(state)
    return report


def _train_head_ensemble(dataset: ImageDataset, dataset_name: str, out_dir: Path, config: TeacherConfig,
                         parts: list[Tensor], partition: dict, progress: Progress | None) -> dict:
    """Members as linear heads on the frozen encoder `config.init`: the training split's features once, then
    all heads at once (training/teacher.train_heads)."""
    started = time.perf_counter()
    if config.init == SCATTER_INIT:  # a fixed transform: nothing pretrained, no public images
        encoder = build_classifier(config.arch, dataset.input_shape, dataset.num_classes)
    else:
        encoder = load_encoder(Path(str(config.init)), config.arch, dataset.input_shape, dataset.num_classes)
    encoder = encoder.to(config.device)
    train_features = frozen_features(encoder.backbone, dataset.x_train, torch.device(config.device),
                                     fixed=encoder.fixed_backbone)
    weight, bias, training = train_heads(train_features, dataset.y_train, parts, dataset.num_classes, config,
                                         progress)
    ensemble = HeadEnsemble(encoder, weight, bias).eval()
    training_seconds = time.perf_counter() - started
    test_accuracy, vote_accuracy, member_accuracies = _ensemble_accuracies(ensemble, dataset, config.device)
    meta = _classifier_meta(config.arch, dataset.input_shape, dataset.num_classes, dataset_name, config.init)
    save_head_ensemble(out_dir, ensemble, {**meta, "encoder": str(config.init)},
                       {"partition": partition, "dataset": dataset_name, "arch": config.arch,
                        "test_accuracy": test_accuracy})
    members = [{"member": index + 1, "examples": len(part), "test_accuracy": member_accuracy}
               for index, (part, member_accuracy) in enumerate(zip(parts, member_accuracies.tolist()))]
    wall_seconds = time.perf_counter() - started
    timing = {"wall_seconds": wall_seconds, "training_seconds": training_seconds,
              "evaluation_seconds": wall_seconds - training_seconds}
    report = {**_ensemble_report(dataset, config, partition, members, test_accuracy, vote_accuracy, timing),
              "history": training["history"]}
    write_json(out_dir / "report.json", report)
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
    plan_path = out_dir / "resume" / ENSEMBLE_PLAN
    return json.loads(plan_path.read_text()) if plan_path.exists() else None


@torch.inference_mode()
def _ensemble_accuracies(ensemble: TeacherEnsemble, dataset: ImageDataset, device: str
                         ) -> tuple[float, float, Tensor]:
    """Test accuracy of the members' mean probability, of their plurality vote (what label-mode aggregation
    counts, before noise) and of each member, from one pass of every member over the test split."""
    ensemble.to(device)
    mean, vote, member_correct = [], [], torch.zeros(len(ensemble))
    for i in range(0, len(dataset.x_test), 1024):
        member_logits = ensemble.member_logits(dataset.x_test[i:i + 1024].to(device))
        mean.append(ensemble.combine(member_logits).argmax(1).cpu())
        vote.append(plurality_counts(member_logits, dataset.num_classes).argmax(1).cpu())
        member_correct += (member_logits.argmax(-1).cpu() == dataset.y_test[i:i + 1024]).sum(1)
    mean_accuracy, vote_accuracy = ((torch.cat(predictions) == dataset.y_test).float().mean().item()
                                    for predictions in (mean, vote))
    return mean_accuracy, vote_accuracy, member_correct / len(dataset.y_test)


def _classifier_meta(arch: str, in_shape: tuple[int, ...], num_classes: int, dataset_name: str | None,
                     init: str | None = None) -> dict:
    """The description saved beside a classifier's weights, enough to rebuild it; with `init`, the pretrained
    encoder it started from and the public pool that encoder saw (so `evaluate` can leave those images out)."""
    meta = {"kind": "classifier", "arch": arch, "arch_options": {}, "in_shape": list(in_shape),
            "num_classes": num_classes, "dataset": dataset_name, "normalisation": "[-1, 1]",
            "dpdistill_version": __version__}
    if init is None or init == SCATTER_INIT:  # random weights, or a fixed transform: no image seen
        return meta
    encoder = read_meta(Path(init), ENCODER)
    return {**meta, "init": init, "pretrained_on": encoder.get("pretrained_on"),
            PUBLIC_POOL: encoder.get(PUBLIC_POOL)}


def _evaluation_set(name: str, in_shape: tuple[int, ...], num_classes: int) -> ImageDataset:
    dataset = load_dataset(name)
    if tuple(dataset.input_shape) != tuple(in_shape) or dataset.num_classes != num_classes:
        raise DatasetError(
            f"dataset {name!r} has inputs {dataset.input_shape} and {dataset.num_classes} classes, but the model "
            f"expects {tuple(in_shape)} and {num_classes}"
        )
    return dataset


def _check_resume(out_dir: Path, state_dir: Path, resume: bool, resumable: bool, what: str) -> None:
    """Refuse `--resume` with nothing to resume, and a fresh start over an unfinished run's state in `state_dir`."""
    if resume and not resumable:
        raise ConfigError(f"nothing to resume in {out_dir}: no interrupted {what} there (start one without --resume)")
    if not resume and state_dir.exists():
        raise ConfigError(f"{out_dir} holds an unfinished run: pass --resume to continue it, or choose another --out")


def release_state(out_dir: Path) -> Path:
    """Where a release run keeps what it needs to resume (checkpoints, raw answers): private, never published."""
    return out_dir / PRIVATE_DIR / "resume"


def check_out_dir(out_dir: Path) -> None:
    """Refuse an --out that cannot hold a run's files before any work: a file, a path through a file, or a folder
    (or, when it does not exist yet, its nearest existing parent) this process may not write to."""
    existing = next(path for path in (out_dir, *out_dir.parents) if path.exists())
    if not existing.is_dir():
        where = "is a file" if existing == out_dir else f"is inside {existing}, which is a file"
        raise ConfigError(f"--out {out_dir} {where}: give a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out_dir}: {existing} is not writable by this user; choose another --out")


@contextlib.contextmanager
def _exclusive(out_dir: Path):
    """Hold an exclusive lock on `out_dir` so that two runs never write the same checkpoints. The lock file goes
    when the run ends, and a run that fails before writing anything (a refused budget) leaves behind none of the
    directories it created."""
    check_out_dir(out_dir)
    created = [directory for directory in (out_dir, *out_dir.parents) if not directory.exists()]  # deepest first
    out_dir.mkdir(parents=True, exist_ok=True)
    lock_path = out_dir / ".lock"
    with open(lock_path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(lock.fileno()).st_ino != os.stat(lock_path).st_ino:  # locked a file a finishing run removed
                raise BlockingIOError
        except (BlockingIOError, FileNotFoundError):
            raise ConfigError(f"another dpdistill run is writing to {out_dir}; wait for it or choose another --out") from None
        try:
            yield
        finally:
            lock_path.unlink(missing_ok=True)  # still held: a run starting now waits for nothing it could clash with
            if not any(out_dir.iterdir()):
                for directory in created:
                    with contextlib.suppress(OSError):  # not empty: something else was put there meanwhile
                        directory.rmdir()


def transcribe(teacher_dir: Path, config: TranscriptionConfig, out_dir: Path, dataset_name: str | None = None,
               resume: bool = False, progress: Progress | None = None) -> dict[str, Any]:
    """Convert the teacher in `teacher_dir` into a private student and generator in `out_dir`.

    The dataset is read only for its test split, to report accuracies. With `resume`, the configuration saved
    in `out_dir` is used and the run continues from its last checkpoint with the budget it had spent.
    """
    with _exclusive(out_dir):
        return _transcribe(teacher_dir, config, out_dir, dataset_name, resume, progress)


def _transcribe(teacher_dir: Path, config: TranscriptionConfig, out_dir: Path, dataset_name: str | None,
                resume: bool, progress: Progress | None) -> dict[str, Any]:
    teacher, meta = load_teacher(teacher_dir)
    config_path = out_dir / "config.json"
    _check_resume(out_dir, release_state(out_dir), resume, config_path.exists(), "transcription")
    if resume:
        config = TranscriptionConfig.from_dict(json.loads(config_path.read_text()))
    if isinstance(teacher, TeacherEnsemble):  # the mechanism aggregates the members' answers
        config = dataclasses.replace(config, privacy=dataclasses.replace(config.privacy, teachers=len(teacher)))
    in_shape, num_classes = tuple(meta["in_shape"]), int(meta["num_classes"])
    dataset_name = dataset_name or meta.get("dataset")
    dataset = _evaluation_set(dataset_name, in_shape, num_classes) if dataset_name else None
    # DPSD, DPDFD and SRR share one loop; their differences are configuration (methods/config.py METHOD_DEFAULTS)
    transcriber = DPSDTranscriber(config, teacher, in_shape, num_classes, dataset, out_dir / PRIVATE_DIR, progress)
    ledger = ReleaseLedger(teacher_dir)
    ledger.reserve(out_dir, config.method, Release.of_plan(transcriber.plan, transcriber.plan.planned_queries), resume)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(config_path, config.to_dict())
    result = transcriber.run(resume=resume)
    spent = ledger.settle(out_dir, config.method, Release.of_plan(result.plan, result.answered))

    student_meta = _classifier_meta(config.student_arch, in_shape, num_classes, dataset_name)
    generator_meta = {"kind": "generator", "latent_dim": config.latent_dim, "out_shape": list(in_shape),
                      "width": list(config.generator_width), "dataset": dataset_name, "dpdistill_version": __version__}
    save_model(out_dir, result.student, student_meta, name="student")
    save_model(out_dir, result.generator, generator_meta, name="generator")
    save_file({"latents": result.latents.cpu().contiguous()}, out_dir / "latents.safetensors")

    with torch.no_grad():
        samples = result.generator(result.latents[:64])
    sample_labels = predict(result.student, samples, device=config.device).tolist()
    privacy = result.privacy_summary()
    privacy["covered"] = coverage(config)
    declare_partition(privacy, meta.get("ensemble"))
    privacy["ledger"] = ledger.standing(spent)
    queries = max(result.answered, 1)
    report = {
        "method": config.method,
        "privacy_mode": config.privacy.mode,
        "dataset": dataset_name,
        "privacy": privacy,
        "accuracy": {"student": result.history[-1].get("student_accuracy") if result.history else None},
        "timing": {"wall_seconds": result.wall_seconds, "samples_per_second": queries / max(result.wall_seconds, 1e-9),
                   "phases": result.phase_seconds},
        "config": config.to_dict(),
        "seed": config.seed,
        "history": result.history,
        "dpdistill_version": __version__,
    }
    write_transcription_report(out_dir, report, samples, sample_labels, result.history)
    write_private_record(out_dir, {"accuracy": {
        "teacher": _teacher_accuracy(teacher, meta, dataset, dataset_name, config.device)}})
    shutil.rmtree(release_state(out_dir), ignore_errors=True)
    return report


def _teacher_accuracy(teacher: nn.Module, meta: dict[str, Any], dataset: ImageDataset | None,
                      dataset_name: str | None, device: str) -> float | None:
    """The teacher's test accuracy; an ensemble's as measured when it was trained, on the same data set."""
    if dataset is None:
        return None
    known = meta.get("ensemble", {})
    if "test_accuracy" in known and known.get("dataset") == dataset_name:
        return known["test_accuracy"]
    return accuracy(teacher, dataset.x_test, dataset.y_test, device=device)


def coverage(config: TranscriptionConfig) -> str:
    """What the stated epsilon covers: only outputs that are post-processing of the noisy releases."""
    if config.privacy.mode == "none":
        return "nothing"
    if config.reproducible_noise:
        return "NO guarantee: the noise is reproducible"
    if config.generator_sees_teacher:
        return ("NO formal guarantee for the student or the generator: the synthetic inputs depend on the "
                "non-private teacher (teacher as discriminator, generator pretrained on the teacher, or adversarial "
                "term); the stated epsilon covers only the teacher's answers given those inputs")
    return "the student, the generator and its latent vectors (post-processing of the noisy releases)"


def evaluate(model_dir: Path, dataset_name: str, name: str | None = None) -> dict[str, Any]:
    """Accuracy of a saved model (models/ensemble.load_saved picks it) on a data set's real test split, and which
    images that was: test images the model learnt from as public images (its starting encoder's pool, or a PATE
    student's) are left out and said so, or, where none would remain, warned about."""
    model, meta, path = load_saved(model_dir, name)
    dataset = _evaluation_set(dataset_name, tuple(meta["in_shape"]), int(meta["num_classes"]))
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
    return {"model": str(path), "dataset": dataset_name,
            "accuracy": accuracy(model, dataset.x_test[start:], dataset.y_test[start:]), "n_test": total - start,
            "measured_on": measured, "warnings": warnings}


def import_teacher(factory: str, weights: Path, dataset_name: str, out_dir: Path,
                   input_transform: dict[str, Any] | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Make a classifier trained outside dpdistill a teacher (models/imported.py): its weights, description and
    factory in `out_dir`, and report.json with its test accuracy, warned about when near chance (the usual sign
    of inputs in another range or normalisation than the model was trained on).

    `overwrite` replaces the teacher files of a non-empty `out_dir` and keeps its release ledger: releases made
    from the private model it held still count."""
    from dpdistill.models.imported import import_classifier, keep_factory

    _check_import_out(out_dir, overwrite)
    dataset = load_dataset(dataset_name)
    model = import_classifier(factory, weights, dataset.input_shape, dataset.num_classes, input_transform)
    out_dir.mkdir(parents=True, exist_ok=True)
    arch, kept = keep_factory(factory, out_dir)
    meta = {**_classifier_meta(arch, dataset.input_shape, dataset.num_classes, dataset_name), "factory": kept,
            "input_transform": input_transform, "imported_from": str(weights.expanduser().resolve())}
    save_model(out_dir, model, meta)
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
              "privacy": {"guarantee": "none: this is the private model that dpdistill converts"}}
    write_json(out_dir / "report.json", report)
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


def train_private(config: "PrivateTrainingConfig | None", out_dir: Path, resume: bool = False,
                  progress: Progress | None = None) -> dict[str, Any]:
    """Train the student on the private data directly (DP-SGD or DPDFD's direct mode): the baseline transcription
    is compared to. With `resume`, the configuration saved in `out_dir` continues from its last finished epoch."""
    with _exclusive(out_dir):
        return _train_private(config, out_dir, resume, progress)


def _train_private(config: "PrivateTrainingConfig | None", out_dir: Path, resume: bool,
                   progress: Progress | None) -> dict[str, Any]:
    from dpdistill.reporting.report import write_private_training_report
    from dpdistill.training.private import TRAINERS, PrivateTrainingConfig, plan_private_training

    config_path = out_dir / "config.json"
    state = release_state(out_dir)
    _check_resume(out_dir, state, resume, state.exists() and config_path.exists(), "train-private run")
    if resume:
        config = PrivateTrainingConfig.from_dict(json.loads(config_path.read_text()))
    dataset = load_dataset(config.dataset)
    started = time.perf_counter()
    plan = plan_private_training(config, len(dataset.y_train))  # refuses an overspending plan before any write
    planning_seconds = time.perf_counter() - started
    trainer = TRAINERS[config.method](config, dataset, plan, out_dir / PRIVATE_DIR, progress)
    write_json(config_path, config.to_dict())
    result = trainer.run(resume)

    meta = _classifier_meta(config.student_arch, dataset.input_shape, dataset.num_classes, config.dataset,
                            config.student_init)
    save_model(out_dir, result.model, {**meta, "opacus_fixed": bool(result.fixes)}, name="student")
    report = {
        "method": config.method,
        "dataset": config.dataset,
        "data": {key: value for key, value in dataset.describe().items() if key != "n_train"},
        "privacy": result.privacy,
        "accuracy": {"student": result.history[-1]["test_accuracy"]},
        "measured_on": trainer.measured_on,
        "timing": {"wall_seconds": result.wall_seconds, "planning_seconds": planning_seconds},
        "config": config.to_dict(),
        "seed": config.seed,
        "history": result.history,
        "notes": [f"Opacus' ModuleValidator.fix changed the student (saved so, rebuilt so on load): {fix}"
                  for fix in result.fixes],
        "dpdistill_version": __version__,
    }
    write_private_training_report(out_dir, report)
    write_private_record(out_dir, result.private_figures)
    shutil.rmtree(state, ignore_errors=True)
    return report


def pate(teacher_dir: Path, config: "PateConfig | None", out_dir: Path, resume: bool = False,
         progress: Progress | None = None) -> dict[str, Any]:
    """PATE on public images (methods/pate.py): the ensemble in `teacher_dir` labels public images through noisy
    votes, and a student learns from them. With `resume`, the run saved in `out_dir` continues from its released
    answers with its saved settings, without asking the ensemble again."""
    with _exclusive(out_dir):
        return _pate(teacher_dir, config, out_dir, resume, progress)


def interrupted_pate(out_dir: Path) -> "tuple[Path, PateConfig] | None":
    """The teacher and settings of the unfinished PATE run in `out_dir` (its answers released), if any."""
    from dpdistill.methods.pate import ANSWERS_FILE, PateConfig

    config_path = out_dir / "config.json"
    if not ((release_state(out_dir) / ANSWERS_FILE).exists() and config_path.exists()):
        return None
    saved = json.loads(config_path.read_text())
    return Path(saved["teacher"]), PateConfig.from_dict(saved["pate"])


def _pate(teacher_dir: Path, config: "PateConfig | None", out_dir: Path, resume: bool,
          progress: Progress | None) -> dict[str, Any]:
    from dpdistill.methods.pate import ANSWERS_FILE, run_pate
    from dpdistill.reporting.report import pate_markdown, write_report

    config_path, state = out_dir / "config.json", release_state(out_dir)
    saved = interrupted_pate(out_dir)
    _check_resume(out_dir, state, resume, saved is not None, "PATE run")
    if resume:
        teacher_dir, config = saved
    ensemble, meta = load_teacher(teacher_dir)
    if not isinstance(ensemble, TeacherEnsemble):
        raise ConfigError(f"{teacher_dir} holds one teacher; PATE needs an ensemble on disjoint partitions "
                          f"(dpdistill train-teacher --partitions M)")
    in_shape, num_classes = tuple(meta["in_shape"]), int(meta["num_classes"])
    dataset_name = config.dataset or meta.get("dataset")
    if not dataset_name:
        raise ConfigError(f"the teachers in {teacher_dir} do not name their data set: give --dataset")
    evaluation = _evaluation_set(dataset_name, in_shape, num_classes)
    plan = config.privacy_plan(len(ensemble), num_classes)
    ledger = ReleaseLedger(teacher_dir)
    release = Release.of_plan(plan, config.queries)  # every query is answered
    ledger.reserve(out_dir, "pate", release, resume)
    write_json(config_path, {"teacher": str(teacher_dir), "pate": config.to_dict()})
    student, figures = run_pate(ensemble, evaluation, config, plan, state, resume, progress)
    figures["privacy"]["ledger"] = ledger.standing(ledger.settle(out_dir, "pate", release))

    pool = public_split(evaluation, config.public, config.public_size).source  # the student learnt from it
    save_model(out_dir, student, {**_classifier_meta(config.student_arch, in_shape, num_classes, dataset_name,
                                                     config.student_init), PUBLIC_POOL: dataclasses.asdict(pool)},
               name="student")
    shutil.copyfile(state / ANSWERS_FILE, out_dir / ANSWERS_FILE)  # the noisy answers are a release: keep them
    history, answer_accuracy = figures.pop("history"), figures.pop("answer_accuracy")
    declare_partition(figures["privacy"], meta["ensemble"])
    report = {
        "method": "pate",
        "dataset": dataset_name,
        "teacher": str(teacher_dir),
        **figures,
        "accuracy": {"student": history[-1]["test_accuracy"], "answers": answer_accuracy},
        "config": config.to_dict(),
        "seed": config.seed,
        "history": history,
        "resumed": resume,
        "dpdistill_version": __version__,
    }
    write_report(out_dir, report, pate_markdown(report))
    write_private_record(out_dir, {"accuracy": {
        "teacher": _teacher_accuracy(ensemble, meta, evaluation, dataset_name, config.device)}})
    shutil.rmtree(state)
    return report
