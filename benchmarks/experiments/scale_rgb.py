"""A data set larger than the scattering coefficients a 24 GB machine can hold in memory: 200,000 RGB 32x32 training
images (each Fashion-MNIST training image three or four times, padded to 32x32 at a random offset of up to two
pixels, with a random tint per image and channel from 0.4 to 1) and the 10,000 test images tinted the same way,
written as one .npz; then `dpdistill train-private --student-arch scatter-linear` on it at epsilon 1 with the
defaults, its wall time and peak memory recorded.

    .venv/bin/python benchmarks/experiments/scale_rgb.py --out /tmp/scale-rgb [--record]

The coefficients (81 x 3 channels x 8 x 8 floats an image: 12.4 GB for the training split) are written to the
feature cache batch by batch and read back memory-mapped (models/features.py). The run uses its own
$DPDISTILL_HOME under --out with a 16 GB cache limit, so the machine's cache keeps its other entries.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dpdistill.data import load_dataset

TRAIN_SIZE = 200_000
RESULTS = Path(__file__).parent / "results" / "scale_rgb.json"


def tinted(images: np.ndarray, indices: np.ndarray, draw: np.random.Generator) -> np.ndarray:
    """images[indices] (grey, 28x28, in [-1, 1]) padded to 32x32 at a random offset, tinted per channel: uint8 NHWC."""
    grey = (images[indices, 0] + 1) / 2
    padded = np.zeros((len(indices), 32, 32), np.float32)
    offsets = draw.integers(0, 5, size=(len(indices), 2))
    for row, (top, left) in enumerate(offsets):
        padded[row, top:top + 28, left:left + 28] = grey[row]
    tints = draw.uniform(0.4, 1.0, size=(len(indices), 1, 1, 3)).astype(np.float32)
    return np.round(padded[..., None] * tints * 255).astype(np.uint8)


def build(path: Path, size: int) -> None:
    fmnist = load_dataset("fmnist")
    draw = np.random.default_rng(0)
    train = np.arange(size) % len(fmnist.y_train)
    test = np.arange(len(fmnist.y_test))
    x_train = tinted(fmnist.x_train.numpy(), train, draw)
    x_test = tinted(fmnist.x_test.numpy(), test, draw)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as handle:
        np.savez(handle, x_train=x_train, y_train=fmnist.y_train.numpy()[train], x_test=x_test,
                 y_test=fmnist.y_test.numpy()[test], declared_size=np.int64(size), num_classes=np.int64(10))
    os.replace(partial, path)


def peak_memory(process: subprocess.Popen) -> dict[str, float]:
    """Until `process` (GNU time) ends, the largest resident memory of the run under it, in GB, apart: anonymous
    (what the run holds) and file-backed (pages of the memory-mapped coefficients, which the kernel may drop)."""
    peaks = {"peak_anonymous_gb": 0.0, "peak_file_backed_gb": 0.0}
    while process.poll() is None:
        with contextlib.suppress(OSError, ValueError, IndexError):  # not started yet, or just ended
            child = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()[0]
            status = dict(line.split(":", 1) for line in Path(f"/proc/{child}/status").read_text().splitlines())
            for key, field in (("peak_anonymous_gb", "RssAnon"), ("peak_file_backed_gb", "RssFile")):
                peaks[key] = max(peaks[key], int(status[field].split()[0]) / 1e6)
        time.sleep(2)
    return {key: round(value, 2) for key, value in peaks.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epsilon", default="1")
    parser.add_argument("--train-size", type=int, default=TRAIN_SIZE, help="fewer for a quick check")
    parser.add_argument("--record", action="store_true", help=f"write the outcome to {RESULTS}")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.out / f"rgb-{args.train_size}.npz"
    if not data.exists():
        started = time.perf_counter()
        build(data, args.train_size)
        print(f"built {data} ({data.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - started:.0f} s", flush=True)
    run = args.out / "private"
    command = ["dpdistill", "train-private", "--dataset", str(data), "--epsilon", args.epsilon,
               "--student-arch", "scatter-linear", "--out", str(run), "--overwrite"]
    env = {**os.environ, "DPDISTILL_HOME": str(args.out / "home"), "DPDISTILL_CACHE_LIMIT_GB": "16"}
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(["/usr/bin/time", "-v", sys.executable, "-m", "dpdistill.cli.main", *command[1:]],
                                   env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        peaks = peak_memory(process)
        log.seek(0)
        output = log.read()
    wall = time.perf_counter() - started
    peak_kb = re.search(r"Maximum resident set size \(kbytes\): (\d+)", output)
    outcome = {"command": " ".join(command), "exit": process.returncode, "wall_seconds": round(wall),
               "peak_rss_gb": round(int(peak_kb.group(1)) / 1e6, 2) if peak_kb else None, **peaks,
               "train_images": args.train_size, "image_shape": [3, 32, 32],
               "last_lines": output.strip().splitlines()[-25:]}
    if (run / "report.json").exists():
        report = json.loads((run / "report.json").read_text())
        outcome["accuracy"] = report["accuracy"]["student"]
        outcome["epsilon"] = report["privacy"]["epsilon"]
    print(json.dumps(outcome, indent=1), flush=True)
    if args.record:
        RESULTS.write_text(json.dumps(outcome, indent=1) + "\n")


if __name__ == "__main__":
    main()
