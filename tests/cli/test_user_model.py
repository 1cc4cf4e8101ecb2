"""`dpdistill train-private --student-arch FILE.py:CALLABLE`: a user's model written in two files, with BatchNorm and
in-place ReLUs, trains under DP-SGD with each change said in one note, and its student loads in a fresh process
once the folder it came from is gone; on the default schedule, measured for the registered students only, it is
refused before anything is written."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from dpdistill.cli.main import app
from dpdistill.data import load_dataset
from dpdistill.privacy.individuals import DatasetLedger
from helpers import dpdistill_elsewhere, write_two_file_model

runner = CliRunner()


@pytest.mark.slow
def test_a_two_file_user_model_trains_under_dpsgd_and_its_student_loads_in_a_fresh_process(tmp_path):
    spec, run = write_two_file_model(tmp_path / "mycode"), tmp_path / "run"
    result = runner.invoke(app, ["train-private", "--dataset", "digits", "--student-arch", spec, "--epsilon", "10",
                                 "--epochs", "1", "--batch-size", "64", "--lr", "3e-3", "--out", str(run)])
    assert result.exit_code == 0, result.output
    notes = [line.removeprefix("note: ") for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 2 and "BatchNorm2d -> GroupNorm" in notes[0] and "ReLU(inplace=False)" in notes[1]
    report = json.loads((run / "report.json").read_text())
    assert report["notes"][:2] == notes
    assert json.loads((run / "student.json").read_text())["opacus_fixed"] is True

    shutil.rmtree(tmp_path / "mycode")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    evaluated = dpdistill_elsewhere(elsewhere, "evaluate", "--model", run, "--dataset", "digits")
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["accuracy"] == pytest.approx(report["accuracy"]["student"], abs=0)


def test_a_user_model_on_the_default_schedule_is_refused_in_one_line_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("DPDISTILL_LEDGER_HOME", str(tmp_path / "ledgers"))
    spec, run = write_two_file_model(tmp_path / "mycode"), tmp_path / "run"
    result = runner.invoke(app, ["train-private", "--dataset", "digits", "--student-arch", spec, "--epsilon", "1",
                                 "--out", str(run)])
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: no DP-SGD schedule is measured for") and line.endswith("the defaults anyway")
    assert not run.exists() and DatasetLedger(load_dataset("digits").digest).read().entries == ()
