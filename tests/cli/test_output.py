"""The summary a run prints: every row says what is true of that run, and a figure that cannot be known is left out."""

from pathlib import Path

import pytest

from dpdistill.cli import output
from dpdistill.cli.output import print_summary

DPMERF = {"method": "dp-merf", "dataset": "digits", "accuracy": {"student": 0.39},
          "timing": {"wall_seconds": 169.0, "release_seconds": 0.97, "fit_seconds": 142.8, "student_seconds": 25.2},
          "privacy": {"mode": "data", "epsilon": 0.9999, "delta": 1e-5, "relation": "replace-one",
                      "epsilon_replace_one": 0.9999, "covered": "the synthetic set and the student"}}
RELEASE = {"method": "release", "dataset": "digits", "privacy_mode": "none",
           "accuracy": {"student": 0.41, "synthetic": 0.13, "teacher": 0.92},
           "synthetic": {"classifier": "datalens"},
           "timing": {"wall_seconds": 68.9, "synthetic_seconds": 8.9, "with_teacher_seconds": 80.2},
           "privacy": {"mode": "none", "epsilon": 0.9994, "delta": 1e-5, "relation": "add-remove",
                       "epsilon_replace_one": 2.12, "epsilon_scope": "the teacher's own DP release",
                       "queries": 38400, "covered": "the student",
                       "teacher_release": {"release": "dpsgd", "epsilon": 0.9994, "delta": 1e-5,
                                           "relation": "add-remove", "epsilon_replace_one": 2.12, "verified": True,
                                           "covers": "the student"},
                       "ledger": {"path": "/r/teacher/ledger.json", "total_epsilon": None, "delta": 1e-5,
                                  "spent_epsilon": 0.0, "remaining": None}}}


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    """One row a line: a label is then read whole."""
    monkeypatch.setattr(output.summary, "width", 300)


def _printed(capsys, report: dict) -> str:
    print_summary(report, Path("/r"))
    return " ".join(capsys.readouterr().err.replace("│", " ").split())


def test_a_synthesiser_has_no_teacher_and_its_relation_is_not_repeated(capsys):
    printed = _printed(capsys, DPMERF)
    assert "teacher" not in printed  # its release_seconds is the time of its class sums, not a teacher's training
    assert "wall time 169.0 s" in printed and "replace one example" not in printed  # replace-one is its relation


def test_a_release_says_what_its_ledger_and_its_times_hold(capsys):
    printed = _printed(capsys, RELEASE)
    assert "release / a DP teacher, read without noise / digits" in printed and "none privacy" not in printed
    assert "a datalens classifier trained on the synthetic set alone" in printed
    assert "epsilon recorded in the teacher's ledger 0 (no total set)" in printed
    assert "all the teacher's releases" not in printed
    assert "wall time of the whole release 80.2 s" in printed
    assert "wall time of the transcription's loop 68.9 s" in printed


def test_a_resumed_release_gives_no_whole_time_it_cannot_know(capsys):
    timing = {key: value for key, value in RELEASE["timing"].items() if key != "with_teacher_seconds"}
    printed = _printed(capsys, {**RELEASE, "timing": timing, "resumed": True})
    assert "whole release" not in printed and "0.0 s" not in printed
    assert "wall time of the transcription's loop (resumed run: this part) 68.9 s" in printed
