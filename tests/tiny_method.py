"""A small method with its own command, written as a new method is: its configuration with `setting(...)`, its
`Method`, and its `COMMAND` with its audit route. tests/test_options.py registers it with one line in
dpdistill.commands.DECLARED and finds its command, API function and audit route working. It trains a classifier without privacy, the least a
method can be."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpdistill.data import load_dataset
from dpdistill.errors import ConfigError
from dpdistill.methods.base import Job, Method, Needs, Outcome, Source
from dpdistill.methods.lifecycle import execute
from dpdistill.methods.teachers import classifier_meta
from dpdistill.options import (OVERWRITE_OPTION, AuditRoute, CommandSpec, field_options, out_option, resume_option,
                               setting)
from dpdistill.progress import Progress
from dpdistill.training.teacher import TeacherConfig, train_classifier


@dataclass(frozen=True)
class TinyConfig:
    dataset: str = setting("digits", "the data it learns from")
    epochs: int = setting(1, "passes over the training split", min=1)
    width: str = setting("cnn", "the classifier's architecture")
    seed: int = setting(0, "initialisation and order")

    def __post_init__(self) -> None:
        if self.width not in ("cnn", "datalens"):
            raise ConfigError(f"unknown --width {self.width!r}: choose cnn or datalens")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class TinyJob(Job):
    def __init__(self, config: TinyConfig, progress: Progress | None) -> None:
        self.config, self.progress = config, progress

    def run(self, resume: bool) -> Outcome:
        dataset = load_dataset(self.config.dataset)
        model, training = train_classifier(dataset, TeacherConfig(arch=self.config.width, epochs=self.config.epochs,
                                                                  seed=self.config.seed), self.progress)
        meta = classifier_meta(self.config.width, dataset.input_shape, dataset.class_names, self.config.dataset)
        return Outcome(report={"dataset": self.config.dataset, "accuracy": {"student": training["test_accuracy"]},
                               "timing": {"wall_seconds": training["wall_seconds"]}},
                       privacy={"mode": "none", "epsilon": None, "formal_guarantee": False},
                       covers="nothing: no privacy", models={"student": (model, meta)}, private_record=dict)


class Tiny(Method):
    name = summary = command = "tiny"
    needs, paper = Needs.PRIVATE_DATA, "none"

    def plan(self, source: Source, config: TinyConfig, out_dir: Path, progress: Progress | None) -> Job:
        return TinyJob(config, progress)

    def config_record(self, source: Source, config: TinyConfig) -> dict[str, Any]:
        return config.to_dict()

    def interrupted(self, out_dir: Path) -> None:
        return None

    def markdown(self, report: dict[str, Any]) -> str:
        return f"# tiny\n\naccuracy {report['accuracy']['student']:.3f}\n"


COMMAND = CommandSpec(
    name="tiny", help="A classifier without privacy. The least a method can be.",
    options=(out_option("its directory"), *field_options(TinyConfig, ("dataset", "epochs", "width", "seed")),
             resume_option(), OVERWRITE_OPTION),
    configure=lambda values: TinyConfig(**COMMAND.field_values(values)),
    run=lambda values, config, progress: execute(Tiny(), Source(), config, Path(values["out"]), values["resume"],
                                                 values["overwrite"], progress),
    progress_of=lambda values, config: (config.epochs, "tiny epochs"), positional=("out",),
    audits=(AuditRoute("tiny", "a classifier without privacy: what an audit finds with no guarantee to test",
                       {"dataset": "data"}),))
