"""What could the epsilon-10 PATE student reach with better answers? Fashion-MNIST.

    .venv/bin/python benchmarks/experiments/student_ceiling.py [ANSWERS [TEACHER_DIR [ENCODER_DIR]]]

The row `pate-100-heads-longer-fixmatch-posterior-eps10-q500-fmnist` (seed 0) asks its ensemble about 500 public
images and trains a FixMatch student, from the 4,800-step encoder, on them and the rest of the public pool. This
trains the same student on the same ANSWERS (default 500) images twice more, without noise: once labelled with
the ensemble's exact plurality (no noise could do better with these members), once with the true labels (no
ensemble could do better with that many answers). Neither student is private: the labels are exact. About 25
minutes on 2 cores. TEACHER_DIR and ENCODER_DIR default to that row's harness outputs.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dpdistill.data import load_dataset
from dpdistill.methods.pate import Answers, PateConfig, choose_queries, train_student, vote_counts
from dpdistill.models.ensemble import load_teacher

BENCH = Path("runs/bench")
TEACHERS = BENCH / "teachers-100-heads-longer-fmnist/seed0"
ENCODER = BENCH / "pretrain-longer-fmnist/seed0"


def main(queries: int, teacher_dir: Path, encoder_dir: Path) -> None:
    # The headline row's student settings (benchmarks/run.py FIXMATCH_STUDENT), seed 0: its images, and more.
    config = PateConfig(epsilon=10.0, queries=queries, student_arch="cnn", student_training="consistency",
                        batch_size=64, self_training_rounds=0, student_init=str(encoder_dir), seed=0)
    evaluation = load_dataset("fmnist")
    split = config.public_split(evaluation)
    indices = choose_queries(split.pool, config)
    ensemble, _ = load_teacher(teacher_dir)
    plurality = vote_counts(ensemble, split.pool[indices], evaluation.num_classes, torch.device("cpu"))
    truth = F.one_hot(split.pool_labels[indices], evaluation.num_classes)
    print(f"ensemble plurality right on the {queries} images: "
          f"{100 * (plurality.argmax(1) == split.pool_labels[indices]).float().mean().item():.1f}%", flush=True)
    for name, votes in (("exact plurality", plurality), ("true labels", truth)):
        started = time.perf_counter()
        answers = Answers(indices, votes.float(), votes.argmax(1), torch.ones(len(indices), dtype=torch.bool))
        _, history = train_student(split, answers, config, evaluation.num_classes, sigma=1.0)  # argmax: no sigma
        print(f"student from the {name}: {100 * history[-1]['test_accuracy']:.2f}% "
              f"({time.perf_counter() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    directories = [Path(argument) for argument in sys.argv[2:4]]
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 500, *directories, *(TEACHERS, ENCODER)[len(directories):])
