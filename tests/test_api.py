"""dpdistill's Python API: one call per command, with the command line's defaults, and load_model."""

import dataclasses
import inspect
import json
from pathlib import Path

import pytest
import torch
from torch import nn

import dpdistill
from dpdistill import api
from dpdistill.cli import main as cli
from dpdistill.defaults import PUBLIC_POOL_SIZE, TEACHER_MIN_STEPS
from dpdistill.errors import ConfigError
from dpdistill.jobs import evaluate
from dpdistill.training.self_supervised import ContrastiveConfig
from dpdistill.training.teacher import TeacherConfig


def _cli_defaults(command) -> dict:
    return {name: parameter.default.default for name, parameter in inspect.signature(command).parameters.items()}


def _field_defaults(config) -> dict:
    return {field.name: field.default for field in dataclasses.fields(config)
            if field.default is not dataclasses.MISSING}


@pytest.mark.parametrize("command, config, api_defaults", [
    (cli.train_teacher_command, TeacherConfig, {"min_steps": TEACHER_MIN_STEPS}),
    (cli.pretrain_command, ContrastiveConfig, {"public_size": PUBLIC_POOL_SIZE}),
])
def test_the_api_has_the_command_lines_defaults(command, config, api_defaults):
    cli_defaults, effective = _cli_defaults(command), {**_field_defaults(config), **api_defaults}
    shared = set(cli_defaults) & set(effective)
    assert len(shared) >= 6
    assert {name: cli_defaults[name] for name in shared} == {name: effective[name] for name in shared}


def test_train_teacher_then_transcribe_and_evaluate(tmp_path: Path):
    teacher = dpdistill.train_teacher("digits", tmp_path / "teacher", epochs=1, min_steps=5, batch_size=64,
                                      budget=20)
    assert isinstance(teacher.model, nn.Module) and teacher.out == tmp_path / "teacher"
    assert teacher.report["config"]["min_steps"] == 5
    assert json.loads((teacher.out / "ledger.json").read_text())["total"]["epsilon"] == 20
    run = dpdistill.transcribe(teacher.out, tmp_path / "run", preset="demo", iterations=2, batch_size=16,
                               privacy="label", epsilon=10)
    assert run.report["privacy"]["epsilon"] <= 10 and run.report["config"]["iterations"] == 2
    evaluated = dpdistill.evaluate(run.out, "digits")
    assert evaluated.report == evaluate(run.out, "digits")
    x = torch.zeros(3, 1, 8, 8)
    assert torch.equal(run.student(x), dpdistill.load_model(run.out)(x))
    with pytest.raises(ConfigError, match="overwrite"):  # a finished run is never replaced silently
        dpdistill.transcribe(teacher.out, run.out, preset="demo", iterations=2, batch_size=16, privacy="label",
                             epsilon=10)
    again = dpdistill.transcribe(teacher.out, run.out, preset="demo", iterations=3, batch_size=16, privacy="label",
                                 epsilon=10, overwrite=True)
    assert again.report["config"]["iterations"] == 3


def test_ensemble_options_need_partitions(tmp_path: Path):
    with pytest.raises(ConfigError, match="partitions > 1"):
        dpdistill.train_teacher("digits", tmp_path, dirichlet_alpha=0.5)


def test_the_package_exports_the_api_lazily():
    assert set(dpdistill.__all__) >= {"load_model", "import_teacher", "train_teacher", "pretrain", "transcribe",
                                      "pate", "train_private", "release", "evaluate"}
    assert dpdistill.load_model is api.load_model
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        dpdistill.nothing


def test_federated_is_the_api_call_even_once_its_package_is_imported(tmp_path: Path):
    import dpdistill.federated.method  # noqa: F401  (the subpackage now is an attribute of dpdistill)

    with pytest.raises(ConfigError, match="federated takes no option 'client'.* any field of FederatedConfig"):
        dpdistill.federated("digits", 2, tmp_path, client=3)
