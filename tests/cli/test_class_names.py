"""A folder of images by class end to end: its class folders' names travel into every model's description, the
reports, the figures' titles and `dpdistill evaluate`, which warns where a data set names its classes otherwise."""

import json
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from typer.testing import CliRunner

from dpdistill.cli.main import app

from helpers import write_image_folder

runner = CliRunner()
NAMES = ["cat", "dog", "emu"]


def invoke(*args):
    result = runner.invoke(app, [str(arg) for arg in args])
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture
def drawn(monkeypatch) -> list[Figure]:
    """Every figure saved, kept to read its texts."""
    figures = []
    original = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda figure, *args, **kwargs: (figures.append(figure),
                                                                            original(figure, *args, **kwargs)))
    return figures


def texts(figure: Figure) -> list[str]:
    return [text.get_text() for axis in figure.axes for text in axis.texts]


@pytest.mark.slow
def test_a_teacher_and_its_transcription_carry_the_folder_names(tmp_path: Path, drawn):
    pets = write_image_folder(tmp_path / "pets", per_class=(20, 6), size=(16, 16), mode="L")
    invoke("train-teacher", "--dataset", pets, "--out", tmp_path / "teacher", "--epochs", "1", "--min-steps", "20")
    assert json.loads((tmp_path / "teacher" / "meta.json").read_text())["class_names"] == NAMES
    teacher_report = tmp_path / "teacher" / "report.json"
    assert json.loads(teacher_report.read_text())["dataset"]["class_names"] == NAMES
    assert "| classes | 0 cat, 1 dog, 2 emu |" in (tmp_path / "teacher" / "report.md").read_text()

    invoke("transcribe", "--teacher", tmp_path / "teacher", "--out", tmp_path / "run", "--iterations", "2",
           "--batch-size", "8", "--privacy", "none")
    assert json.loads((tmp_path / "run" / "student.json").read_text())["class_names"] == NAMES
    assert json.loads((tmp_path / "run" / "report.json").read_text())["class_names"] == NAMES
    assert "## Classes\n\nBy label: 0 cat, 1 dog, 2 emu." in (tmp_path / "run" / "report.md").read_text()
    samples = texts(drawn[-2])  # samples.png, titled with the student's classes; then training.png
    assert len(samples) == 8 and set(samples) <= set(NAMES)

    evaluated = json.loads(invoke("evaluate", "--model", tmp_path / "run", "--dataset", pets).stdout)
    assert evaluated["class_names"] == NAMES
    renamed = write_image_folder(tmp_path / "renamed", classes=("ant", "bee", "cow"), size=(16, 16), mode="L")
    warned = invoke("evaluate", "--model", tmp_path / "run", "--dataset", renamed)
    assert (f"warning: dataset '{renamed}' names its classes 0 ant, 1 bee, 2 cow, the model 0 cat, 1 dog, 2 emu: "
            f"accuracy compares them by label") in " ".join(warned.stderr.split())


@pytest.mark.slow
def test_a_private_student_names_its_classes_in_its_report_and_confusion_matrix(tmp_path: Path, drawn):
    pets = write_image_folder(tmp_path / "pets", per_class=(20, 6), size=(16, 16), mode="L")
    invoke("train-private", "--dataset", pets, "--dataset-size", "60", "--epsilon", "10", "--epochs", "1",
           "--out", tmp_path / "run")
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["class_names"] == report["data"]["class_names"] == NAMES
    assert json.loads((tmp_path / "run" / "student.json").read_text())["class_names"] == NAMES
    confusion = next(figure for figure in drawn if figure.axes and figure.axes[0].get_ylabel() == "true class")
    axis = confusion.axes[0]
    assert [label.get_text() for label in axis.get_xticklabels()] == NAMES
    assert [label.get_text() for label in axis.get_yticklabels()] == NAMES
