"""How confident DP teachers are on real images, on uniform noise and on a release's synthetic set: whether a teacher
that guides a release's generator worse is also calibrated worse. For each teacher directory: its test accuracy on
Fashion-MNIST, its mean top-class probability on the test split (and how far that exceeds its accuracy), on 2,000
images of uniform noise (seed 0) and on the images of `synthetic.npz` from RELEASE_DIR.

    .venv/bin/python benchmarks/experiments/teacher_confidence.py RELEASE_DIR TEACHER_DIR [TEACHER_DIR ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from dpdistill.data import load_dataset
from dpdistill.evaluation.metrics import probabilities
from dpdistill.methods.teachers import read_teacher

NOISE_IMAGES = 2000


def mean_confidence(model: torch.nn.Module, images: torch.Tensor) -> float:
    return probabilities(model, images).max(1).values.mean().item()


def main(release: Path, teachers: list[Path]) -> None:
    dataset = load_dataset("fmnist")
    synthetic = torch.from_numpy(np.load(release / "synthetic.npz")["x"]).float()  # in [-1, 1] like the dataset's
    noise = torch.rand(NOISE_IMAGES, *dataset.x_test.shape[1:], generator=torch.Generator().manual_seed(0)) * 2 - 1
    print("| teacher | test accuracy | confidence on test (over accuracy) | on uniform noise | on the synthetic set |")
    print("| --- | --- | --- | --- | --- |")
    for directory in teachers:
        model, _ = read_teacher(directory)
        on_test = probabilities(model, dataset.x_test)
        accuracy = (on_test.argmax(1) == dataset.y_test).float().mean().item()
        confidence = on_test.max(1).values.mean().item()
        print(f"| {directory} | {100 * accuracy:.2f}% | {confidence:.3f} ({confidence - accuracy:+.3f}) | "
              f"{mean_confidence(model, noise):.3f} | {mean_confidence(model, synthetic):.3f} |")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    main(Path(sys.argv[1]), [Path(argument) for argument in sys.argv[2:]])
