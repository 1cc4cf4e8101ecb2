"""How often a judge trained on the real images agrees with the labels of a synthetic set: whether a synthesiser's
images show their class, apart from how the evaluation classifier trained on them generalises. The judge is the
teachers' `cnn`, trained 2 epochs on Fashion-MNIST's training split (seed 0); each `synthesize` output directory
gets its agreement, per class, beside the accuracies its report gives.

    .venv/bin/python benchmarks/experiments/synthetic_judge.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from dpdistill.data import load_dataset
from dpdistill.evaluation.metrics import predict
from dpdistill.training.teacher import TeacherConfig, train_classifier


def main(run_dirs: list[str]) -> None:
    dataset = load_dataset("fmnist")
    judge, trained = train_classifier(dataset, TeacherConfig(arch="cnn", epochs=2, min_steps=0, seed=0),
                                      evaluate_each_epoch=False)
    print(f"judge: {trained['test_accuracy']:.3f} on the test split")
    for run in map(Path, run_dirs):
        synthetic = np.load(run / "synthetic.npz")  # x in [-1, 1] like the dataset's images
        labels = torch.from_numpy(synthetic["y"])
        guesses = predict(judge, torch.from_numpy(synthetic["x"]))
        per_class = [round((guesses[labels == c] == c).float().mean().item(), 2) for c in range(10)]
        accuracy = json.loads((run / "report.json").read_text())["accuracy"]
        print(f"{run}: agreement {(guesses == labels).float().mean().item():.3f}, per class {per_class}, "
              f"report {accuracy}")


if __name__ == "__main__":
    main(sys.argv[1:])
