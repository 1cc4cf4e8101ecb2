"""A data set no one here made, used as a new user would: Fashion-MNIST's first five classes padded to 32x32 RGB
with a random tint per image, 12,000 training and 2,000 test images, written as a folder of PNGs (one subfolder
per class, torchvision's ImageFolder layout per split), then given to the command line with its defaults.

    python benchmarks/experiments/user_data.py [--out /tmp/user-data]
        [--step build|defaults|private|sweep|scatter-cnn|teachers|pate]

Each step runs the `dpdistill` command printed beside it and records its exit status, its wall time, its last
lines and (where it wrote one) its report's accuracy in `results/user_data.json`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from dpdistill.data import load_dataset

CLASSES = 5
NAMES = ("t-shirt", "trouser", "pullover", "dress", "coat")  # Fashion-MNIST's first five (sorted: the labels)
TRAIN, TEST = 12000, 2000
# `--step sweep`: scatter-linear's batch, step and epochs beside the defaults at epsilon 1, and the student's ceiling
# on this set (epsilon 1000, four times the epochs): whether any setting reaches what the defaults miss
SWEEP = (("1", "8192", "8", "40"), ("1", "4096", "4", "40"), ("1", "8192", "16", "80"), ("1000", "8192", "8", "160"))
RESULTS = Path(__file__).parent / "results" / "user_data.json"


def build(folder: Path) -> None:
    """The tinted five-class set as PNG folders: train/CLASS/*.png and test/CLASS/*.png."""
    data = load_dataset("fmnist")
    draw = np.random.default_rng(0)
    for split, images, labels, count in (("train", data.x_train, data.y_train, TRAIN),
                                         ("test", data.x_test, data.y_test, TEST)):
        chosen = np.flatnonzero(labels.numpy() < CLASSES)[:count]
        padded = np.pad(images.numpy()[chosen, 0], ((0, 0), (2, 2), (2, 2)))
        tints = draw.uniform(0.4, 1.0, size=(len(chosen), 1, 1, 3))
        rgb = np.round(padded[..., None] * tints * 255).astype(np.uint8)
        for index, (image, label) in enumerate(zip(rgb, labels.numpy()[chosen])):
            target = folder / split / NAMES[label]
            target.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(target / f"{index:05d}.png")


def dpdistill(*args: str) -> dict:
    """One command line run, timed, its outcome kept."""
    command = [sys.executable, "-m", "dpdistill.cli.main", *args]
    started = time.perf_counter()
    finished = subprocess.run(command, capture_output=True, text=True)
    outcome = {"command": "dpdistill " + " ".join(args), "exit": finished.returncode,
               "wall_seconds": round(time.perf_counter() - started, 1),
               "last_lines": (finished.stdout + finished.stderr).strip().splitlines()[-3:]}
    out = Path(args[args.index("--out") + 1]) if "--out" in args else None
    if out is not None and (out / "report.json").exists():
        outcome["accuracy"] = json.loads((out / "report.json").read_text()).get("accuracy")
    print(json.dumps(outcome, indent=1), flush=True)
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/user-data"))
    parser.add_argument("--step", choices=("build", "defaults", "private", "sweep", "scatter-cnn", "teachers", "pate"),
                        action="append")
    options = parser.parse_args()
    steps = options.step or ["build", "defaults", "private", "teachers", "pate"]
    folder, out = options.out / "tinted", options.out
    results = {}
    if "build" in steps:
        build(folder)
    if "defaults" in steps:  # nothing but the folder and the budget: the size a noisy count at 1% of it
        results["train-private-defaults"] = dpdistill("train-private", "--dataset", str(folder), "--epsilon", "1",
                                                      "--out", str(out / "defaults"), "--overwrite")
    if "private" in steps:  # the defaults (scatter-linear, the batch scaled to the size), the size declared
        results["train-private"] = dpdistill("train-private", "--dataset", str(folder), "--dataset-size",
                                             str(TRAIN), "--epsilon", "1", "--out", str(out / "private"),
                                             "--overwrite")
    if "sweep" in steps:
        for epsilon, batch, lr, epochs in SWEEP:
            results[f"sweep-eps{epsilon}-batch{batch}-lr{lr}-epochs{epochs}"] = dpdistill(
                "train-private", "--dataset", str(folder), "--dataset-size", str(TRAIN), "--epsilon", epsilon,
                "--batch-size", batch, "--lr", lr, "--epochs", epochs, "--out", str(out / "sweep"), "--overwrite")
    if "scatter-cnn" in steps:  # a deeper student on the same features (40 minutes beside two other jobs)
        results["scatter-cnn-eps1"] = dpdistill("train-private", "--dataset", str(folder), "--dataset-size", str(TRAIN),
                                                "--epsilon", "1", "--student-arch", "scatter-cnn",
                                                "--out", str(out / "scatter-cnn"), "--overwrite")
    if "teachers" in steps:
        for heads in (50, 1000):
            results[f"teachers-{heads}"] = dpdistill(
                "train-teacher", "--dataset", str(folder), "--partitions", str(heads), "--heads-only", "--init",
                "scatter", "--out", str(out / f"heads-{heads}"), "--overwrite")
    if "pate" in steps:  # 50 heads: refused before it asks; the suggestion, more teachers, then runs
        for heads in (50, 1000):
            results[f"pate-{heads}"] = dpdistill("pate", "--teacher", str(out / f"heads-{heads}"), "--epsilon", "1",
                                                 "--public-size", "1000", "--queries", "500",
                                                 "--out", str(out / f"pate-{heads}"), "--overwrite")
    RESULTS.parent.mkdir(exist_ok=True)
    kept = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}  # the other steps' latest outcomes
    RESULTS.write_text(json.dumps({**kept, **results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
