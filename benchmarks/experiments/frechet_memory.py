"""Peak resident memory of a release's Fréchet stage (the scattering features of its synthetic set and of the test
split, then the distance), with freed memory kept for reuse as the `dpdistill` command keeps it, or with the C
library's defaults: what that stage adds to a release's peak.

    .venv/bin/python benchmarks/experiments/frechet_memory.py RUN_DIR [--defaults]

RUN_DIR is a finished `release` (its synthetic.npz). One JSON line: the peak before and after, the distance and the
seconds.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import numpy as np
import torch

from dpdistill.allocator import keep_freed_memory
from dpdistill.data import load_dataset
from dpdistill.evaluation.fidelity import scattering_frechet
from dpdistill.methods.synthetic import SYNTHETIC_FILE


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux: kilobytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--defaults", action="store_true", help="leave the C library's allocator settings")
    args = parser.parse_args()
    kept = False if args.defaults else keep_freed_memory()
    synthetic = torch.from_numpy(np.load(args.run / SYNTHETIC_FILE)["x"])
    real = load_dataset(json.loads((args.run / "config.json").read_text())["teacher"]["dataset"]).x_test
    before, started = peak_gb(), time.perf_counter()
    distance = scattering_frechet(synthetic, real)["synthetic_to_real"]
    print(json.dumps({"run": str(args.run), "freed_memory_kept": kept, "peak_gb_before": round(before, 2),
                      "peak_gb": round(peak_gb(), 2), "distance": round(distance, 1),
                      "seconds": round(time.perf_counter() - started)}))


if __name__ == "__main__":
    main()
