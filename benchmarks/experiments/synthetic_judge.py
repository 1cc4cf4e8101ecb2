"""How often a judge trained on the real images agrees with the labels of a synthetic set: whether a synthesiser's
images show their class, apart from how the evaluation classifier trained on them generalises. The judge is a
784-256-10 MLP (5 epochs of Adam on Fashion-MNIST's training split, seed 0); each `synthesize` output directory
gets its agreement, per class, beside the accuracies its report gives.

    .venv/bin/python benchmarks/experiments/synthetic_judge.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dpdistill.data import load_dataset


def train_judge(images: torch.Tensor, labels: torch.Tensor, epochs: int = 5, batch: int = 256) -> nn.Module:
    torch.manual_seed(0)
    judge = nn.Sequential(nn.Flatten(), nn.Linear(images[0].numel(), 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.Adam(judge.parameters(), 1e-3)
    for _ in range(epochs):
        order = torch.randperm(len(labels))
        for start in range(0, len(order), batch):
            index = order[start:start + batch]
            loss = F.cross_entropy(judge(images[index]), labels[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return judge.eval()


def main(run_dirs: list[str]) -> None:
    dataset = load_dataset("fmnist")
    judge = train_judge(dataset.x_train, dataset.y_train)
    with torch.no_grad():
        judged = (judge(dataset.x_test).argmax(1) == dataset.y_test).float().mean().item()
        print(f"judge: {judged:.3f} on the test split")
        for run in map(Path, run_dirs):
            synthetic = np.load(run / "synthetic.npz")  # x in [-1, 1] like the dataset's images
            labels = torch.from_numpy(synthetic["y"])
            guesses = judge(torch.from_numpy(synthetic["x"])).argmax(1)
            per_class = [round((guesses[labels == c] == c).float().mean().item(), 2) for c in range(10)]
            accuracy = json.loads((run / "report.json").read_text())["accuracy"]
            print(f"{run}: agreement {(guesses == labels).float().mean().item():.3f}, per class {per_class}, "
                  f"report {accuracy}")


if __name__ == "__main__":
    main(sys.argv[1:])
