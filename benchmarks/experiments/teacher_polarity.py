"""Whether a saved classifier tells an image from its negative: its accuracy on the test images and on their
negatives (the images live in [-1, 1], so the negative of an image is -x), and how often it names the same class for
both. A generator guided by a classifier that cannot tell them apart has no reason to draw the data's polarity.

    python benchmarks/experiments/teacher_polarity.py MODEL_DIR [--name student] [--dataset fmnist]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dpdistill.data import load_dataset
from dpdistill.models.checkpoint import load_classifier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--name", default="student", help="the saved model's name in MODEL_DIR: model (a teacher), student (a run's student)")
    parser.add_argument("--dataset", default="fmnist")
    options = parser.parse_args()
    model, _ = load_classifier(options.model_dir, options.name)
    data = load_dataset(options.dataset)
    with torch.no_grad():
        named = torch.cat([model(batch).argmax(1) for batch in data.x_test.split(1000)])
        negated = torch.cat([model(-batch).argmax(1) for batch in data.x_test.split(1000)])
    print(json.dumps({"accuracy": (named == data.y_test).float().mean().item(),
                      "accuracy_on_negatives": (negated == data.y_test).float().mean().item(),
                      "same_class_for_both": (named == negated).float().mean().item()}))


if __name__ == "__main__":
    main()
