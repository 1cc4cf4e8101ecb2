"""Augmentation multiplicity (De et al. 2022) for the DP-SGD cnn that `release` trains as its teacher: each
example's gradient is the mean of its gradients on K views of the image before clipping, so one example still
moves the clipped sum by at most the clip, and the plan, the noise and the epsilon are the single view's.

    .venv/bin/python benchmarks/experiments/cnn_views.py DATASET [--views random:4 | shift:4 | id,flip,...]
        [--runs 2] [--epsilon 0.9] [--delta 9e-6] [--set KEY=VALUE ...]

The run is train-private's, through the trainer the command uses, with the release teacher's schedule (the cnn,
batch 1,024, Adam at lr 3e-3, 3 epochs; `--set epochs=10` as the release takes it on the MNIST set) and its share of
the budget (epsilon 0.9 and delta 9e-6 of a release at 1 and 1e-5). Views are named (those of scatter_views.py:
id, flip, up, down, left, right), `random:K` (the image itself and K - 1 copies each shifted by up to 2 pixels and
mirrored at random, drawn afresh each step: `data/augment.py`, the augmentation of `release`'s transcription) or
`shift:K` (the same without mirroring). The views of a batch go through the per-example path one after the other,
so memory stays a single view's. One JSON line per run, with the test accuracy of the released (last) weights.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch.nn.functional as F
from torch import Tensor

from dpdistill.allocator import keep_freed_memory
from dpdistill.data import load_dataset
from dpdistill.data.augment import shift_and_flip
from dpdistill.evaluation.metrics import share_correct
from dpdistill.settings import parse_assignments
from dpdistill.training.private import (CNN_SCHEDULE, TRAINERS, PrivateTrainingConfig, plan_private_training,
                                       public_train_size, with_public_size)
from scatter_views import VIEWS


def chosen_views(spec: str) -> list[Callable[[Tensor], Tensor]]:
    """The views `--views` names, the image itself first."""
    if spec.startswith(("random:", "shift:")):
        kind, count = spec.split(":")
        return [VIEWS["id"]] + [lambda images: shift_and_flip(images, 2, kind == "random")] * (int(count) - 1)
    return [VIEWS[name] for name in spec.split(",")]


def one_run(config: PrivateTrainingConfig, views: list[Callable[[Tensor], Tensor]], work_dir: Path) -> float:
    """One run of the trainer with each example's gradient averaged over `views`; its test accuracy."""
    dataset = load_dataset(config.dataset)
    config = with_public_size(config, dataset)
    plan = plan_private_training(config, public_train_size(config, dataset))
    trainer = TRAINERS[config.method](config, dataset, plan, work_dir)
    assert not trainer.ghost_clipping, "views need the hooks' per-example gradients"
    weights = [weight for weight in trainer.trained.parameters() if weight.requires_grad]

    def per_example_gradients(inputs: Tensor, labels: Tensor) -> Tensor:
        sums: list[Tensor | None] = [None] * len(weights)
        for view in views:
            losses = F.cross_entropy(trainer.private_model(view(inputs)), labels, reduction="none")
            losses.mean().backward()  # Opacus' hooks: each example's gradient of its own loss
            for index, weight in enumerate(weights):
                sums[index] = weight.grad_sample if sums[index] is None else sums[index] + weight.grad_sample
                weight.grad_sample = None
        for weight, total in zip(weights, sums):
            weight.grad_sample = total / len(views)
        return losses.detach()  # the last view's: the run's logged loss only

    trainer._per_example_gradients = per_example_gradients
    trainer.run()
    return share_correct(trainer._predictions(), trainer.y_eval)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset")
    parser.add_argument("--views", default="id", help=f"comma-separated, of {', '.join(VIEWS)}; or random:K, shift:K")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--epsilon", type=float, default=0.9)
    parser.add_argument("--delta", type=float, default=9e-6)
    parser.add_argument("--set", action="append", default=[], dest="settings")
    args = parser.parse_args()
    keep_freed_memory()  # as the `dpdistill` command does
    settings = {"method": "dpsgd", "student_arch": "cnn", **CNN_SCHEDULE,
                **parse_assignments(args.settings, PrivateTrainingConfig)}
    for run in range(args.runs):
        config = PrivateTrainingConfig(dataset=args.dataset, epsilon=args.epsilon, delta=args.delta, seed=run,
                                       **settings)
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as folder:
            accuracy = one_run(config, chosen_views(args.views), Path(folder))
        print(json.dumps({"dataset": args.dataset, "views": args.views, "epsilon": args.epsilon, "run": run,
                          **{key: value for key, value in settings.items() if key != "method"},
                          "test_accuracy": round(100 * accuracy, 2),
                          "seconds": round(time.perf_counter() - started, 1)}), flush=True)


if __name__ == "__main__":
    main()
