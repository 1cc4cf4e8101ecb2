"""Every DP-SGD row of the benchmark table under both neighbouring relations.

    .venv/bin/python benchmarks/relation.py [RESULTS_JSON]

DP-SGD states its budget under add/remove (Opacus' convention); the ensembles, PATE and the transcriptions are
replace-one, and their epsilon is the same under add/remove (one example changes one teacher or member either
way). This script replans each `train-private --method dpsgd` row of `benchmarks/results.json` from its own
command (same data-set size, batch size, epochs and budget, so the same noise multiplier, sampling rate and steps)
and prints its epsilon under add/remove (what the row's budget fixed) and under replace-one (dp-accounting PLD,
delta 1e-5) as a Markdown table. It also writes them to `relation.json` beside RESULTS_JSON, from which
`benchmarks/run.py` renders the accounting table of BENCHMARKS.md. About a minute on 2 cores.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from pathlib import Path

from dpdistill.data import load_dataset
from dpdistill.privacy.accounting import REPLACE_ONE, dpsgd_epsilon
from dpdistill.training.private import PrivateTrainingConfig, plan_private_training

FIELDS = {field.name: field for field in dataclasses.fields(PrivateTrainingConfig)}


def config_of(command: str) -> PrivateTrainingConfig:
    """The PrivateTrainingConfig a `dpdistill train-private ...` command line ran with (its settings only)."""
    words = shlex.split(command)
    options = dict(zip(words[2::2], words[3::2]))
    values = {name: _number_or_text(text) for flag, text in options.items()
              if (name := flag.removeprefix("--").replace("-", "_")) in FIELDS}
    values["epsilon"] = float(values["epsilon"])
    return PrivateTrainingConfig(**values)


def _number_or_text(text: str) -> int | float | str:
    """An option's value as the command line meant it: many settings default to None (the student's default), so
    their type cannot come from the default."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def main(results: Path) -> None:
    rows = [row for row in json.loads(results.read_text())
            if row["command"] and " train-private " in f" {row['command']} " and "--method dpsgd" in row["command"]]
    sizes: dict[str, int] = {}
    table: dict[str, dict] = {}
    print("| row | add/remove epsilon (the budget) | replace-one epsilon | noise multiplier | sampling rate | steps |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        config = config_of(row["command"])
        if config.dataset not in sizes:
            sizes[config.dataset] = len(load_dataset(config.dataset).y_train)
        plan = plan_private_training(config, sizes[config.dataset])
        query = plan.query
        replace_one = dpsgd_epsilon(query.noise_multiplier, query.sample_rate, plan.steps, config.delta,
                                    relation=REPLACE_ONE)
        print(f"| `{row['run']}` | {row['epsilon']:.4g} | {replace_one:.4g} | {query.noise_multiplier:.4g} | "
              f"{query.sample_rate:.4g} | {plan.steps} |", flush=True)
        table[row["run"]] = {"add_remove": row["epsilon"], "replace_one": replace_one,
                             "noise_multiplier": query.noise_multiplier, "sample_rate": query.sample_rate,
                             "steps": plan.steps}
    (results.parent / "relation.json").write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "results.json")
