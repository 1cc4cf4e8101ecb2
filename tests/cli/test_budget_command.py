"""`dpdistill budget` and `train-teacher --budget`: the ledger's standing on screen, totals set and refused."""

import json
import shutil
from pathlib import Path

import dp_accounting
from typer.testing import CliRunner

from dpdistill.cli.main import app
from dpdistill.privacy.ledger import LEDGER_FILE, LOCK_FILE, Release, ReleaseLedger

from helpers import exact_gaussian

runner = CliRunner()


def invoke(*args: str):
    result = runner.invoke(app, [str(a) for a in args])
    return result, " ".join(result.output.split())  # the output, unwrapped


def _teacher_with_one_release(digits_teacher: Path, tmp_path: Path) -> Path:
    teacher = Path(shutil.copytree(digits_teacher, tmp_path / "teacher",
                                   ignore=shutil.ignore_patterns(LEDGER_FILE, LOCK_FILE, ".lock")))
    query = exact_gaussian(320, 0.6, 1e-5)
    release = Release(dp_accounting.SelfComposedDpEvent(query.dp_event(), 320), 1e-5, query.epsilon(320, 1e-5))
    ReleaseLedger(teacher).reserve(tmp_path / "run", "dpsd", release)
    return teacher


def test_budget_shows_the_releases_and_sets_a_total(digits_teacher: Path, tmp_path: Path):
    teacher = _teacher_with_one_release(digits_teacher, tmp_path)
    result, output = invoke("budget", teacher)
    assert result.exit_code == 0, result.output
    assert "total: none (releases are recorded, never refused)" in output
    assert "spent: epsilon 0.6 at delta 1e-05" in output and "remaining" not in output
    assert "dpsd" in output and "reserved" in output and "0.6" in output
    result, output = invoke("budget", teacher, "--set", "2", "--delta", "1e-6")
    assert result.exit_code == 0, result.output
    assert "total: epsilon 2 at delta 1e-06" in output and "remaining: epsilon 1.3" in output
    assert json.loads((teacher / LEDGER_FILE).read_text())["total"] == {"epsilon": 2.0, "delta": 1e-6}


def test_budget_refuses_a_total_below_what_is_spent_in_one_line(digits_teacher: Path, tmp_path: Path):
    teacher = _teacher_with_one_release(digits_teacher, tmp_path)
    before = (teacher / LEDGER_FILE).read_text()
    result, output = invoke("budget", teacher, "--set", "0.5")
    assert result.exit_code == 2
    assert output.startswith("error:") and "already spent epsilon=0.6 at delta 1e-05: a total of 0.5 is below it" in output
    assert (teacher / LEDGER_FILE).read_text() == before


def test_budget_needs_a_teacher_and_a_readable_ledger(digits_teacher: Path, tmp_path: Path):
    result, output = invoke("budget", tmp_path)
    assert result.exit_code == 2 and "holds no teacher" in output
    teacher = _teacher_with_one_release(digits_teacher, tmp_path)
    (teacher / LEDGER_FILE).write_text("[]")
    result, output = invoke("budget", teacher)
    assert result.exit_code == 2 and "is damaged" in output


def test_train_teacher_sets_the_budget_and_refuses_a_bad_one_before_training(tmp_path: Path):
    result, output = invoke("train-teacher", "--dataset", "digits", "--out", tmp_path / "bad", "--epochs", "1",
                            "--min-steps", "0", "--budget", "0")
    assert result.exit_code == 2 and "epsilon must be positive" in output and not (tmp_path / "bad").exists()
    result, output = invoke("train-teacher", "--dataset", "digits", "--out", tmp_path / "teacher", "--epochs", "1",
                            "--min-steps", "0", "--budget", "3", "--budget-delta", "1e-6")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "teacher" / LEDGER_FILE).read_text()) == {
        "format": 1, "total": {"epsilon": 3.0, "delta": 1e-6}, "entries": []}
    result, output = invoke("transcribe", "--teacher", tmp_path / "teacher", "--out", tmp_path / "run",
                            "--epsilon", "4", "--preset", "demo", "--iterations", "2", "--batch-size", "8")
    assert result.exit_code == 2 and "past its privacy budget" in output and not (tmp_path / "run").exists()
    result, output = invoke("transcribe", "--teacher", tmp_path / "teacher", "--out", tmp_path / "run",
                            "--epsilon", "2", "--delta", "1e-6", "--preset", "demo", "--iterations", "2",
                            "--batch-size", "8")
    assert result.exit_code == 0, result.output
    assert "2 (of 3)" in output  # the summary's row for all the teacher's releases
    ledger = json.loads((tmp_path / "run" / "report.json").read_text())["privacy"]["ledger"]
    assert ledger["total_epsilon"] == 3 and ledger["delta"] == 1e-6
    assert 2 * (1 - 1e-4) <= ledger["spent_epsilon"] <= 2  # calibrated to 0.01% below the budget
    assert ledger["remaining"] == 3 - ledger["spent_epsilon"]
