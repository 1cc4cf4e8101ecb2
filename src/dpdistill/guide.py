"""`dpdistill plan`: which route fits what a user has, with the accuracy and time it measured on Fashion-MNIST.

Each route prints, for the measured epsilon nearest the user's (1 or 10), the command of a benchmark row as that
row ran it: the same command and options, only the data set, the epsilon, --out and the input directories named by
a placeholder (PLACEHOLDERS) left to the user. Its figures come from `guide_figures.json` beside this module, which
`benchmarks/run.py` writes from its results for the rows whose recorded command is the one printed here (so every
figure printed here has that command in benchmarks/results.md); where none is, the route prints no figure. A route
that cannot work in the user's situation says so instead (one non-private model at a small sound epsilon: the
capacity bound)."""

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
PLACEHOLDERS = ("DIR", "ENSEMBLE", "ENCODER")  # input directories a printed command leaves to the user


@dataclass(frozen=True)
class Route:
    """One route: whom it serves (`have`), and at epsilon 1 and 10 its command (D: the data set, E: the epsilon,
    PLACEHOLDERS: the user's directories) and the benchmark row that ran that command (`{d}`: the data set); `limit`
    says why the route cannot help where that is known from a bound."""

    have: tuple[str, ...]
    name: str
    commands: dict[int, str]
    rows: dict[int, str]
    limit: str = ""


def _same(command: str) -> dict[int, str]:
    """One command at both measured epsilons."""
    return {1: command, 10: command}


PATE_COMMAND = ("dpdistill pate --teacher ENSEMBLE --student-init ENCODER --epsilon E --queries 500 --student-arch cnn "
                "--student-training consistency --batch-size 64 --self-training-rounds 0 --answer-targets posterior "
                "--out runs/pate")
FEDERATED_COMMAND = ("dpdistill federated --dataset D --clients 50 --method pate --epsilon E --members-per-owner 20 "
                     "--queries 500 --student-arch scatter-linear --set answer_targets=posterior --set min_steps=500 "
                     "--set teacher_init=scatter --set teacher_heads_only=true --set teacher_lr=0.01 "
                     "--set teacher_weight_decay=0.01 --set teacher_min_steps=300 --out runs/fed")
ROUTES = (
    Route(("data", "public", "owners"), "DP-SGD on scattering features (train-private)",
          _same("dpdistill train-private --dataset D --method dpsgd --epsilon E --student-arch scatter-linear "
                "--out runs/dpsgd"),
          {1: "dpsgd-scatter-linear-eps1-{d}", 10: "dpsgd-scatter-linear-eps10-{d}"}),
    Route(("data", "public"), "one release: a DP teacher transcribed for free into a student of any architecture, "
          "a generator and synthetic images (release)",
          _same("dpdistill release --dataset D --epsilon E --synthetic-size 10000 --out runs/release"),
          {1: "release-eps1-{d}", 10: "release-eps10-{d}"}),
    Route(("data", "public"), "private synthetic images and a classifier on them (synthesize --method dp-merf)",
          _same("dpdistill synthesize --method dp-merf --dataset D --epsilon E --out runs/synthetic"),
          {1: "dpmerf-eps1-{d}", 10: "dpmerf-eps10-{d}"}),
    Route(("public",), "PATE: a teacher ensemble labels public images (pretrain makes ENCODER, train-teacher "
          "--partitions ENSEMBLE: 1,000 heads at epsilon 1, 100 at 10; docs/methods/pate.md)", _same(PATE_COMMAND),
          {1: "pate-1000-heads-longer-fixmatch-posterior-eps1-q500-{d}",
           10: "pate-100-heads-longer-fixmatch-posterior-eps10-q500-{d}"}),
    Route(("owners",), "federated PATE over secure aggregation (federated; docs/methods/federated.md)",
          _same(FEDERATED_COMMAND), {1: "federated-pate-50-owners-eps1-{d}", 10: "federated-pate-50-owners-eps10-{d}"}),
    Route(("model",), "transcribe the model (transcribe)",
          _same("dpdistill transcribe --teacher DIR --privacy data --preset paper --epsilon E "
                "--set generator_width=64,32,16 --out runs/student"),
          {1: "dpsd-data-eps1-{d}", 10: "dpsd-data-eps10-{d}"},
          limit="one model trained without privacy can change completely when one private example changes: at a "
                "small sound epsilon all its noisy answers carry under a nat (the capacity bound, docs/privacy.md), "
                "so every single-teacher method sits at chance. With the data, train privately (--have data); a "
                "model that is itself a DP release transcribes for free (`transcribe --privacy none`)"),
)


def filled(command: str, dataset: str, epsilon: float) -> str:
    """A route's command for `dataset` at `epsilon`."""
    return command.replace(" --dataset D ", f" --dataset {dataset} ").replace(" --epsilon E ", f" --epsilon {epsilon:g} ")


def load_figures() -> dict[str, dict[str, Any]]:
    """The measured rows (accuracy %, its spread, seeds, wall seconds, the command they ran) by name; empty before
    any benchmark run."""
    return json.loads(FIGURES_FILE.read_text()) if FIGURES_FILE.is_file() else {}


def guide_rows() -> list[str]:
    """Every row the guide cites, on the data set the figures come from."""
    return [row.format(d=MEASURED_ON) for route in ROUTES for row in route.rows.values()]


def nearest_epsilon(epsilon: float) -> int:
    """The measured epsilon (1 or 10) closest to `epsilon` on a log scale."""
    return 1 if epsilon < 10 ** 0.5 else 10


def plan(dataset: str, epsilon: float, have: str) -> list[dict[str, Any]]:
    """The routes for a user who has `have`, each with its command at `epsilon` and the figures its row measured
    at the epsilon nearest it, where that row ran this very command (else none)."""
    figures, measured = load_figures(), nearest_epsilon(epsilon)
    rows = []
    for route in ROUTES:
        if have not in route.have:
            continue
        name, command = route.rows[measured].format(d=MEASURED_ON), route.commands[measured]
        figure = figures.get(name)
        if figure is not None and figure.get("command") != command:  # measured for another command
            figure = None
        rows.append({"route": route.name, "command": filled(command, dataset, epsilon), "row": name,
                     "epsilon": measured, "limit": route.limit,
                     "accuracy": None if figure is None else figure["accuracy"],
                     "spread": None if figure is None else figure["spread"],
                     "minutes": None if figure is None or figure["wall_seconds"] is None
                     else figure["wall_seconds"] / 60})
    return sorted(rows, key=lambda row: (bool(row["limit"]), -(row["accuracy"] or 0)))
