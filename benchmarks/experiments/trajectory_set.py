"""Whether a release's synthetic set is better drawn from the generator's whole trajectory than from its final
weights: a release's teacher (with its released statistics) is transcribed again with the release's loop, the
batches the generator makes over the loop's last half are kept (76,800 images at 600 iterations of 256), and a
set of each size is drawn from them, classes balanced by the teacher's argmax, and scored by DataLens' classifier
beside the final generator's own set (the run's report).

    .venv/bin/python benchmarks/experiments/trajectory_set.py TEACHER_DIR OUT [--iterations 600]

TEACHER_DIR is a release's OUT/teacher (its statistics file beside it); OUT receives the transcription. Everything
read is post-processing of the two releases. About 20 minutes on 2 idle cores.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path
from typing import Any

import torch

from dpdistill import api
from dpdistill.data import load_dataset
from dpdistill.evaluation.metrics import predict
from dpdistill.methods.config import RELEASE_LOOP, TranscriptionConfig
from dpdistill.methods.engine import TranscriptionEngine
from dpdistill.methods.synthetic import balanced_draw
from dpdistill.methods.transcription import measure_synthetic
from dpdistill.models.checkpoint import STUDENT


def keep_late_batches(kept: list[torch.Tensor]) -> None:
    """Make every engine keep a copy of each batch it generates in its loop's last half."""
    step = TranscriptionEngine.step

    def step_and_keep(engine: TranscriptionEngine, timings: dict[str, float]) -> dict[str, Any]:
        generate = engine._batch

        def batch() -> torch.Tensor:
            images = generate()
            if engine.iteration >= engine.config.iterations // 2:
                kept.append(images.detach().cpu().clone())
            return images
        engine._batch = batch
        try:
            return step(engine, timings)
        finally:
            del engine._batch
    TranscriptionEngine.step = step_and_keep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("teacher", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--iterations", type=int, default=RELEASE_LOOP["iterations"])
    parser.add_argument("--sizes", default="10000,60000")
    args = parser.parse_args()
    kept: list[torch.Tensor] = []
    keep_late_batches(kept)
    shutil.rmtree(args.out, ignore_errors=True)
    result = api.transcribe(str(args.teacher), str(args.out), privacy="none", preset="dp-teacher",
                            iterations=args.iterations, student_steps=RELEASE_LOOP["student_steps"], student_arch="cnn",
                            statistics_weight=1.0, synthetic_size=10000)
    print(json.dumps({"final generator": result.report["accuracy"],
                      "fidelity": result.report["synthetic"]["fidelity"]["synthetic_to_real"]}), flush=True)
    teacher = api.load_model(args.teacher, STUDENT).eval()
    dataset = load_dataset(json.loads((args.teacher / "config.json").read_text())["dataset"])
    pool = torch.cat(kept)
    for size in map(int, args.sizes.split(",")):
        order = iter(torch.randperm(len(pool), generator=torch.Generator().manual_seed(0)).split(1024))
        images, labels = balanced_draw(lambda count: pool[next(order)], lambda batch: predict(teacher, batch),
                                       size, dataset.num_classes, max_batches=math.ceil(len(pool) / 1024))
        # the release's own measure: DataLens' classifier (the engine's defaults) and the Fréchet distance
        entry, accuracy = measure_synthetic(images, labels, "the teacher", dataset.num_classes, TranscriptionConfig(),
                                            dataset)
        print(json.dumps({"trajectory images": len(labels), "pool": len(pool),
                          "datalens classifier": round(100 * accuracy, 2),
                          "fidelity": entry["fidelity"]["synthetic_to_real"]}), flush=True)


if __name__ == "__main__":
    main()
