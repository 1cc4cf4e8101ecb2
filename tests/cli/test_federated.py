"""`dpdistill federated`: mistakes are one line, exit 2, before any owner trains, and nothing is written."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpdistill.cli.main import app

runner = CliRunner()
BASE = ("federated", "--dataset", "digits", "--clients", "5")


@pytest.mark.parametrize("extra, message", [
    ((), "--epsilon is required"),
    (("--epsilon", "1", "--engine", "cloud"), "unknown engine"),
    (("--epsilon", "1", "--method", "srr"), "unknown federated method"),
    (("--epsilon", "1", "--dropouts", "3"), "tolerate 0 to 2 dropouts"),
    (("--epsilon", "1", "--dirichlet-alpha", "0"), "Dirichlet concentration must be positive"),
    (("--epsilon", "1", "--set", "round_queries=0"), "round-queries must be at least 1"),
    (("--epsilon", "1", "--set", "teacher_init=scatter"), "--heads-only"),
    (("--epsilon", "1", "--set", "colour=red"), "cannot set"),
    (("--epsilon", "1", "--queries", "6000"), "at least as many public images"),
])
def test_mistakes_are_one_line_and_nothing_is_written(tmp_path: Path, extra, message):
    out = tmp_path / "run"
    result = runner.invoke(app, [*BASE, *extra, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not out.exists() and not (tmp_path / "run-owners").exists()


@pytest.mark.parametrize("args, message", [
    (("federated", "serve", *BASE[1:], "--epsilon", "1"), "give --certificates DIR"),
    (("federated", "serve", *BASE[1:], "--epsilon", "1", "--certificates", "."),
     "lacks ca.crt, server.pem, server.key"),
    (("federated", "serve", *BASE[1:], "--epsilon", "1", "--address", "nowhere", "--certificates", "."),
     "'nowhere' is not HOST:PORT"),
    (("federated", *BASE[1:], "--epsilon", "1", "--secagg-graph", "star"), "unknown secure-aggregation graph"),
    (("federated", "finish"), "holds no served federated run to finish"),
])
def test_the_parties_mistakes_are_one_line_before_any_work(tmp_path: Path, args, message):
    out = tmp_path / "run"
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, result.output
    assert not out.exists()


def test_an_owner_without_a_teacher_or_certificate_is_refused(tmp_path: Path):
    result = runner.invoke(app, ["federated", "owner", "--teacher", str(tmp_path), "--superlink", "127.0.0.1:9092",
                                 "--root-certificates", str(tmp_path / "ca.crt")])
    assert result.exit_code == 2 and "is not a teacher ensemble" in result.output


def test_an_owner_with_an_impossible_delta_is_refused(tmp_path: Path):
    result = runner.invoke(app, ["federated", "owner", "--teacher", str(tmp_path), "--superlink", "127.0.0.1:9092",
                                 "--root-certificates", str(tmp_path / "ca.crt"), "--delta", "2"])
    assert result.exit_code == 2 and "delta must be in (0, 1)" in result.output


def test_a_busy_out_directory_is_refused_before_the_owners_train(tmp_path: Path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "something").write_text("kept")
    result = runner.invoke(app, [*BASE, "--epsilon", "1", "--out", str(out)])
    assert result.exit_code == 2 and "is not empty" in result.output
    assert (out / "something").read_text() == "kept" and not (tmp_path / "run-owners").exists()


def test_owners_prepared_otherwise_are_refused(tmp_path: Path):
    owners = tmp_path / "owners"
    owners.mkdir()
    (owners / "owners.json").write_text('{"dataset": "digits", "owners": 3}')
    result = runner.invoke(app, [*BASE, "--epsilon", "1", "--owners", str(owners), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "prepared with other settings" in result.output
