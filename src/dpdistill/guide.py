"""`dpdistill plan`: which route fits what a user has, with the accuracy and time it measured on Fashion-MNIST.

Each route names its benchmark rows; their figures come from `guide_figures.json` beside this module, which
`benchmarks/run.py` writes from its results (so every figure printed here has a command in benchmarks/results.md).
A route that cannot work in the user's situation says so instead of printing a figure (one non-private model at a
small sound epsilon: the capacity bound)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIGURES_FILE = Path(__file__).with_name("guide_figures.json")
HAVE = {"model": "a model trained without privacy (one teacher)",
        "data": "the private data itself",
        "public": "the private data and public unlabelled images",
        "owners": "several data owners, each with its own data"}
MEASURED_ON = "fmnist"  # where the rows were measured; other data sets get them as a guide


@dataclass(frozen=True)
class Route:
    """One route: whom it serves (`have`), its command, and its benchmark rows at epsilon 1 and 10 (`{d}`: the
    data set); `limit` says why the route cannot help where that is known from a bound."""

    have: tuple[str, ...]
    name: str
    command: str
    rows: dict[int, str]
    limit: str = ""


ROUTES = (
    Route(("data", "public", "owners"), "DP-SGD on scattering features (train-private)",
          "dpdistill train-private --dataset D --epsilon E --out runs/dpsgd",
          {1: "dpsgd-scatter-linear-eps1-{d}", 10: "dpsgd-scatter-linear-eps10-{d}"}),
    Route(("data", "public"), "one release: a DP teacher transcribed for free into a student of any architecture, "
          "a generator and synthetic images (release)",
          "dpdistill release --dataset D --epsilon E --student-arch cnn --out runs/release",
          {1: "release-eps1-{d}", 10: "release-eps10-{d}"}),
    Route(("data", "public"), "private synthetic images and a classifier on them (synthesize --method dp-merf)",
          "dpdistill synthesize --method dp-merf --dataset D --epsilon E --out runs/synthetic",
          {1: "dpmerf-eps1-{d}", 10: "dpmerf-eps10-{d}"}),
    Route(("public",), "PATE: a teacher ensemble labels public images (pretrain, train-teacher --partitions, pate; "
          "docs/methods/pate.md)", "dpdistill pate --teacher ENSEMBLE --epsilon E --queries 500 --out runs/pate",
          {1: "pate-1000-heads-longer-fixmatch-posterior-eps1-q500-{d}",
           10: "pate-100-heads-longer-fixmatch-posterior-eps10-q500-{d}"}),
    Route(("owners",), "federated PATE over secure aggregation (federated; docs/methods/federated.md)",
          "dpdistill federated --dataset D --clients M --epsilon E --out runs/fed",
          {1: "federated-pate-50-owners-eps1-{d}", 10: "federated-pate-50-owners-eps10-{d}"}),
    Route(("model",), "transcribe the model (transcribe)",
          "dpdistill transcribe --teacher DIR --epsilon E --out runs/student",
          {1: "dpsd-data-eps1-{d}", 10: "dpsd-data-eps10-{d}"},
          limit="one model trained without privacy can change completely when one private example changes: at a "
                "small sound epsilon all its noisy answers carry under a nat (the capacity bound, docs/privacy.md), "
                "so every single-teacher method sits at chance. With the data, train privately (--have data); a "
                "model that is itself a DP release transcribes for free (`transcribe --privacy none`)"),
)


def load_figures() -> dict[str, dict[str, Any]]:
    """The measured rows (accuracy %, its spread, seeds, wall seconds) by name; empty before any benchmark run."""
    return json.loads(FIGURES_FILE.read_text()) if FIGURES_FILE.is_file() else {}


def guide_rows() -> list[str]:
    """Every row the guide cites, on the data set the figures come from."""
    return [row.format(d=MEASURED_ON) for route in ROUTES for row in route.rows.values()]


def nearest_epsilon(epsilon: float) -> int:
    """The measured epsilon (1 or 10) closest to `epsilon` on a log scale."""
    return 1 if epsilon < 10 ** 0.5 else 10


def plan(dataset: str, epsilon: float, have: str) -> list[dict[str, Any]]:
    """The routes for a user who has `have`, each with its figure at the measured epsilon nearest `epsilon`."""
    figures, measured = load_figures(), nearest_epsilon(epsilon)
    rows = []
    for route in ROUTES:
        if have not in route.have:
            continue
        name = route.rows[measured].format(d=MEASURED_ON)
        figure = figures.get(name)
        rows.append({"route": route.name, "command": route.command.replace(" D ", f" {dataset} ")
                     .replace(" E ", f" {epsilon:g} "), "row": name, "epsilon": measured, "limit": route.limit,
                     "accuracy": None if figure is None else figure["accuracy"],
                     "spread": None if figure is None else figure["spread"],
                     "minutes": None if figure is None else figure["wall_seconds"] / 60})
    return sorted(rows, key=lambda row: (bool(row["limit"]), -(row["accuracy"] or 0)))
