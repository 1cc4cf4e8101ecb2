"""--sample-source on the command line: a bad source, or one that cannot share the budget or the pool, is one
clear error line, exit 2, and nothing written."""

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dpdistill.cli.main import app
from dpdistill.data import load_dataset
from helpers import write_sample_source

runner = CliRunner()


def _source(directory: Path, **privacy) -> Path:
    digits = load_dataset("digits")
    return write_sample_source(directory, digits.x_train[:100].numpy(), digits.y_train[:100].numpy(), **privacy)


def _missing_report(directory: Path) -> Path:
    (_source(directory) / "report.json").unlink()
    return directory


def _bad_shape(directory: Path) -> Path:
    return write_sample_source(directory, np.zeros((20, 1, 7, 7), np.float32), np.zeros(20, np.int64))


def _pickled(directory: Path) -> Path:
    _source(directory)
    np.savez(directory / "synthetic.npz", x=np.array([np.zeros((1, 8, 8))] * 3 + [None], dtype=object),
             y=np.zeros(4, np.int64))
    return directory


def _spent(directory: Path) -> Path:
    return _source(directory, noise_multiplier=0.5)  # epsilon about 10


CASES = [(_missing_report, (), "has no"), (_bad_shape, (), "the teacher takes float images (n, 1, 8, 8)"),
         (_pickled, (), "cannot be read without unpickling"), (_spent, (), "leaves nothing of --epsilon 2")]


def _one_error_nothing_written(result, out: Path, message: str) -> None:
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    assert message in " ".join(result.output.split()), result.output
    assert not out.exists()


@pytest.mark.parametrize("make, extra, message",
                         [*CASES, (_source, ("--public", "mnist"), "drop --public and --public-size"),
                          (_source, ("--public-size", "50"), "drop --public and --public-size")])
def test_pate_refuses_a_bad_sample_source(digits_ensemble: Path, tmp_path: Path, make, extra, message):
    source = make(tmp_path / "source")
    result = runner.invoke(app, ["pate", "--teacher", str(digits_ensemble), "--out", str(tmp_path / "out"),
                                 "--epsilon", "2", "--queries", "50", "--sample-source", str(source), *extra])
    _one_error_nothing_written(result, tmp_path / "out", message)


@pytest.mark.parametrize("make, extra, message",
                         [*CASES, (_source, ("--method", "srr", "--privacy", "label"),
                                   "srr cannot use generator pretraining")])
def test_transcribe_refuses_a_bad_sample_source(digits_teacher: Path, tmp_path: Path, make, extra, message):
    source = make(tmp_path / "source")
    result = runner.invoke(app, ["transcribe", "--teacher", str(digits_teacher), "--out", str(tmp_path / "out"),
                                 "--epsilon", "2", "--preset", "demo", "--sample-source", str(source), *extra])
    _one_error_nothing_written(result, tmp_path / "out", message)


def test_a_missing_sample_source_is_refused(digits_ensemble: Path, tmp_path: Path):
    result = runner.invoke(app, ["pate", "--teacher", str(digits_ensemble), "--out", str(tmp_path / "out"),
                                 "--epsilon", "2", "--sample-source", str(tmp_path / "absent")])
    _one_error_nothing_written(result, tmp_path / "out", "is not a directory")


def test_transcribe_with_a_sample_source_reports_the_composition(digits_teacher: Path, tmp_path: Path):
    source = _source(tmp_path / "source", noise_multiplier=4.0)
    result = runner.invoke(app, ["transcribe", "--teacher", str(digits_teacher), "--out", str(tmp_path / "out"),
                                 "--epsilon", "2", "--preset", "demo", "--iterations", "2", "--batch-size", "16",
                                 "--sample-source", str(source)])
    assert result.exit_code == 0, result.output
    privacy = json.loads((tmp_path / "out" / "report.json").read_text())["privacy"]
    assert privacy["route_epsilon"] < privacy["epsilon"] <= 2.0
    assert privacy["sample_source"]["path"] == str(source)
    assert "sample source (datalens" in (tmp_path / "out" / "report.md").read_text()
