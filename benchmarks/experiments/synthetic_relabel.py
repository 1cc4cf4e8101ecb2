"""Whether a more accurate DP model labels a release's synthetic images better than the release's own teacher: the
images of a release (guided by its DP cnn teacher) labelled by another saved classifier (a scatter-linear
`train-private` run, 88% where the cnn teacher has 85%), and DataLens' classifier (the release's own measure)
trained on each labelling, the release's labels first. Post-processing of the releases read, but a product would
pay for both teachers.

    .venv/bin/python benchmarks/experiments/synthetic_relabel.py RELEASE_DIR LABELLER_DIR [LABELLER_DIR ...]

About 1.5 minutes a labelling on 2 idle cores.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from dpdistill import api
from dpdistill.data import load_dataset
from dpdistill.evaluation.metrics import predict
from dpdistill.methods.config import TranscriptionConfig
from dpdistill.methods.transcription import measure_synthetic


def main(release: Path, labellers: list[Path]) -> None:
    synthetic = np.load(release / "synthetic.npz")
    images, release_labels = torch.from_numpy(synthetic["x"]), torch.from_numpy(synthetic["y"])
    dataset = load_dataset("fmnist")
    labellings = {"the release's teacher": release_labels}
    for labeller in labellers:
        model = api.load_model(labeller).eval()  # its student or model
        labels = predict(model, images)
        labellings[str(labeller)] = labels
        print(json.dumps({"labeller": str(labeller),
                          "test accuracy": round(100 * (predict(model, dataset.x_test) == dataset.y_test)
                                                 .float().mean().item(), 2),
                          "agrees with the release's labels": round(100 * (labels == release_labels)
                                                                    .float().mean().item(), 2),
                          "images per class": torch.bincount(labels, minlength=dataset.num_classes).tolist()}),
              flush=True)
    for name, labels in labellings.items():
        _, accuracy = measure_synthetic(images, labels, name, dataset.num_classes, TranscriptionConfig(), dataset)
        print(json.dumps({"labels": name, "classifier on the set": round(100 * accuracy, 2)}), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), [Path(argument) for argument in sys.argv[2:]])
