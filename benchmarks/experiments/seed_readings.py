"""The seed papers' noise-free controls at their corrected `--preset paper`, and the readings the text leaves open,
each a short indicative run (one seed) on a teacher given on the command line.

Each variant is a transcription in data mode with its noise all but removed (sigma 0.001 against answers of norm
beta, the benchmark's control) and the small generator (64, 32, 16 channels, a third of the paper preset's cost;
the papers name no generator); its test accuracy every `--eval-every` iterations goes to
`results/seed_readings.json` under `--tag`, beside the wall time.

    python benchmarks/experiments/seed_readings.py TEACHER_DIR --variant NAME [--variant NAME ...] [--tag TAG]
        [--iterations T] [--eval-every N]
    python benchmarks/experiments/seed_readings.py TEACHER_DIR --classes RUN_DIR
    python benchmarks/experiments/seed_readings.py TEACHER_DIR --step-seconds

`--classes` reads an interrupted run's last checkpoint instead (`RUN_DIR/private/resume`): the teacher's classes for
its generator's current samples, beside its generator terms every 10 iterations (is the generator collapsing?).
`--step-seconds` times one student step on 256 of the teacher's input shape (Adam, the third of three), for the
DataLens student and the ResNet18 of seed 001's label tables: what a workload of many student steps costs here.

Variants (`VARIANTS`): `workload-lr` (DPSD's `paper,paper-workload` with the student at Adam 1e-3, not the paper's
0.1: what the cited workload adds to a student that can learn) and `dpdfd` (DPDFD's corrected preset as it is). The
paper preset's own control is the benchmark's command (docs/methods/dpsd.md).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from dpdistill.methods.config import TranscriptionConfig, build_config
from dpdistill.models.ensemble import load_teacher
from dpdistill.models.registry import build_generator
from dpdistill.pipeline import transcribe
from dpdistill.runs import saved_config
from dpdistill.training.state import load_state

RESULTS = Path(__file__).parent / "results" / "seed_readings.json"
NOISE_FREE = {"mode": "data", "epsilon": 1e12, "sigma": 0.001, "accounting": "paper", "accept_noise": True}
SMALL = {"generator_width": (64, 32, 16)}
ADAM_1E3 = {"student_lr": 1e-3}


VARIANTS: dict[str, tuple[str, str, dict[str, Any]]] = {  # name: (method, preset, settings)
    "workload-lr": ("dpsd", "paper,paper-workload", ADAM_1E3),
    "dpdfd": ("dpdfd", "paper", {}),
}


def run(teacher: Path, out: Path, name: str, iterations: int | None, eval_every: int) -> dict[str, Any]:
    method, preset, settings = VARIANTS[name]
    overrides = {"method": method, "seed": 0, **SMALL, **settings, "eval_every": eval_every,
                 **({} if iterations is None else {"iterations": iterations})}
    config = build_config(preset, overrides, NOISE_FREE)
    started = time.perf_counter()
    report = transcribe(teacher, config, out / name, overwrite=True)
    curve = {record["iteration"]: record["student_accuracy"] for record in report["history"]
             if record.get("student_accuracy") is not None}
    outcome = {"method": method, "preset": preset, "settings": {**SMALL, **settings},
               "iterations": config.iterations, "student_steps": config.student_steps,
               "wall_seconds": round(time.perf_counter() - started), "accuracy": curve}
    print(json.dumps({name: outcome}), flush=True)
    return outcome


def checkpoint_classes(teacher_dir: Path, run: Path) -> None:
    """Print how the teacher classes the samples of the run's checkpointed generator, and its generator terms."""
    config = TranscriptionConfig.from_dict(saved_config(run))
    state = load_state(run / "private" / "resume")
    teacher, meta = load_teacher(teacher_dir)
    generator = build_generator(config.latent_dim, tuple(meta["in_shape"]), config.generator_width)
    generator.load_state_dict(state["generator"])
    with torch.no_grad():
        classes = teacher.eval()(generator.eval()(state["latents"])).argmax(1)
    print(f"iteration {state['iteration']}: the teacher's classes of the generator's {len(classes)} samples",
          torch.bincount(classes, minlength=int(meta["num_classes"])).tolist())
    for record in state["history"][9::10]:
        print({key: round(value, 3) for key, value in record.items() if key.startswith("g_") or key == "iteration"})


def step_seconds(teacher_dir: Path, architectures: tuple[str, ...] = ("datalens", "resnet18")) -> None:
    """Print the seconds one student step of 256 images takes for each architecture (the third of three)."""
    from dpdistill.models.registry import build_classifier

    _, meta = load_teacher(teacher_dir)
    images, labels = torch.randn(256, *meta["in_shape"]), torch.randint(int(meta["num_classes"]), (256,))
    for arch in architectures:
        model = build_classifier(arch, tuple(meta["in_shape"]), int(meta["num_classes"]))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for _ in range(3):
            started = time.perf_counter()
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
        print(f"{arch}: {time.perf_counter() - started:.2f} s a student step of 256", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("teacher", type=Path)
    parser.add_argument("--variant", choices=tuple(VARIANTS), action="append", default=[])
    parser.add_argument("--classes", type=Path, help="an interrupted run's directory: its generator's classes")
    parser.add_argument("--step-seconds", action="store_true", help="time one student step of each architecture")
    parser.add_argument("--tag", default="fmnist")
    parser.add_argument("--iterations", type=int)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("/tmp/seed-readings"))
    options = parser.parse_args()
    if options.classes is not None:
        checkpoint_classes(options.teacher, options.classes)
    if options.step_seconds:
        step_seconds(options.teacher)
    for name in options.variant:
        outcome = run(options.teacher, options.out, name, options.iterations, options.eval_every)
        kept = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        kept.setdefault(options.tag, {})[name] = outcome
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(kept, indent=1) + "\n")


if __name__ == "__main__":
    main()
