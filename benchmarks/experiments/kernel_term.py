"""A release's generator with DP-MERF's kernel term beside its class statistics (issue design: "a feature-statistics
term, plus the mean embedding's kernel term"): each class's mean embedding phi (training/mean_embedding.py: unit
scattering coefficients, their random Fourier features and the pixels') is released once, and in the release's
transcription every class the teacher names in a generated batch is pulled towards it, beside its cell statistics.

    .venv/bin/python benchmarks/experiments/kernel_term.py RELEASE_DIR OUT [--epsilon E | --exact] [--weight W]

RELEASE_DIR is a `dpdistill release` run (its OUT/teacher holds the DP teacher and the released statistics); OUT
receives the transcription at the release's own loop and synthetic-set size, and `kernel_term.json`. The
embedding's release is one Gaussian mechanism at `--epsilon` (replace-one, delta 1e-5), spent on top of the
release's own budget, which the transcription's report does not count; `--exact` releases it without noise (the
control: NO guarantee). Only the added term is new: the teacher, the statistics, the loop and the measures are the
release's.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from dpdistill import api
from dpdistill.data import load_dataset
from dpdistill.losses.generator import ClassCellStatistics, per_class_distance
from dpdistill.methods.config import RELEASE_LOOP
from dpdistill.privacy.accounting import GaussianQuery
from dpdistill.privacy.randomness import noise_source
from dpdistill.training.mean_embedding import (MeanEmbeddingConfig, MeanEmbeddingPlan, MeanEmbeddingSynthesizer,
                                               plan_mean_embedding)

EXACT_MULTIPLIER = 1e-9  # the control's noise: std 2e-9 on sums of thousands of unit vectors


def add_kernel_term(embedding: torch.nn.Module, targets: torch.Tensor, weight: float) -> list[float]:
    """Make every class-statistics term also pull each class's mean embedding towards its released mean, each
    class present at least twice in proportion to its share of the batch (as the cell term); the kernel terms
    computed are appended to the list returned."""
    cells, kernels = ClassCellStatistics.loss, []

    def with_kernel(self: ClassCellStatistics, images: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        kernel = per_class_distance(embedding(images), classes,
                                    lambda chosen, label: (chosen.mean(0) - targets[label]).norm())
        kernels.append(float(kernel.detach()))
        return cells(self, images, classes) + weight * kernel
    ClassCellStatistics.loss = with_kernel
    return kernels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("release", type=Path)
    parser.add_argument("out", type=Path)
    noise = parser.add_mutually_exclusive_group(required=True)
    noise.add_argument("--epsilon", type=float, help="the embedding's own budget (replace-one, delta 1e-5)")
    noise.add_argument("--exact", action="store_true", help="no noise: the control (NO guarantee)")
    parser.add_argument("--weight", type=float, default=1.0, help="the kernel term's weight beside the cells'")
    parser.add_argument("--seed", type=int, default=0, help="the random features' and the transcription's")
    parser.add_argument("--iterations", type=int, default=RELEASE_LOOP["iterations"], help="the release's loop's")
    args = parser.parse_args()
    release = json.loads((args.release / "config.json").read_text())
    dataset_name = release["teacher"]["dataset"]
    dataset = load_dataset(dataset_name)
    config = MeanEmbeddingConfig(dataset_name, args.epsilon or 1.0, seed=args.seed)
    plan = (MeanEmbeddingPlan(GaussianQuery(EXACT_MULTIPLIER)) if args.exact else plan_mean_embedding(config))
    shutil.rmtree(args.out, ignore_errors=True)
    synthesizer = MeanEmbeddingSynthesizer(config, dataset, plan, noise_source(), args.out / "embedding")
    targets = synthesizer.targets(synthesizer.release())
    kernels = add_kernel_term(synthesizer.embedding, targets, args.weight)
    transcription = release["transcription"]
    result = api.transcribe(str(args.release / "teacher"), str(args.out / "run"), privacy="none",
                            preset="dp-teacher", iterations=args.iterations,
                            student_steps=RELEASE_LOOP["student_steps"], student_arch=transcription["student_arch"],
                            statistics_weight=1.0, synthetic_size=transcription["synthetic_size"], seed=args.seed)
    report, ran = result.report, json.loads((args.out / "run" / "config.json").read_text())
    summary = {"release": str(args.release), "weight": args.weight,
               "embedding": "exact (NO guarantee)" if args.exact else plan.summary(1e-5),
               "kernel_term": {"first": kernels[0], "last": kernels[-1], "steps": len(kernels)},
               "accuracy": report["accuracy"], "frechet": report["synthetic"]["fidelity"]["synthetic_to_real"],
               # what the transcription ran otherwise than the release's own (none but the output's places)
               "unlike_the_release": {key: [value, ran.get(key)] for key, value in transcription.items()
                                      if ran.get(key) != value}}
    (args.out / "kernel_term.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
