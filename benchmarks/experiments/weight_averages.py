"""Whether moving averages of the weights make a release's student or its synthetic set better: a release's teacher
(with its released statistics) is transcribed again with the release's loop, and exponential moving averages of
the student's and the generator's weights (and BatchNorm buffers) are kept after every iteration, debiased as
Adam's moments are. Each average of the student is scored on the test split beside the last weights (the run's
report); each average of the generator draws a synthetic set as the release does (fresh latent vectors, classes
balanced by the teacher's argmax), scored by DataLens' classifier and the scattering Fréchet distance.

    .venv/bin/python benchmarks/experiments/weight_averages.py TEACHER_DIR OUT [--student-decays 0.95,0.99,0.995]
        [--generator-decays 0.95,0.99] [--iterations 600] [--synthetic-size 10000]

TEACHER_DIR is a release's OUT/teacher (its statistics file beside it); OUT receives the transcription. Averages are
post-processing of what the loop computes: no privacy is spent. Each decay is per iteration (0.99: about the last
100 of 600). About 30 minutes on 2 cores with AVX2 only.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpdistill import api
from dpdistill.allocator import keep_freed_memory
from dpdistill.data import load_dataset
from dpdistill.evaluation.metrics import accuracy
from dpdistill.methods.config import RELEASE_LOOP, TranscriptionConfig
from dpdistill.methods.engine import TranscriptionEngine
from dpdistill.methods.transcription import measure_synthetic, synthetic_set
from dpdistill.models.checkpoint import STUDENT


class MovingAverage:
    """A debiased exponential moving average of a module's floating-point state (weights and BatchNorm buffers);
    its integer buffers follow the module."""

    def __init__(self, decay: float) -> None:
        self.decay, self.updates, self.sums = decay, 0, None

    def update(self, module: nn.Module) -> None:
        state = module.state_dict()
        if self.sums is None:
            self.sums = {name: torch.zeros_like(value) for name, value in state.items() if value.is_floating_point()}
        self.updates += 1
        with torch.no_grad():
            for name, total in self.sums.items():
                total.mul_(self.decay).add_(state[name], alpha=1 - self.decay)

    def averaged(self, module: nn.Module) -> nn.Module:
        model = copy.deepcopy(module)
        state = model.state_dict()
        scale = 1 - self.decay ** self.updates
        state.update({name: total / scale for name, total in self.sums.items()})
        model.load_state_dict(state)
        return model.eval()


def keep_averages(student: dict[float, MovingAverage], generator: dict[float, MovingAverage],
                  engines: list[TranscriptionEngine]) -> None:
    """Make every engine update the averages after each of its iterations."""
    step = TranscriptionEngine.step

    def step_and_average(engine: TranscriptionEngine, timings: dict[str, float]) -> dict[str, Any]:
        if not engines:
            engines.append(engine)
        losses = step(engine, timings)
        for average in student.values():
            average.update(engine.student)
        for average in generator.values():
            average.update(engine.generator)
        return losses
    TranscriptionEngine.step = step_and_average


def decays(text: str) -> list[float]:
    return [float(value) for value in text.split(",") if value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("teacher", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--student-decays", type=decays, default=[0.95, 0.99, 0.995])
    parser.add_argument("--generator-decays", type=decays, default=[0.95, 0.99])
    parser.add_argument("--iterations", type=int, default=RELEASE_LOOP["iterations"])
    parser.add_argument("--synthetic-size", type=int, default=10000)
    args = parser.parse_args()
    keep_freed_memory()  # as the `dpdistill` command does
    student = {decay: MovingAverage(decay) for decay in args.student_decays}
    generator = {decay: MovingAverage(decay) for decay in args.generator_decays}
    engines: list[TranscriptionEngine] = []
    keep_averages(student, generator, engines)
    shutil.rmtree(args.out, ignore_errors=True)
    result = api.transcribe(str(args.teacher), str(args.out), privacy="none", preset="dp-teacher",
                            iterations=args.iterations, student_steps=RELEASE_LOOP["student_steps"], student_arch="cnn",
                            statistics_weight=1.0, synthetic_size=args.synthetic_size)
    print(json.dumps({"last weights": result.report["accuracy"],
                      "fidelity": result.report["synthetic"]["fidelity"]["synthetic_to_real"]}), flush=True)
    engine = engines[0]
    dataset = load_dataset(json.loads((args.teacher / "config.json").read_text())["dataset"])
    for decay, average in student.items():
        score = accuracy(average.averaged(engine.student), dataset.x_test, dataset.y_test)
        print(json.dumps({"student decay": decay, "student": round(100 * score, 2)}), flush=True)
    teacher = api.load_model(args.teacher, STUDENT).eval()
    for decay, average in generator.items():
        # the release's own draw (fresh latent vectors from its seed, classes balanced by the teacher's argmax),
        # from the averaged generator in place of its last weights
        images, labels, _ = synthetic_set(average.averaged(engine.generator), engine.latents, engine.config,
                                          dataset.num_classes, (teacher, "the teacher"))
        entry, score = measure_synthetic(images, labels, "the teacher", dataset.num_classes, TranscriptionConfig(),
                                         dataset)
        print(json.dumps({"generator decay": decay, "datalens classifier": round(100 * score, 2),
                          "fidelity": entry["fidelity"]["synthetic_to_real"]}), flush=True)


if __name__ == "__main__":
    main()
