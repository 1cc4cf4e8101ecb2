"""The search behind scatter-linear's DP-SGD defaults, on a validation split: the test set is never read.

    .venv/bin/python benchmarks/experiments/scatter_validation.py [OUT_DIR]

Fashion-MNIST's first 50,000 training images train, its last 10,000 validate (written as an .npz in OUT_DIR, by
default a temporary folder). Each setting runs `train-private --method dpsgd --student-arch scatter-linear` once
(seed 0) through the Python API and prints a Markdown row with its last-epoch validation accuracy. About 20
minutes on 2 cores, the scattering pass included (once: the features are kept).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from dpdistill.data import load_dataset
from dpdistill.data.sources import write_validation_split
from dpdistill.pipeline import train_private
from dpdistill.training.private import PrivateTrainingConfig

VALIDATION = 10_000
# (epsilon, batch size, learning rate, epochs, clipping bound): Tramer & Boneh's recipe (4,096, 4, 40, 0.1) and
# the variations tried from it.
SETTINGS = (
    (10.0, 4096, 4.0, 40, 0.1), (10.0, 4096, 4.0, 80, 0.1), (10.0, 4096, 8.0, 40, 0.1), (10.0, 4096, 8.0, 40, 0.05),
    (10.0, 8192, 8.0, 80, 0.1), (10.0, 8192, 12.0, 120, 0.1), (10.0, 16384, 16.0, 160, 0.1),
    (3.0, 4096, 4.0, 40, 0.1), (3.0, 4096, 4.0, 60, 0.1), (3.0, 8192, 8.0, 80, 0.1),
    (1.0, 4096, 4.0, 20, 0.1), (1.0, 8192, 8.0, 40, 0.1),
)


def validation_split(folder: Path) -> Path:
    """Fashion-MNIST's training split as train (first 50,000) and validation (last 10,000), as an .npz: what
    `dpdistill data split --dataset fmnist --validation 10000` writes."""
    path = folder / "fmnist-validation.npz"
    write_validation_split(load_dataset("fmnist"), VALIDATION, path)
    return path


def main(out: Path) -> None:
    data = validation_split(out)
    print("| epsilon | batch | lr | epochs | clip | validation accuracy |")
    print("| --- | --- | --- | --- | --- | --- |")
    for index, (epsilon, batch, lr, epochs, clip) in enumerate(SETTINGS):
        config = PrivateTrainingConfig(dataset=str(data), method="dpsgd", student_arch="scatter-linear",
                                       epsilon=epsilon, batch_size=batch, lr=lr, epochs=epochs, max_grad_norm=clip)
        report = train_private(config, out / f"run-{index}")
        print(f"| {epsilon:g} | {batch} | {lr:g} | {epochs} | {clip:g} | "
              f"{100 * report['accuracy']['student']:.2f}% |", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as folder:
            main(Path(folder))
