"""Does training on shifted images help an ensemble's small members? Two members per setting, Fashion-MNIST.

    .venv/bin/python benchmarks/experiments/member_shift.py

Prints, for partitions of M = 250 and M = 100 (240 and 600 images), each setting's member test accuracies and
seconds per member: no shift vs shifts of up to 2 pixels, at 300 and 800 optimizer steps.
"""

from __future__ import annotations

import time

from dpdistill.data import load_dataset
from dpdistill.data.partition import new_partition_key, partition_indices
from dpdistill.training.teacher import TeacherConfig, train_classifier


def main() -> None:
    dataset = load_dataset("fmnist")
    for members in (250, 100):
        parts = partition_indices(dataset.ids_train, members, new_partition_key())
        for shift, steps in ((0, 300), (2, 300), (2, 800)):
            started, accuracies = time.perf_counter(), []
            for index in range(2):
                subset = dataset.train_subset(parts[index])
                config = TeacherConfig(min_steps=steps, augment_shift=shift, seed=index)
                accuracies.append(train_classifier(subset, config, evaluate_each_epoch=False)[1]["test_accuracy"])
            print(f"M={members} shift={shift} steps={steps}: members "
                  f"{', '.join(f'{100 * a:.2f}%' for a in accuracies)}, "
                  f"{(time.perf_counter() - started) / 2:.1f} s a member", flush=True)


if __name__ == "__main__":
    main()
