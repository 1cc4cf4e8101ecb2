"""The engine's settings for a DP teacher, searched on the MNIST set (the proxy): transcriptions of one DP-SGD run's
student without noise (post-processing), each a named set of `--set` overrides of a preset, the student's test
accuracy printed as it learns.

    .venv/bin/python benchmarks/experiments/dp_teacher_engine.py TEACHER_RUN [--device cuda] [--only NAME,...]

TEACHER_RUN is a `train-private --student-arch scatter-linear` output (e.g. the MNIST set's at epsilon 1). Each
setting runs in its own process (on a GPU they share it), its curve written to `--out`/NAME.json as it goes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

BASE = ("batchnorm_weight=0", "student_arch=cnn")  # on the `upper-bound` preset: DP-SGD's models have no BatchNorm
SETTINGS = {
    "upper-bound": (),  # teacher as discriminator, adversarial term 1, 16 student steps, 600 iterations
    "student-discriminator": ("discriminator=student", "adversarial_weight=0", "generator_student_weight=1"),
    "adversarial-0.3": ("adversarial_weight=0.3",),
    "adversarial-3": ("adversarial_weight=3",),
    "smoothness-0.5": ("smoothness_weight=0.5",),
    "smoothness-2": ("smoothness_weight=2",),
    "no-relabelled-augmentation": ("augment_shift=0", "augment_flip=false"),
    "learnt-latents": ("latents=trainable",),
    "temperature-1": ("temperature=1",),
    "one-hot-0": ("one_hot_weight=0",),
    "wide-generator": ("generator_width=128,128,64",),
}


def transcribe_one(teacher: Path, name: str, device: str, out: Path) -> None:
    """One setting, in this process: the engine on the teacher, its curve written as it learns."""
    import torch

    from dpdistill.methods.config import TranscriptionConfig, build_config
    from dpdistill.methods.engine import TranscriptionEngine
    from dpdistill.methods.teachers import evaluation_set, read_teacher
    from dpdistill.settings import parse_assignments

    model, meta = read_teacher(teacher)
    dataset = evaluation_set(meta["dataset"], tuple(meta["in_shape"]), meta["num_classes"])
    settings = parse_assignments([*BASE, *SETTINGS[name]], TranscriptionConfig)
    config = build_config("upper-bound", {"device": device, **settings}, {"mode": "none"})
    curve, started = [], time.perf_counter()

    def record(entry: dict) -> None:
        if "student_accuracy" in entry:
            curve.append({"iteration": entry["iteration"], "accuracy": entry["student_accuracy"],
                          "seconds": time.perf_counter() - started})
            (out / f"{name}.json").write_text(json.dumps({"setting": SETTINGS[name], "curve": curve}))
            print(f"{name} {entry['iteration']} {100 * entry['student_accuracy']:.2f}%", flush=True)

    torch.manual_seed(0)
    TranscriptionEngine(config, model, tuple(meta["in_shape"]), meta["num_classes"], dataset, None, record).run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("teacher", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--only", default=",".join(SETTINGS))
    parser.add_argument("--out", type=Path, default=Path("runs/dp-teacher-engine"))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process's setting
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.one:
        transcribe_one(args.teacher, args.one, args.device, args.out)
        return
    children = [subprocess.Popen([sys.executable, __file__, str(args.teacher), "--device", args.device, "--out",
                                  str(args.out), "--one", name]) for name in args.only.split(",")]
    for child in children:
        child.wait()


if __name__ == "__main__":
    main()
