"""A command whose answers would be near random says so in one line before it spends or writes anything, and runs
anyway with --accept-noise."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpdistill.cli.main import app

pytestmark = pytest.mark.preflight
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(arg) for arg in args])


def test_pate_with_four_voters_at_a_small_epsilon_is_refused_then_accepted(digits_ensemble: Path, tmp_path: Path):
    out = tmp_path / "pate"
    refused = invoke("pate", "--teacher", digits_ensemble, "--out", out, "--epsilon", "1", "--queries", "100",
                     "--public-size", "150")
    assert refused.exit_code == 2
    assert refused.stderr.startswith("error: the ensemble's answers would be near random: noise of ")
    assert "against 4 voters" in refused.stderr and "--accept-noise" in refused.stderr
    assert len(refused.stderr.splitlines()) == 1 and not out.exists()  # nothing written, nothing spent
    assert not (digits_ensemble / "ledger.json").exists() or json.loads(
        (digits_ensemble / "ledger.json").read_text()).get("releases", []) == []
    accepted = invoke("pate", "--teacher", digits_ensemble, "--out", out, "--epsilon", "1", "--queries", "100",
                      "--public-size", "150", "--min-steps", "20", "--epochs", "1", "--self-training-rounds", "0",
                      "--accept-noise")
    assert accepted.exit_code == 0, accepted.output
    assert json.loads((out / "config.json").read_text())["pate"]["accept_noise"] is True


def test_a_single_teacher_at_a_sound_epsilon_is_refused_by_the_capacity_bound(digits_teacher: Path, tmp_path: Path):
    refused = invoke("transcribe", "--teacher", digits_teacher, "--out", tmp_path / "dpsd", "--epsilon", "10",
                     "--preset", "demo")
    assert refused.exit_code == 2 and refused.stderr.startswith("error: the answers cannot teach the classes: ")
    assert "fewer than the 21.8 it takes to tell 10 classes apart" in refused.stderr
    assert not (tmp_path / "dpsd").exists()


def test_a_federation_is_refused_before_its_owners_train(tmp_path: Path):
    refused = invoke("federated", "--dataset", "digits", "--clients", "3", "--out", tmp_path / "fed", "--epsilon",
                     "0.1", "--members-per-owner", "2")
    assert refused.exit_code == 2 and "the owners' ensemble's answers would be near random" in refused.stderr
    assert not (tmp_path / "fed").exists() and not (tmp_path / "fed-owners").exists()
