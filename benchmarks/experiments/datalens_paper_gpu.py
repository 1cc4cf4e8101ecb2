"""DataLens at the paper preset (4,000 conditional DCGAN teachers) on Fashion-MNIST at epsilon 1 and 10, on a GPU,
within a wall-clock budget: each epsilon runs the steps that fit its share of the budget (all the budget affords,
149 / 190, if they fit), then its synthetic set trains the evaluation classifier. A run stopped early has released
fewer samples than planned: its epsilon is that of the steps it took, and its row says `partial`.

    .venv/bin/python benchmarks/experiments/datalens_paper_gpu.py --out OUT [--budget-seconds 480] [--device cuda] [--seed 0]

Every generator step prints its seconds, so a cut run still gives the cost a step. One JSON file an epsilon
(`datalens-paper-eps{E}-fmnist-seed{S}.json`) and `rows.json` go to --out.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from dpdistill.data import load_dataset
from dpdistill.data.base import ImageDataset
from dpdistill.methods.datalens import OFFICIAL_PROTOCOL, STUDENT_ARCH, build_datalens_config, synthesize
from dpdistill.methods.synthetic import StudentSettings, evaluate_synthetic
from dpdistill.training.datalens import DataLensPlan, DataLensTrainer, plan_datalens

PAPER = {1.0: 64.78, 10.0: 70.61}  # DataLens Table 1, Fashion-MNIST, classifier on the synthetic set
EVALUATION_RESERVE = 0.25  # share of an epsilon's budget kept for the synthetic set and its classifier


class OutOfTime(Exception):
    """The budget for generator steps is spent: the run stops before its next step."""


def run_epsilon(dataset: ImageDataset, epsilon: float, device: str, seconds: float, synthetic_size: int,
                student_epochs: int, seed: int) -> dict[str, Any]:
    started = time.perf_counter()
    config = build_datalens_config("paper", {"dataset": "fmnist", "epsilon": epsilon, "device": device,
                                             "synthetic_size": synthetic_size, "student_epochs": student_epochs,
                                             "seed": seed})
    plan = plan_datalens(config)
    step_seconds: list[float] = []
    deadline = started + seconds * (1 - EVALUATION_RESERVE)

    def progress(record: dict[str, Any]) -> None:
        step_seconds.append(record["seconds"])
        print(f"eps {epsilon:g} step {record['step']}/{plan.steps} {record['seconds']:.3f} s "
              f"kept {record['kept_share']:.3f} elapsed {time.perf_counter() - started:.1f} s", flush=True)
        if time.perf_counter() + max(step_seconds[-3:]) > deadline:
            raise OutOfTime

    with tempfile.TemporaryDirectory() as state:
        trainer = DataLensTrainer(config, dataset, plan, Path(state), progress)
        set_up = time.perf_counter() - started
        print(f"eps {epsilon:g}: {plan.steps} steps planned (sigma {plan.sigma:g}), set up in {set_up:.1f} s", flush=True)
        try:
            trainer.run()
        except OutOfTime:
            pass
    done = len(step_seconds)
    generator_seconds = time.perf_counter() - started
    images, labels = synthesize(trainer.generator, config.synthetic_size, config.seed, config.batch_size)
    _, evaluation, student_seconds = evaluate_synthetic(dataset, images, labels, "DataLens", StudentSettings(
        STUDENT_ARCH, config.student_epochs, config.student_lr, config.student_batch, config.seed, device))
    spent = DataLensPlan(plan.query, plan.sigma, max(done, 1), plan.batch_size).epsilon(config.delta)
    return {"row": f"datalens-paper-eps{epsilon:g}-fmnist", "seed": seed, "partial": done < plan.steps,
            "device": torch.cuda.get_device_name() if device.startswith("cuda") else device,
            "epsilon_target": epsilon, "epsilon_spent": spent, "delta": config.delta, "sigma": plan.sigma,
            "teachers": config.teachers, "steps_planned": plan.steps, "steps_done": done,
            "accuracy_final": evaluation["accuracy"]["student"],
            "accuracy_official_protocol_max_over_epochs_optimistic": max(
                record["test_accuracy"] for record in evaluation["student_history"]),
            "paper": PAPER.get(epsilon), "seconds_per_step": sum(step_seconds[1:]) / max(done - 1, 1),
            "first_step_seconds": step_seconds[0] if step_seconds else None,
            "set_up_seconds": set_up, "generator_seconds": generator_seconds, "student_seconds": student_seconds,
            "wall_seconds": time.perf_counter() - started, "synthetic_size": synthetic_size,
            "student_epochs": student_epochs, "official_protocol_key": OFFICIAL_PROTOCOL}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-seconds", type=float, default=480.0, help="wall clock for both epsilons")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[10.0, 1.0])
    parser.add_argument("--synthetic-size", type=int, default=60000)
    parser.add_argument("--student-epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="initialisation and latents, never the noise")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    dataset = load_dataset("fmnist")
    rows = []
    for index, epsilon in enumerate(args.epsilons):
        left = args.budget_seconds - (time.perf_counter() - started)
        row = run_epsilon(dataset, epsilon, args.device, left / (len(args.epsilons) - index), args.synthetic_size,
                          args.student_epochs, args.seed)
        rows.append(row)
        (args.out / f"{row['row']}-seed{args.seed}.json").write_text(json.dumps(row, indent=2))
        (args.out / "rows.json").write_text(json.dumps(rows, indent=2))
        print(f"{row['row']} ({'PARTIAL: ' if row['partial'] else ''}{row['steps_done']}/{row['steps_planned']} steps, "
              f"epsilon {row['epsilon_spent']:.3f}, {row['device']}): final {100 * row['accuracy_final']:.2f}%, "
              f"official protocol (max over epochs, optimistic) "
              f"{100 * row['accuracy_official_protocol_max_over_epochs_optimistic']:.2f}%, paper {row['paper']}, "
              f"{row['seconds_per_step']:.3f} s a step, wall {row['wall_seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
