"""Which moving average of DP-SGD's iterates to release (`train-private --ema-decay`): several decays measured on
the same runs, beside the last iterate, so that each comparison is paired (the same secret noise and batches).

    .venv/bin/python benchmarks/experiments/dpsgd_averaging.py DATASET RUNS [--epsilon E] [--cosine] [--set KEY=VALUE ...]

Each run trains train-private's student (scatter-linear by default) once with secure noise, through the trainer
the command uses, and tracks one `IterateAverage` per decay; it prints one JSON line per run with the test
accuracy of the last iterate and of each average, then their means. Decays are compared on the MNIST set
(`mnist`, with `--set batch_size=1024 --set lr=1` as the benchmarks run it); Fashion-MNIST only confirms. With
`--cosine` the step decays to 0 instead of staying constant. About 15 s a run on MNIST, 40 to 140 s on
Fashion-MNIST (features cached), on 2 shared cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import tempfile
from pathlib import Path

from dpdistill.data import load_dataset
from dpdistill.evaluation.metrics import share_correct
from dpdistill.settings import parse_assignments
from dpdistill.training.averaging import IterateAverage
from dpdistill.training.private import (TRAINERS, PrivateTrainingConfig, plan_private_training,
                                       public_train_size, with_public_size)

DECAYS = (0.9, 0.95, 0.98, 0.99, 0.995, 0.998, 0.999, 0.9999)


def one_run(config: PrivateTrainingConfig, work_dir: Path, cosine: bool) -> dict[str, float]:
    """The last iterate's test accuracy and each average's, from one run (with `cosine`, the step decays from
    --lr to 0 along a half cosine over the run's steps)."""
    dataset = load_dataset(config.dataset)
    config = with_public_size(dataclasses.replace(config, ema_decay=0.0), dataset)  # the trainer's: its last weights
    plan = plan_private_training(config, public_train_size(config, dataset))
    trainer = TRAINERS[config.method](config, dataset, plan, work_dir)
    averages = {decay: IterateAverage(trainer.trained, decay) for decay in DECAYS}
    step = trainer._step

    def step_and_average(inputs, labels):
        if cosine:  # the ledger has charged this step: its number, from 1
            for group in trainer.optimizer.param_groups:
                group["lr"] = trainer.config.lr * (1 + math.cos(math.pi * (trainer.ledger.answered - 1)
                                                                / plan.steps)) / 2
        losses = step(inputs, labels)
        for average in averages.values():
            average.update()
        return losses

    trainer._step = step_and_average
    trainer.run()
    accuracies = {"last": share_correct(trainer._predictions(), trainer.y_eval)}
    for decay, average in averages.items():
        with average.swapped_in():
            accuracies[f"ema {decay:g}"] = share_correct(trainer._predictions(), trainer.y_eval)
    return {name: round(100 * value, 2) for name, value in accuracies.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset")
    parser.add_argument("runs", type=int)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--cosine", action="store_true", help="a cosine decay of the step to 0")
    parser.add_argument("--set", action="append", default=[], dest="settings")
    args = parser.parse_args()
    config = PrivateTrainingConfig(dataset=args.dataset, epsilon=args.epsilon,
                                   **parse_assignments(args.settings, PrivateTrainingConfig))
    runs = []
    for index in range(args.runs):
        with tempfile.TemporaryDirectory() as folder:
            runs.append(one_run(config, Path(folder), args.cosine))
        print(json.dumps({"run": index, **runs[-1]}), flush=True)
    print(json.dumps({"mean": {name: round(statistics.mean(run[name] for run in runs), 2) for name in runs[0]},
                      "mean_gain": {name: round(statistics.mean(run[name] - run["last"] for run in runs), 2)
                                    for name in runs[0]}}))


if __name__ == "__main__":
    main()
