"""Transcribing a teacher ensemble: the mechanism aggregates its members, the accounting and report say so."""

from pathlib import Path

import pytest

from dpdistill.errors import ConfigError
from dpdistill.methods.config import build_config
from dpdistill.pipeline import transcribe


@pytest.mark.parametrize("mode", ["data", "label"])
def test_an_ensemble_run_spends_its_budget_once_and_reports_its_members(digits_ensemble: Path, tmp_path: Path,
                                                                        mode: str):
    config = build_config("demo", {"iterations": 10, "batch_size": 32}, {"mode": mode, "epsilon": 1.0})
    report = transcribe(digits_ensemble, config, tmp_path, "digits")
    privacy = report["privacy"]
    assert 0.99 < privacy["epsilon"] <= 1.0 and privacy["queries"] == 320 and privacy["teachers"] == 4
    assert report["config"]["privacy"]["teachers"] == 4
    assert ("aggregation" in privacy) == (mode == "label")
    assert "| teachers | 4 |" in (tmp_path / "report.md").read_text()


def test_the_teacher_as_discriminator_needs_a_single_teacher(digits_ensemble: Path, tmp_path: Path):
    config = build_config("demo", {"discriminator": "teacher"}, {"mode": "data", "epsilon": 1.0})
    with pytest.raises(ConfigError, match="single teacher"):
        transcribe(digits_ensemble, config, tmp_path, "digits")
