"""`dpdistill import-teacher`: a model trained elsewhere becomes a teacher that every later command can use from
any directory, without the factory's folder on PYTHONPATH."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

import dpdistill
from dpdistill.cli.main import app
from dpdistill.data import load_dataset
from dpdistill.evaluation.metrics import accuracy
from dpdistill.privacy.ledger import ReleaseLedger

runner = CliRunner()
SRC = Path(dpdistill.__file__).resolve().parents[1]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def import_args(factory: Path, weights: Path, out: Path, *extra) -> list:
    return ["import-teacher", "--factory", f"{factory}:small_resnet", "--weights", weights, "--dataset", "digits",
            "--out", out, *extra]


def dpdistill_elsewhere(cwd: Path, *args) -> subprocess.CompletedProcess:
    """The CLI in a fresh process whose working directory and PYTHONPATH know nothing of the factory's folder."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PYTHONPATH"] = str(SRC)
    return subprocess.run([sys.executable, "-m", "dpdistill.cli.main", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_imported_teacher_works_from_another_directory_without_pythonpath(foreign_teacher, tmp_path):
    factory, weights = foreign_teacher
    teacher = tmp_path / "teacher"
    result = invoke(*import_args(factory, weights, teacher, "--input-range", "0,1"))
    assert result.exit_code == 0, result.output
    report = json.loads((teacher / "report.json").read_text())
    assert report["accuracy"]["teacher"] > 0.6 and report["warnings"] == []
    meta = json.loads((teacher / "meta.json").read_text())
    assert meta["factory"]["file"] == "factory.py" and (teacher / "factory.py").read_text() == factory.read_text()
    assert meta["input_transform"]["range"] == [0.0, 1.0]

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    evaluated = dpdistill_elsewhere(elsewhere, "evaluate", "--model", teacher, "--dataset", "digits")
    assert evaluated.returncode == 0, evaluated.stderr
    figures = json.loads(evaluated.stdout)
    assert figures["accuracy"] == pytest.approx(report["accuracy"]["teacher"], abs=0)
    assert figures["measured_on"] == {"dataset": "digits", "split": "test", "images": 360, "indices": [0, 360],
                                      "of": 360}

    run = tmp_path / "run"
    transcribed = dpdistill_elsewhere(elsewhere, "transcribe", "--teacher", teacher, "--out", run, "--preset", "demo",
                                      "--iterations", "2", "--batch-size", "16", "--privacy", "label",
                                      "--epsilon", "10")
    assert transcribed.returncode == 0, transcribed.stderr
    assert (run / "student.safetensors").exists()
    assert json.loads((run / "report.json").read_text())["privacy"]["teachers"] == 1

    data = load_dataset("digits")
    loaded = dpdistill.load_model(teacher)
    assert accuracy(loaded, data.x_test, data.y_test) == figures["accuracy"]


def test_the_input_range_is_what_makes_the_imported_teacher_accurate(foreign_teacher, tmp_path):
    factory, weights = foreign_teacher
    result = invoke(*import_args(factory, weights, tmp_path / "as-is"))
    assert result.exit_code == 0, result.output
    as_is = json.loads((tmp_path / "as-is" / "report.json").read_text())
    ReleaseLedger(tmp_path / "as-is").set_total(5.0)
    fixed = invoke(*import_args(factory, weights, tmp_path / "as-is", "--input-range", "0,1", "--overwrite"))
    assert fixed.exit_code == 0, fixed.output
    mapped = json.loads((tmp_path / "as-is" / "report.json").read_text())
    assert mapped["accuracy"]["teacher"] > as_is["accuracy"]["teacher"] + 0.1
    assert ReleaseLedger(tmp_path / "as-is").read().total.epsilon == 5.0  # the private model's releases still count


def test_a_model_near_chance_is_imported_with_a_warning(foreign_teacher, tmp_path):
    factory, weights = foreign_teacher
    tensors = load_file(weights)
    zeroed = tmp_path / "zeroed.safetensors"
    save_file({key: torch.zeros_like(value) for key, value in tensors.items()}, zeroed)  # every image: class 0
    result = invoke(*import_args(factory, zeroed, tmp_path / "teacher"))
    assert result.exit_code == 0, result.output
    assert "near chance" in result.stderr and "--input-range" in result.stderr
    assert "near chance" in json.loads((tmp_path / "teacher" / "report.json").read_text())["warnings"][0]


@pytest.mark.parametrize("change, message", [
    (lambda t: {("module." + k): v for k, v in t.items()}, "missing .*'fc.weight'.*unexpected .*'module.fc.weight'"),
    (lambda t: {**t, "fc.weight": torch.full_like(t["fc.weight"], float("nan"))}, "NaN or infinite"),
    (lambda t: {**t, "fc.bias": torch.zeros(3)}, r"wrong shape \['fc.bias'\]"),
])
def test_weights_that_do_not_fit_are_refused_in_one_line(foreign_teacher, tmp_path, change, message):
    factory, weights = foreign_teacher
    broken = tmp_path / "broken.safetensors"
    save_file(change(load_file(weights)), broken)
    result = invoke(*import_args(factory, broken, tmp_path / "teacher"))
    assert result.exit_code == 2 and result.stderr.startswith("error:")
    assert re.search(message, " ".join(result.stderr.split()))  # the terminal's width wraps it, nothing else
    assert not (tmp_path / "teacher").exists()


def test_weights_that_are_not_safetensors_are_refused_without_being_unpickled(foreign_teacher, tmp_path):
    factory, weights = foreign_teacher
    pickled = tmp_path / "model.pt"
    torch.save(load_file(weights), pickled)
    result = invoke(*import_args(factory, pickled, tmp_path / "teacher"))
    assert result.exit_code == 2 and "safetensors.torch.save_file" in " ".join(result.stderr.split())
    missing = invoke(*import_args(factory, tmp_path / "absent.safetensors", tmp_path / "teacher"))
    assert missing.exit_code == 2 and "no weights file at" in missing.stderr


def test_a_factory_that_fails_to_import_is_one_error(foreign_teacher, tmp_path):
    _, weights = foreign_teacher
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nraise RuntimeError('needs a GPU')\n")
    result = invoke("import-teacher", "--factory", f"{broken}:build", "--weights", weights, "--dataset", "digits",
                    "--out", tmp_path / "teacher")
    assert result.exit_code == 2 and "needs a GPU" in result.stderr and "check the file exists" in result.stderr


def test_a_non_empty_out_needs_overwrite(foreign_teacher, tmp_path):
    factory, weights = foreign_teacher
    (tmp_path / "notes.txt").write_text("mine")
    result = invoke(*import_args(factory, weights, tmp_path))
    assert result.exit_code == 2 and "--overwrite" in result.stderr
    (tmp_path / "file").write_text("")
    result = invoke(*import_args(factory, weights, tmp_path / "file" / "teacher"))
    assert result.exit_code == 2 and "is a file" in result.stderr


def test_an_imported_teacher_is_not_an_ensemble(foreign_teacher, tmp_path):
    factory, weights = foreign_teacher
    assert invoke(*import_args(factory, weights, tmp_path / "teacher")).exit_code == 0
    result = invoke("pate", "--teacher", tmp_path / "teacher", "--out", tmp_path / "pate", "--epsilon", "1")
    assert result.exit_code == 2 and "one teacher" in result.stderr
