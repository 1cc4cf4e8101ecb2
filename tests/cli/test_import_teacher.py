"""`dpdistill import-teacher`: a model trained elsewhere becomes a teacher that every later command can use from
any directory, without the factory's folder on PYTHONPATH."""

import json
import re
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
from helpers import dpdistill_elsewhere

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def import_args(factory: Path, weights: Path, out: Path, *extra) -> list:
    return ["import-teacher", "--factory", f"{factory}:small_resnet", "--weights", weights, "--dataset", "digits",
            "--out", out, *extra]


@pytest.mark.slow
def test_imported_teacher_works_from_another_directory_without_pythonpath(foreign_teacher, tmp_path):
    factory, weights = foreign_teacher
    teacher = tmp_path / "teacher"
    result = invoke(*import_args(factory, weights, teacher, "--input-range", "0,1"))
    assert result.exit_code == 0, result.output
    report = json.loads((teacher / "report.json").read_text())
    assert report["accuracy"]["teacher"] > 0.6 and report["warnings"] == []
    meta = json.loads((teacher / "meta.json").read_text())
    assert meta["factory"]["file"] == "code/my_resnet.py"
    assert (teacher / "code" / "my_resnet.py").read_text() == factory.read_text()
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
                                      "--epsilon", "10", "--accept-noise")  # a shape check, near random
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


MODEL_PACKAGE = {
    "nets/__init__.py": "",
    "nets/layers.py": "import torch.nn as nn\n\n\ndef head(width, classes):\n    return nn.Linear(width, classes)\n",
    "mynet.py": ("import torch.nn as nn\nfrom nets.layers import head\n\n\nclass Net(nn.Sequential):\n"
                 "    def __init__(self, classes):\n        super().__init__(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(),"
                 " head(16, classes))\n"),
    "factory.py": "from mynet import Net\n\n\ndef build(num_classes):\n    return Net(num_classes)\n",
    "data/notes.txt": "not code: stays behind",
}


def test_model_code_spanning_files_and_a_package_is_kept_and_loads_from_anywhere(tmp_path: Path):
    """factory.py imports mynet beside it, which imports the package nets: all kept, and every later command
    loads the teacher from another directory with nothing on PYTHONPATH."""
    project = tmp_path / "project"
    for name, text in MODEL_PACKAGE.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    torch.manual_seed(0)
    network = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))
    weights = tmp_path / "net.safetensors"
    save_file({key: value.contiguous() for key, value in network.state_dict().items()}, weights)
    teacher = tmp_path / "teacher"
    result = invoke("import-teacher", "--factory", f"{project / 'factory.py'}:build", "--weights", weights,
                    "--dataset", "digits", "--out", teacher)
    assert result.exit_code == 0, result.output
    kept = sorted(str(path.relative_to(teacher / "code")) for path in (teacher / "code").rglob("*.py"))
    assert kept == ["factory.py", "mynet.py", "nets/__init__.py", "nets/layers.py"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    evaluated = dpdistill_elsewhere(elsewhere, "evaluate", "--model", teacher, "--dataset", "digits")
    assert evaluated.returncode == 0, evaluated.stderr
    x = load_dataset("digits").x_test
    assert json.loads(evaluated.stdout)["accuracy"] == pytest.approx(accuracy(network.eval(), x,
                                                                              load_dataset("digits").y_test), abs=0)

    refused = invoke("import-teacher", "--factory", f"{project / 'factory.py'}:build", "--weights", weights,
                     "--dataset", "digits", "--out", tmp_path / "other", "--code", project / "nets")
    assert refused.exit_code == 2 and "is not inside --code" in refused.stderr
    assert not (tmp_path / "other").exists()
