"""Transcribing a teacher ensemble: the mechanism aggregates its members, the accounting and report say so."""

import json
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


def test_querying_every_nth_iteration_spends_the_budget_on_fewer_less_noisy_answers(digits_ensemble: Path,
                                                                                     tmp_path: Path, monkeypatch):
    from dpdistill.methods.engine import TranscriptionEngine

    asked = []
    original = TranscriptionEngine._teacher_answers
    monkeypatch.setattr(TranscriptionEngine, "_teacher_answers",
                        lambda self, images: asked.append(self.iteration) or original(self, images))
    sparse = build_config("demo", {"iterations": 10, "batch_size": 32, "query_every": 4, "replay_size": 256},
                          {"mode": "label", "epsilon": 1.0})
    report = transcribe(digits_ensemble, sparse, tmp_path / "sparse", "digits")
    assert asked == [0, 4, 8]
    assert report["privacy"]["queries"] == 96 and 0.99 < report["privacy"]["epsilon"] <= 1.0
    dense = build_config("demo", {"iterations": 10, "batch_size": 32}, {"mode": "label", "epsilon": 1.0})
    dense_sigma = transcribe(digits_ensemble, dense, tmp_path / "dense", "digits")["privacy"]["sigma"]
    assert report["privacy"]["sigma"] < dense_sigma / 1.5  # 96 answers instead of 320 at the same budget


def test_querying_every_nth_iteration_needs_a_replay_buffer_and_a_vote_margin_needs_votes():
    with pytest.raises(ConfigError, match="replay buffer"):
        build_config("demo", {"query_every": 4}, {"mode": "label", "epsilon": 1.0}).validate(10)
    with pytest.raises(ConfigError, match="ensemble's noisy votes"):
        build_config("demo", {"vote_margin": 1.0}, {"mode": "label", "epsilon": 1.0}).validate(10)


def test_an_ensemble_is_evaluated_once_when_trained_not_at_every_transcription(digits_ensemble: Path,
                                                                              tmp_path: Path, monkeypatch):
    measured = json.loads((digits_ensemble / "ensemble.json").read_text())["test_accuracy"]
    assert measured == json.loads((digits_ensemble / "report.json").read_text())["accuracy"]["teacher"] > 0.5
    monkeypatch.setattr("dpdistill.methods.teachers.accuracy", lambda *args, **kwargs: pytest.fail("evaluated again"))
    config = build_config("demo", {"iterations": 2, "batch_size": 16}, {"mode": "data", "epsilon": 1.0})
    transcribe(digits_ensemble, config, tmp_path, "digits")
    assert json.loads((tmp_path / "private" / "record.json").read_text())["accuracy"]["teacher"] == measured
