"""A DP teacher's transcription with and without released feature statistics (training/feature_statistics.py): the
teacher's directory is copied, its normalisation layers' input statistics are released there (with the noise of
`--multiplier`, or exactly: the noise-free control), and the transcription runs on the copy with the generator
matching them.

    python benchmarks/experiments/released_statistics.py TEACHER_DIR OUT [--dataset fmnist] [--multiplier Z | --exact]
        [--resolution R] [--clip C] [--norms] [-- TRANSCRIBE_OPTIONS...]

`--resolution R` adds the class part (each class's images at R x R cells; 0, the default: the layers' part alone).
`--clip C` bounds each example's layer moments at C instead of `release`'s CLIP (the noise grows with it, the
epsilon stays). `--norms` prints the quantiles of the per-example norms of the layers' moments and of the class
part's cell moments at R = 7 and 14 (how CLIP and IMAGE_CLIP_PER_SIDE were chosen, on the MNIST set), and the bound
`release --statistics-clip auto` draws at `--multiplier` over the whole training split, and stops.
The statistics' figures are stated in the copy and its ledger, composed with the teacher's by the transcription's
report (the control's, without noise, reports no guarantee); `dpdistill release` makes both releases itself.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from dpdistill.data import load_dataset
from dpdistill.methods.teachers import read_teacher
from dpdistill.privacy.randomness import noise_source
from dpdistill.privacy.accounting import REPLACE_ONE
from dpdistill.privacy.ledger import ReleaseLedger
from dpdistill.losses.generator import image_cells
from dpdistill.training.feature_statistics import (CLIP, NORM_SHARE, STATISTICS_FILE, STATISTICS_METHOD,
                                                   StatisticsPlan, layer_moments, noisy_norm_median,
                                                   release_statistics, save_statistics)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("teacher", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--dataset", default="fmnist")
    noise = parser.add_mutually_exclusive_group()
    noise.add_argument("--multiplier", type=float, default=40.0, help="the release's noise multiplier")
    noise.add_argument("--exact", action="store_true", help="no noise: the noise-free control (NO guarantee)")
    parser.add_argument("--resolution", type=int, default=0, help="the class part's cells a side (0: none)")
    parser.add_argument("--clip", type=float, default=CLIP, help="the layers' moments' per-example L2 bound")
    parser.add_argument("--norms", action="store_true")
    options, transcribe = parser.parse_known_args()
    teacher, _meta = read_teacher(options.teacher)
    data = load_dataset(options.dataset)
    if options.norms:
        with torch.no_grad():
            norms = {"layers": layer_moments(teacher.eval(), data.x_train[:5000]).norm(dim=1)}
        for resolution in (7, 14):
            cells = image_cells(data.x_train[:20000], resolution)
            norms[f"cells {resolution}"] = torch.cat([cells, cells.pow(2)], 1).norm(dim=1)
        chosen = StatisticsPlan(options.multiplier, 1e-5, None, norm_share=NORM_SHARE)
        chosen = chosen.with_clip(noisy_norm_median(teacher, data.x_train, chosen, noise_source(False, 0)))
        print(json.dumps({**{part: {str(q): values.quantile(q).item() for q in (0.5, 0.9, 0.99, 1.0)}
                             for part, values in norms.items()}, "auto": {"norm_median": chosen.norm_median,
                                                                          "clip": chosen.clip}}))
        return
    copy = options.out / "teacher"
    shutil.copytree(options.teacher, copy, dirs_exist_ok=True)
    plan = StatisticsPlan(0.0 if options.exact else options.multiplier, 1e-5, options.clip, options.resolution)
    statistics = release_statistics(teacher, data.x_train, data.y_train, len(data.y_train), plan, data.num_classes,
                                    noise_source(False, 0))
    if plan.multiplier:  # recorded in the copy's ledger, as a release records them
        figures, ledger = plan.figures(), ReleaseLedger(copy)
        ledger.reserve(options.out, STATISTICS_METHOD, plan.release(REPLACE_ONE))
        ledger.settle(options.out, STATISTICS_METHOD, plan.release(REPLACE_ONE))
    else:  # the control: no noise, so the transcription reports no guarantee
        figures = {"noise_multiplier": 0.0, "clip": plan.clip, "resolution": plan.resolution,
                   "image_clip": plan.image_clip, "delta": 0.0, "epsilon_add_remove": float("inf"),
                   "epsilon_replace_one": float("inf")}
    save_statistics(copy / STATISTICS_FILE, statistics, figures)
    command = [str(Path(sys.executable).with_name("dpdistill")), "transcribe", "--teacher", str(copy), "--out",
               str(options.out / "run"), "--privacy", "none", "--dataset", options.dataset,
               "--set", "statistics_weight=1", *[part for part in transcribe if part != "--"]]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)
    report = json.loads((options.out / "run" / "report.json").read_text())
    print(json.dumps({"multiplier": plan.multiplier, "accuracy": report["accuracy"],
                      "frechet": report.get("synthetic", {}).get("fidelity", {}).get("synthetic_to_real")}))


if __name__ == "__main__":
    main()
