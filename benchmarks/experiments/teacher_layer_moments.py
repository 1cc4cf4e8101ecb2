"""What a DP teacher's layer statistics look like on the private data, and how much the release's clipping bends
them: whether a teacher trained longer guides a release's generator worse because the statistics it is asked to
match are further from its own. For each teacher directory, over Fashion-MNIST's training split (NOT private: a
diagnostic of the data the release reads): the per-example norm of the moments `release` clips (median, 99th
percentile, share above the bound), and per normalisation layer the exact channel means and variances against those
of the clipped moments (relative error). Where TEACHER_DIR holds released statistics (`statistics.safetensors`, a
release's `teacher`), also the released ones against the exact.

    .venv/bin/python benchmarks/experiments/teacher_layer_moments.py TEACHER_DIR [TEACHER_DIR ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import Tensor

from dpdistill.data import load_dataset
from dpdistill.methods.teachers import read_teacher
from dpdistill.training.feature_statistics import (BATCH, CLIP, STATISTICS_FILE, clipped_rows, layer_moments,
                                                   layer_statistics, load_statistics)


def moments(model: torch.nn.Module, images: Tensor) -> Tensor:
    """(n, D): every example's unclipped moments, as `release` computes them before its clip."""
    with torch.no_grad():
        return torch.cat([layer_moments(model, images[at:at + BATCH]) for at in range(0, len(images), BATCH)])


def relative(estimate: Tensor, exact: Tensor) -> float:
    return ((estimate - exact).norm() / exact.norm()).item()


def main(teachers: list[Path]) -> None:
    images = load_dataset("fmnist").x_train
    print("| teacher | test % | moment norm: median / 99th pct / max | above the bound | layer | mean, var: "
          "clipped vs exact (rel. error) | released vs exact |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for directory in teachers:
        model, _ = read_teacher(directory)
        accuracy = json.loads((directory / "report.json").read_text())["accuracy"]["student"]
        model.eval()
        rows = moments(model, images)
        norms = rows.norm(dim=1)
        clipped = clipped_rows(rows, CLIP)
        exact, bent = layer_statistics(model, rows.mean(0)), layer_statistics(model, clipped.mean(0))
        released = (load_statistics(directory / STATISTICS_FILE)[0].layers
                    if (directory / STATISTICS_FILE).exists() else None)
        head = (f"| {directory} | {100 * accuracy:.2f} | "
                f"{norms.median():.2f} / {norms.quantile(0.99):.2f} / {norms.max():.2f} | "
                f"{100 * (norms > CLIP).float().mean():.2f}% |")
        for index, name in enumerate(exact):
            (mean, var), (bent_mean, bent_var) = exact[name], bent[name]
            versus = "—" if released is None else (f"{relative(released[name][0], mean):.3f}, "
                                                   f"{relative(released[name][1], var):.3f}")
            print(f"{head if index == 0 else '| | | | |'} {name} (mean |m| {mean.abs().mean():.3f}, var "
                  f"{var.mean():.3f}) | {relative(bent_mean, mean):.3f}, {relative(bent_var, var):.3f} | {versus} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    main([Path(argument) for argument in sys.argv[1:]])
