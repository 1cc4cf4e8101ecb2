"""Progress bars count to where the run ends: no position passes the bar's total and the last one reaches it,
where the run decides the end (a teacher's epochs raised to reach --min-steps) and where a resumed run continues
with its saved settings rather than the options given. Redirected, progress is plain lines; quiet, nothing; a
refused run prints its error alone."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpdistill.cli.main import app
from dpdistill.methods.config import build_config
from dpdistill.pipeline import train_private, transcribe
from dpdistill.training.private import PrivateTrainingConfig

runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def _positions(output: str, description: str) -> list[tuple[int, int]]:
    """The (position, total) pairs the bar logs when the output is not a terminal."""
    return [(int(done), int(total)) for done, total in re.findall(rf"^{re.escape(description)} (\d+)/(\d+) ",
                                                                    output, re.MULTILINE)]


def _interrupt_at(position: str, value: int):
    def progress(record: dict) -> None:
        if record.get(position) == value:
            raise KeyboardInterrupt

    return progress


def test_a_teacher_bar_counts_the_epochs_min_steps_adds(tmp_path: Path):
    result = invoke("train-teacher", "--dataset", "digits", "--out", tmp_path, "--epochs", "1", "--batch-size", "64",
                    "--min-steps", "60")  # 23 steps an epoch: 3 epochs
    assert result.exit_code == 0, result.output
    assert _positions(result.output, "teacher on digits") == [(1, 3), (2, 3), (3, 3)]


@pytest.mark.slow
def test_a_resumed_private_training_bar_counts_its_saved_epochs(tmp_path: Path):
    config = PrivateTrainingConfig(dataset="digits", epsilon=10.0, sigma=1.0, epochs=2, batch_size=64, lr=3e-3)
    with pytest.raises(KeyboardInterrupt):
        train_private(config, tmp_path, progress=_interrupt_at("epoch", 1))
    result = invoke("train-private", "--dataset", "digits", "--out", tmp_path, "--resume")
    assert result.exit_code == 0, result.output
    assert _positions(result.output, "dpsgd on digits") == [(2, 2)]


@pytest.mark.slow
def test_a_resumed_transcription_bar_counts_its_saved_iterations(digits_teacher: Path, tmp_path: Path):
    config = build_config("demo", {"iterations": 4, "batch_size": 8, "eval_every": 2, "checkpoint_every": 2},
                          {"mode": "data", "epsilon": 5.0})
    with pytest.raises(KeyboardInterrupt):
        transcribe(digits_teacher, config, tmp_path, progress=_interrupt_at("iteration", 3))
    result = invoke("transcribe", "--teacher", digits_teacher, "--out", tmp_path, "--epsilon", "5", "--resume")
    assert result.exit_code == 0, result.output
    assert _positions(result.output, "dpsd data") == [(4, 4)]  # not the 200 iterations of the options


def test_a_redirected_run_logs_readable_lines_without_control_characters(tmp_path: Path):
    """`dpdistill train-private ... > log 2>&1`, as a scheduler runs it."""
    log = tmp_path / "log"
    with log.open("w") as written:
        finished = subprocess.run([sys.executable, "-m", "dpdistill.cli.main", "train-private", "--dataset", "digits",
                                   "--epsilon", "10", "--sigma", "1", "--epochs", "2", "--out", tmp_path / "run"],
                                  stdout=written, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "300"})
    text = log.read_text()
    assert finished.returncode == 0, text
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", text)  # no escape sequence, no carriage return
    lines = text.splitlines()
    assert lines[0].startswith("dpsgd on digits: started, elapsed")
    assert _positions(text, "dpsgd on digits") == [(1, 2), (2, 2)]
    assert re.search(r"^dpsgd on digits 2/2 [\d.e+-]+/s, ETA 0s, elapsed \d+s, .*test_accuracy=", text, re.MULTILINE)
    assert any(line.startswith("dpsgd on digits: done in ") for line in lines) and "student accuracy" in text


def test_quiet_prints_nothing_and_writes_the_reports(tmp_path: Path):
    result = invoke("train-teacher", "--dataset", "digits", "--out", tmp_path, "--epochs", "1", "--min-steps", "0",
                    "--quiet")
    assert result.exit_code == 0 and result.output == ""
    assert (tmp_path / "report.md").exists() and (tmp_path / "model.safetensors").exists()
    refused = invoke("train-teacher", "--dataset", "digits", "--out", tmp_path, "-q")
    assert refused.exit_code == 2 and refused.stderr.startswith("error:")  # quiet keeps the errors


def test_a_refused_run_prints_its_error_alone(tmp_path: Path):
    (tmp_path / "mine.txt").write_text("kept")
    result = invoke("train-private", "--dataset", "digits", "--epsilon", "1", "--out", tmp_path)
    assert result.exit_code == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and "is not empty" in result.stderr


def test_a_python_warning_during_a_command_is_one_warning_line(monkeypatch, tmp_path: Path):
    import warnings

    from dpdistill import jobs

    def evaluate_with_a_warning(*args: object) -> dict:
        warnings.warn("a library's caution\nover two lines", UserWarning)
        return {"accuracy": 0.5, "measured_on": "test", "warnings": []}

    monkeypatch.setattr(jobs, "evaluate", evaluate_with_a_warning)
    result = invoke("evaluate", "--model", tmp_path, "--dataset", "digits")
    assert result.exit_code == 0 and result.stderr == "warning: a library's caution over two lines\n"
