"""How the figure of a release's synthetic set depends on the protocol that scores it: the run's generator draws
SIZE images (classes balanced by the DP teacher's argmax, as the release draws them), and a classifier of each
architecture is trained on them alone (Adam 1e-3, batch 128, EPOCHS epochs, final model) and tested on the real
test split. DataLens' protocol, the release's, is the `datalens` classifier; FETA-Pro's figures use stronger
classifiers (DPImageBench: the mean of ResNet, WRN and ResNeXt). `--confidence P` keeps only the images the teacher
gives their class with probability at least P (post-processing too).

    .venv/bin/python benchmarks/experiments/synthetic_protocol.py RUN_DIR [--sizes 10000,60000]
        [--archs datalens,cnn] [--epochs 10]

RUN_DIR is a finished `release` (its generator, and its DP teacher in RUN_DIR/teacher); everything read is
post-processing of its releases. One JSON line per size and classifier (minutes each on 2 cores).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dpdistill.api import load_model
from dpdistill.data import load_dataset
from dpdistill.methods.release import TEACHER_DIR
from dpdistill.methods.synthetic import EVALUATION_BATCH, EVALUATION_LR, StudentSettings, balanced_draw, evaluate_synthetic
from dpdistill.models.checkpoint import STUDENT, load_generator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--sizes", default="10000,60000")
    parser.add_argument("--archs", default="datalens,cnn")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="the latent vectors' and the classifiers' seed")
    parser.add_argument("--confidence", type=float, default=0.0,
                        help="keep only images whose teacher probability of its class is at least this (0: all)")
    args = parser.parse_args()
    generator, meta = load_generator(args.run)
    teacher = load_model(args.run / TEACHER_DIR, STUDENT).eval()
    config = json.loads((args.run / "config.json").read_text())
    dataset = load_dataset(config["teacher"]["dataset"])
    torch.manual_seed(args.seed)

    @torch.no_grad()
    def generate(count: int) -> torch.Tensor:
        return generator(torch.randn(count, meta["latent_dim"]))

    @torch.no_grad()
    def label(images: torch.Tensor) -> torch.Tensor:
        """The teacher's class, or -1 (never kept) where it is less sure than --confidence."""
        probabilities, classes = teacher(images).softmax(1).max(1)
        return torch.where(probabilities >= args.confidence, classes, torch.full_like(classes, -1))

    for size in map(int, args.sizes.split(",")):
        images, labels = balanced_draw(generate, label, size, dataset.num_classes)
        for arch in args.archs.split(","):
            _, evaluation, seconds = evaluate_synthetic(dataset, images, labels, "release", StudentSettings(
                arch, args.epochs, EVALUATION_LR, EVALUATION_BATCH, args.seed, "cpu", every_epoch=False))
            print(json.dumps({"run": str(args.run), "images": len(labels), "confidence": args.confidence,
                              "classifier": arch, "epochs": args.epochs,
                              "test_accuracy": round(100 * evaluation["accuracy"]["student"], 2),
                              "seconds": round(seconds)}), flush=True)


if __name__ == "__main__":
    main()
