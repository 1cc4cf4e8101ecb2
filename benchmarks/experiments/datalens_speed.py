"""DataLens on 2 cores: seconds per teacher step and per generator (query) step as the number of teachers N grows,
at the paper preset's shapes (batch 15, 15 real images per teacher, top-k 350, 32 hidden units), and how many
generator steps the sound budget affords at the paper preset's sigma.

    .venv/bin/python benchmarks/experiments/datalens_speed.py [N ...]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from dpdistill.data import load_dataset
from dpdistill.methods.datalens import build_datalens_config
from dpdistill.training.datalens import DataLensTrainer, plan_datalens


def seconds(step, repeats: int = 3) -> float:
    step()  # warm-up
    started = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - started) / repeats


def main(teachers: list[int]) -> None:
    dataset = load_dataset("fmnist")
    for epsilon in (1.0, 10.0):
        plan = plan_datalens(build_datalens_config("paper", {"dataset": "fmnist", "epsilon": epsilon}))
        print(f"paper preset, epsilon {epsilon:g}: sigma {plan.sigma:g}, {plan.steps} generator steps "
              f"({plan.queries} samples), sound epsilon {plan.epsilon(1e-5):.4f}")
    print("| N | teacher step (s) | generator step (s) |\n| --- | --- | --- |")
    for count in teachers:
        config = build_datalens_config("paper", {"dataset": "fmnist", "epsilon": 10.0, "teachers": count})
        with tempfile.TemporaryDirectory() as state:
            trainer = DataLensTrainer(config, dataset, plan_datalens(config), Path(state))
            print(f"| {count} | {seconds(trainer._teacher_step):.2f} | {seconds(trainer._generator_step):.2f} |",
                  flush=True)


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]] or [250, 1000, 4000])
