"""`dpdistill evaluate` says which test images it measured on, and leaves out those the model saw as public images
(its starting encoder's pool, or a PATE student's), warning on stderr and in the JSON."""

import json
from pathlib import Path

from typer.testing import CliRunner

from dpdistill.cli.main import app
from dpdistill.data import load_dataset
from dpdistill.data.public import PoolSource
from dpdistill.evaluation.metrics import accuracy
from dpdistill.models.ensemble import load_saved
from dpdistill.jobs import train_teacher
from dpdistill.training.teacher import TeacherConfig

runner = CliRunner()


def evaluate(model: Path):
    result = runner.invoke(app, ["evaluate", "--model", str(model), "--dataset", "digits"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), " ".join(result.stderr.split())


def test_a_model_started_from_an_encoder_is_measured_outside_its_public_pool(digits_encoder: Path, tmp_path: Path):
    teacher = tmp_path / "teacher"
    train_teacher("digits", teacher, TeacherConfig(epochs=1, batch_size=64, init=str(digits_encoder)))
    figures, stderr = evaluate(teacher)
    assert figures["measured_on"] == {"dataset": "digits", "split": "test", "images": 160, "indices": [200, 360],
                                      "of": 360}
    assert len(figures["warnings"]) == 1 and " ".join(figures["warnings"][0].split()) in stderr
    assert (f"warning: the first 200 test images of digits are public images to this model (it started from the "
            f"encoder {digits_encoder}, pretrained on them); they are left out: accuracy on the other 160") in stderr
    data = load_dataset("digits")
    assert figures["accuracy"] == accuracy(load_saved(teacher)[0], data.x_test[200:], data.y_test[200:])


def test_a_pate_student_is_measured_outside_the_public_images_it_learnt_from(digits_ensemble: Path, tmp_path: Path):
    result = runner.invoke(app, ["pate", "--teacher", str(digits_ensemble), "--epsilon", "10", "--queries", "50",
                                 "--public-size", "300", "--min-steps", "5", "--epochs", "1",
                                 "--self-training-rounds", "0", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    figures, stderr = evaluate(tmp_path)
    assert figures["model"] == str(tmp_path / "student.safetensors")
    assert figures["measured_on"]["indices"] == [300, 360] and figures["n_test"] == 60
    assert "learnt from them as its public images" in stderr


def test_an_ensemble_without_public_images_is_measured_on_the_whole_split(digits_ensemble: Path):
    figures, stderr = evaluate(digits_ensemble)
    assert figures["model"] == str(digits_ensemble / "ensemble.json")
    assert figures["measured_on"]["indices"] == [0, 360] and figures["warnings"] == [] and stderr == ""
    report = json.loads((digits_ensemble / "report.json").read_text())
    assert figures["accuracy"] == report["accuracy"]["teacher"]


def test_only_a_pool_from_the_same_test_split_is_left_out():
    pool = PoolSource("digits", "test", 200)
    assert pool.shared_test_images("digits") == 200
    assert pool.shared_test_images("mnist") == 0
    assert PoolSource("digits", "train", 200).shared_test_images("digits") == 0
