"""`dpdistill demo` at its small scale (the embedded digits): the five rows of its table, the DP-SGD student
covered and ahead of the single-teacher DPSD one, the release's and PATE's covered students at the same epsilon,
and a second demo into the same --out that starts afresh."""

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpdistill.cli.main import app
from dpdistill.demo import RUNS, SUMMARY, _start_afresh
from dpdistill.errors import ConfigError


@pytest.mark.slow
def test_the_demo_shows_the_covered_route_ahead_of_dpsd(tmp_path: Path, fresh_features):
    result = CliRunner().invoke(app, ["demo", "--dataset", "digits", "--out", str(tmp_path / "demo")])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "demo" / SUMMARY).read_text())["rows"]
    assert [row["route"] for row in rows][:3] == ["DP-SGD, scatter-linear", "DPSD, data mode", "teacher, NOT private"]
    dpsgd, dpsd, teacher, released, voted = rows
    assert released["route"] == "release, cnn" and released["covered"] and released["epsilon"] <= 3.0
    # at this scale (4 iterations on 8 x 8 digits) the release's student is near chance (0.14 to 0.20 in the runs
    # read), so its learning is measured by the Fashion-MNIST demo (77.6% and 76.0%), not asserted here
    assert released["paper_epsilon"] is None and 0.0 <= released["accuracy"] <= 1.0
    assert voted["route"] == "PATE, 10 heads" and voted["covered"] and voted["epsilon"] <= 3.0
    # at this scale (10 heads of 144 digits each, 100 noisy answers) PATE's student is barely above chance: nine
    # runs gave 0.11 to 0.33 (mean 0.22), so its learning is measured by the Fashion-MNIST demo, not asserted here
    assert 0.0 <= voted["accuracy"] <= 1.0
    assert dpsgd["covered"] and dpsgd["epsilon"] <= 3.0 and dpsgd["paper_epsilon"] is None
    assert dpsd["covered"] and dpsd["epsilon"] <= 3.0 and dpsd["paper_epsilon"] < dpsd["epsilon"]
    assert dpsgd["accuracy"] > dpsd["accuracy"] + 0.3  # measured 0.94 against chance
    assert not teacher["covered"] and teacher["epsilon"] == "inf"
    printed = " ".join(result.output.split())  # as wrapped to the terminal's width
    for row in rows:
        assert (tmp_path / "demo" / row["report"]).exists() and row["report"] in printed
    assert "Use DP-SGD on scattering features" in printed and "because of the capacity bound" in printed
    assert "an ensemble's noisy votes teach a student too" in printed
    assert "`dpdistill release` trains a DP teacher and transcribes it for free" in printed
    # every row but DPSD's shows where it stands through the command line's display, the feature pass included
    assert re.search(r"features \d+/1437 .*cached=", printed) and "DP-SGD: done in" in printed
    assert "teacher: done in" in printed and "release: done in" in printed
    assert "10 heads: started" in printed and "10 heads: done in" in printed
    assert "PATE: started" in printed and "PATE: done in" in printed


def test_a_second_demo_removes_what_the_first_wrote_and_nothing_else(tmp_path: Path):
    _start_afresh(tmp_path)
    for name in RUNS:
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text("{}")
    (tmp_path / "mine").mkdir()
    _start_afresh(tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == [SUMMARY, "mine"]


def test_the_demo_refuses_to_write_over_folders_it_did_not_write(tmp_path: Path):
    (tmp_path / "teacher").mkdir()
    with pytest.raises(ConfigError, match="no earlier demo wrote it"):
        _start_afresh(tmp_path)
    assert (tmp_path / "teacher").exists() and not (tmp_path / SUMMARY).exists()

