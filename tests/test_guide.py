"""`dpdistill plan`: the routes for a user's situation with the figures of the benchmark rows they cite."""

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpdistill import guide
from dpdistill.cli.main import app, parsed_command
from dpdistill.guide import FIGURES_FILE, HAVE, MEASURED_ON, ROUTES, guide_rows, plan
from helpers import benchmark_harness

ROOT = Path(__file__).resolve().parents[1]


def test_every_cited_row_is_a_benchmark_row_with_its_published_figure():
    harness = benchmark_harness()
    names = {run.name for run in harness.table(("fmnist",), 1)}
    assert set(guide_rows()) <= names
    published = {row["run"]: row for row in json.loads((ROOT / "benchmarks" / "results.json").read_text())}
    figures = json.loads(FIGURES_FILE.read_text())
    assert all(figures[name]["accuracy"] == published[name]["accuracy_mean"] for name in figures)


@pytest.mark.parametrize("dataset, epsilon", [("fmnist", 1.0), ("fmnist", 10.0), ("mine.npz", 0.5), ("mnist", 4.0)])
@pytest.mark.parametrize("have", sorted(HAVE))
def test_every_printed_command_is_one_the_command_line_takes(dataset: str, epsilon: float, have: str):
    for route in plan(dataset, epsilon, have):
        name, options = parsed_command(route["command"])  # a usage error would raise
        assert route["command"].startswith(f"dpdistill {name} ") and options["epsilon"] == epsilon
        assert options.get("dataset") in (dataset, None)  # None: the teacher's (transcribe, pate)


def test_a_figure_is_shown_only_beside_the_command_its_row_ran():
    """Each figure's row recorded the very command printed (but for --out, --seed, --accept-noise and the user's
    directories); a row that ran another (the federation at epsilon 10 reused owners another row trained) gives no
    figure."""
    harness = benchmark_harness()
    published = {row["run"]: row for row in json.loads((ROOT / "benchmarks" / "results.json").read_text())}
    figures = json.loads(FIGURES_FILE.read_text())
    expected = {route.rows[epsilon].format(d=MEASURED_ON): route.commands[epsilon] for route in ROUTES
                for epsilon in route.rows if route.rows[epsilon].format(d=MEASURED_ON) in published
                and harness.ran_as_printed(route.commands[epsilon], epsilon,
                                           published[route.rows[epsilon].format(d=MEASURED_ON)])}
    assert {name: figure["command"] for name, figure in figures.items()} == expected
    assert "federated-pate-50-owners-eps10-fmnist" in published and "federated-pate-50-owners-eps10-fmnist" not in expected
    (federated,) = plan("fmnist", 10.0, "owners")[1:]
    assert federated["accuracy"] is None and federated["minutes"] is None
    (model,) = plan("fmnist", 1.0, "model")  # the generator its row measured: the printed one, not the default's
    assert "--set generator_width=64,32,16" in model["command"] and model["accuracy"] is not None


def test_a_route_whose_command_changed_since_its_figures_shows_none(monkeypatch):
    (dpsgd, *_) = ROUTES
    changed = dataclasses.replace(dpsgd, commands={1: dpsgd.commands[1].replace(" --out", " --epochs 80 --out"),
                                                   10: dpsgd.commands[10]})
    monkeypatch.setattr(guide, "ROUTES", (changed, *ROUTES[1:]))
    first = next(route for route in plan("fmnist", 1.0, "data") if route["row"].startswith("dpsgd-"))
    assert first["accuracy"] is None and "--epochs 80" in first["command"]
    assert next(route for route in plan("fmnist", 10.0, "data") if route["row"].startswith("dpsgd-"))["accuracy"]


def test_a_harness_row_that_ran_another_command_is_not_taken_for_the_printed_one():
    harness = benchmark_harness()
    row = {"dataset": "fmnist", "command": "dpdistill release --out runs/bench/r/seed0 --seed 0 --dataset fmnist "
                                           "--epsilon 10 --synthetic-size 10000 --teacher-set epochs=160"}
    (release,) = [route for route in ROUTES if route.rows[1].startswith("release-")]
    assert harness.ran_as_printed(release.commands[1].replace("--epsilon E", "--epsilon E --teacher-set epochs=160"),
                                  10, row)
    assert not harness.ran_as_printed(release.commands[1], 10, row)  # the teacher's settings differ
    assert not harness.ran_as_printed(release.commands[10], 10, row)


def test_the_routes_come_best_first_and_a_bound_says_when_one_cannot_help():
    routes = plan("fmnist", 1.0, "data")
    assert routes[0]["row"] == "dpsgd-scatter-linear-eps1-fmnist" and routes[0]["accuracy"] > 85
    assert "--epsilon 1 " in routes[0]["command"] and not routes[0]["limit"]
    assert [route["accuracy"] for route in routes] == sorted((route["accuracy"] for route in routes), reverse=True)
    (model,) = plan("mine.npz", 5.0, "model")
    assert model["epsilon"] == 10 and "capacity bound" in model["limit"]


def test_the_plan_command_prints_the_guide():
    result = CliRunner().invoke(app, ["plan", "--epsilon", "1", "--have", "owners"])
    assert result.exit_code == 0, result.output
    assert "several data owners" in result.stdout and "federated-pate-50-owners-eps1-fmnist" in result.stdout
    refused = CliRunner().invoke(app, ["plan", "--epsilon", "0"])
    assert refused.exit_code == 2 and refused.stderr.startswith("error: epsilon must be positive")
