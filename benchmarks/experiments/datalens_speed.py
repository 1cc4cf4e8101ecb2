"""DataLens on one CPU thread: seconds per teacher step, per query and per generator step (its teacher steps and
its query) of a preset on Fashion-MNIST at N teachers, scaled linearly to the preset's own N (the paper's 4,000
conditional DCGAN teachers hold about 36 GB of weights and Adam moments: more than a small machine has), and the
generator steps the sound budget affords at epsilon 1 and 10.

    .venv/bin/python benchmarks/experiments/datalens_speed.py PRESET [N ...]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from dpdistill.data import load_dataset
from dpdistill.methods.datalens import build_datalens_config
from dpdistill.training.datalens import DataLensTrainer, plan_datalens


def seconds(step: Callable[[], object], repeats: int = 2) -> float:
    step()  # warm-up
    started = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - started) / repeats


def main(preset: str, teachers: list[int]) -> None:
    torch.set_num_threads(1)
    dataset = load_dataset("fmnist")
    for epsilon in (1.0, 10.0):
        plan = plan_datalens(build_datalens_config(preset, {"dataset": "fmnist", "epsilon": epsilon}))
        print(f"{preset} preset, epsilon {epsilon:g}: sigma {plan.sigma:g}, {plan.steps} generator steps "
              f"({plan.queries} samples), sound epsilon {plan.epsilon(1e-5):.4f}")
    own = build_datalens_config(preset, {"dataset": "fmnist", "epsilon": 10.0})
    print(f"| N | teacher step (s) | query (s) | generator step (s) | at N = {own.teachers}: a step (s), "
          f"{plan.steps} steps (h) |\n| --- | --- | --- | --- | --- |")
    for count in teachers or [own.teachers]:
        config = build_datalens_config(preset, {"dataset": "fmnist", "epsilon": 10.0, "teachers": count})
        with tempfile.TemporaryDirectory() as state:
            trainer = DataLensTrainer(config, dataset, plan_datalens(config), Path(state))
            teacher, query = seconds(trainer._teacher_step), seconds(trainer._generator_step)
        step = config.discriminator_steps * teacher + query
        scaled = step * own.teachers / count
        print(f"| {count} | {teacher:.2f} | {query:.2f} | {step:.2f} | {scaled:.1f}, {scaled * plan.steps / 3600:.2f} |",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "paper", [int(arg) for arg in sys.argv[2:]])
