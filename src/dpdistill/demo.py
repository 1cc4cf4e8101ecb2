"""`dpdistill demo`: on Fashion-MNIST, the routes that work beside the faithful transcription, in a few minutes.

Five rows at one sound epsilon, every figure from the pipeline's own reports:

1. DP-SGD on scattering features (scatter-linear: a fixed transform, nothing learnt, then a linear head trained
   with DP-SGD): a covered student that needs no public data. Its budget is stated for replacing one example,
   the relation of the other rows, so the epsilons compare like for like.
2. DPSD in data mode from one non-private teacher, at the same epsilon: covered, and near chance. The reason is
   the mechanism, not the implementation: each answer is beta * u + N(0, (sigma * beta)^2 I) with ||u|| <= 1, so
   all N answers together carry at most N / (2 sigma^2) nats about the teacher (the Gaussian channel's capacity),
   and at a sound epsilon of 3 that is a fraction of a bit, far below the log2(classes!) bits it takes only to
   tell which class is which (BENCHMARKS.md, the capacity bound).
3. The teacher itself, no guarantee: the most DPSD's student could learn from it.
4. A release, shortened: a cnn teacher trained with DP-SGD and a noisy picture of each class (the budget's tenth),
   transcribed into a cnn student for free (the teacher is itself a DP release, so reading it is post-processing).
   The default release trains longer and draws a synthetic set (docs/methods/release.md).
5. PATE: the private data split into an ensemble of linear heads on scattering features, each on its own part,
   their noisy votes labelling public images (the first test images; accuracy is measured on the rest): one
   example changes one member, so the ensemble's answers carry far more than one teacher's at the same epsilon.

The demo writes only under --out, into the run folders it names in `demo.json`; a second demo into the same
--out removes those folders first, and it refuses to start over folders of those names it did not write.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from dpdistill.errors import ConfigError
from dpdistill.jobs import train_teacher, train_teacher_ensemble
from dpdistill.methods.config import build_config
from dpdistill.methods.pate import PateConfig
from dpdistill.methods.release import build_release_config
from dpdistill.pipeline import pate, release, train_private, transcribe
from dpdistill.progress import Progress, ProgressDisplay
from dpdistill.reporting.report import is_covered, write_json
from dpdistill.runs import check_out_dir
from dpdistill.training.private import PrivateTrainingConfig
from dpdistill.training.teacher import SCATTER_INIT, TeacherConfig

DEMO_EPSILON = 3.0
DEMO_DELTA = 1e-5
RELATION = "replace-one"  # the transcription's relation: DP-SGD's epsilon then means the same as DPSD's
SUMMARY = "demo.json"  # the demo's own record of its run folders and of the table
RUNS = ("dpsgd", "teacher", "dpsd", "release", "ensemble", "pate")  # the folders a demo writes under --out


@dataclass(frozen=True)
class DemoScale:
    """How much work each row gets: Fashion-MNIST sized for 5 minutes on 2 idle cores, digits for a test."""

    dpsgd: dict[str, Any]  # overrides of scatter-linear's DP-SGD defaults
    teacher: dict[str, Any]  # TeacherConfig's settings of the cnn teacher
    dpsd: dict[str, Any]  # overrides of the `demo` transcription preset
    release_teacher: dict[str, Any]  # overrides of the release's DP-SGD teacher schedule
    release: dict[str, Any]  # overrides of the release's transcription (its `dp-teacher` loop)
    members: int  # PATE's ensemble: linear heads on scattering features, one per part of the data
    heads: dict[str, Any]  # TeacherConfig's settings of the heads
    pate: dict[str, Any]  # PateConfig's settings
    report_every: int  # print every n-th DPSD iteration


# PATE's heads: the benchmarks' (Adam 0.01, weight decay 0.01); their scatter-linear student on 500 noisy answers
HEADS = {"init": SCATTER_INIT, "heads_only": True, "lr": 0.01, "weight_decay": 0.01}
PATE_STUDENT = {"student_arch": "scatter-linear", "answer_targets": "posterior", "self_training_rounds": 0}
SCALES = {
    # 15 of the default 40 epochs, to fit 5 minutes beside the transform: 88.0, 88.0, 88.1, 88.1 and 88.1% in five
    # runs at the demo's epsilon (fresh noise each; 88.2% with 20 epochs). DPSD asks a tenth of the `demo` preset's
    # queries: at a fixed epsilon all its answers carry as little, whatever their number (1 / (8 m^2) nats for an
    # overall noise multiplier m). The release's teacher trains 1 of its 10 epochs and its loop 50 of its 600
    # iterations: 77.6% in 96 s on 2 idle cores (the default release: 84.9% at epsilon 1, in about 19 minutes)
    "fmnist": DemoScale(dpsgd={"epochs": 15}, teacher={"epochs": 1},
                        dpsd={"iterations": 30, "batch_size": 64, "eval_every": 30, "checkpoint_every": 30},
                        release_teacher={"epochs": 1},
                        release={"iterations": 50, "eval_every": 25, "checkpoint_every": 25},
                        members=100, heads={**HEADS, "min_steps": 150},
                        pate={**PATE_STUDENT, "queries": 500, "min_steps": 300}, report_every=10),
    # digits' 1,437 training images: a batch and a step scaled to them (the scattering test's settings)
    "digits": DemoScale(dpsgd={"epochs": 5, "batch_size": 256, "lr": 2.0},
                        teacher={"epochs": 5, "batch_size": 64, "min_steps": 0},
                        dpsd={"iterations": 20, "batch_size": 32, "eval_every": 10, "checkpoint_every": 10},
                        release_teacher={"epochs": 3},
                        release={"iterations": 4, "batch_size": 32, "student_steps": 2, "replay_size": 256,
                                 "generator_width": (16, 8, 4), "eval_every": 2, "checkpoint_every": 2},
                        members=10, heads={**HEADS, "min_steps": 100},
                        pate={**PATE_STUDENT, "queries": 100, "public_size": 180, "min_steps": 100,
                              "accept_noise": True}, report_every=10),
}


def run_demo(out: Path, console: Console, dataset: str = "fmnist") -> list[dict[str, Any]]:
    """Run the five rows on `dataset` (a key of SCALES) under `out`, print their table, and return its rows."""
    scale = SCALES[dataset]
    started = time.perf_counter()
    _start_afresh(out)
    console.print(f"[bold]1/5[/] DP-SGD on scattering features of {dataset} at epsilon {DEMO_EPSILON:g} (the "
                  f"transform is computed once, then kept on disk)")
    quiet = getattr(console, "quiet", False)
    # the display shows the feature pass too: on a cold cache it takes minutes before the first epoch
    with ProgressDisplay("DP-SGD", total=scale.dpsgd["epochs"], quiet=quiet) as display:
        private = train_private(PrivateTrainingConfig(dataset=dataset, student_arch="scatter-linear",
                                                      epsilon=DEMO_EPSILON, delta=DEMO_DELTA, relation=RELATION,
                                                      **scale.dpsgd), out / "dpsgd", progress=display)
    _done(console, started)
    console.print(f"[bold]2/5[/] a non-private cnn teacher on {dataset}")
    with ProgressDisplay("teacher", quiet=quiet) as display:
        teacher = train_teacher(dataset, out / "teacher", TeacherConfig(arch="cnn", **scale.teacher), progress=display)
    _done(console, started)
    console.print(f"[bold]3/5[/] DPSD, data mode, from that teacher at epsilon {DEMO_EPSILON:g}")
    config = build_config("demo", scale.dpsd, {"mode": "data", "epsilon": DEMO_EPSILON, "delta": DEMO_DELTA,
                                               "accept_noise": True})  # the row shows the capacity bound at work
    dpsd = transcribe(out / "teacher", config, out / "dpsd", dataset,
                      progress=_every(console, "iteration", scale.report_every, "student_accuracy"))
    _done(console, started)
    console.print(f"[bold]4/5[/] a release, shortened: a DP-SGD cnn teacher and a noisy picture of each class at "
                  f"epsilon {DEMO_EPSILON:g}, transcribed into a cnn student for free")
    with ProgressDisplay("release", quiet=quiet) as display:
        released = release(build_release_config(dataset, DEMO_EPSILON, DEMO_DELTA, RELATION, synthetic_size=0,
                                                teacher_options=scale.release_teacher,
                                                transcription_options=scale.release),
                           out / "release", progress=display)
    _done(console, started)
    console.print(f"[bold]5/5[/] PATE: {scale.members} linear heads on scattering features, each trained on its "
                  f"own part of {dataset}, label public images through noisy votes at epsilon {DEMO_EPSILON:g}")
    # its records carry no accuracy to print: the command line's display shows where each part stands instead
    with ProgressDisplay(f"{scale.members} heads", quiet=quiet) as heads:
        train_teacher_ensemble(dataset, out / "ensemble", TeacherConfig(**scale.heads), scale.members, progress=heads)
    with ProgressDisplay("PATE", quiet=quiet) as voting:
        voted = pate(out / "ensemble", PateConfig(epsilon=DEMO_EPSILON, delta=DEMO_DELTA, **scale.pate),
                     out / "pate", progress=voting)
    _done(console, started)
    rows = [
        {"route": "DP-SGD, scatter-linear", "uses": "private images, scattering features",
         "accuracy": private["accuracy"]["student"], "epsilon": private["privacy"]["epsilon"], "paper_epsilon": None,
         "covered": is_covered(private["privacy"]), "report": "dpsgd/report.md"},
        {"route": "DPSD, data mode", "uses": "a teacher's noisy answers on synthetic images",
         "accuracy": dpsd["accuracy"]["student"], "epsilon": dpsd["privacy"]["epsilon"],
         "paper_epsilon": dpsd["privacy"]["paper_epsilon"], "covered": is_covered(dpsd["privacy"]),
         "report": "dpsd/report.md"},
        {"route": "teacher, NOT private", "uses": "private images, no noise",
         "accuracy": teacher["accuracy"]["teacher"], "epsilon": math.inf, "paper_epsilon": None, "covered": False,
         "report": "teacher/report.json"},
        {"route": "release, cnn", "uses": "a DP-SGD teacher, read for free",
         "accuracy": released["accuracy"]["student"], "epsilon": released["privacy"]["epsilon"],
         "paper_epsilon": None, "covered": is_covered(released["privacy"]), "report": "release/report.md"},
        {"route": f"PATE, {scale.members} heads", "uses": "noisy votes on public images",
         "accuracy": voted["accuracy"]["student"], "epsilon": voted["privacy"]["epsilon"], "paper_epsilon": None,
         "covered": is_covered(voted["privacy"]), "report": "pate/report.md"},
    ]
    wall_seconds = time.perf_counter() - started
    write_json(out / SUMMARY, {"runs": list(RUNS), "dataset": dataset, "rows": rows, "wall_seconds": wall_seconds})
    _print_table(console, rows, f"dpdistill demo on {dataset} in {wall_seconds:.0f} s, reports under {out}",
                 capacity_bits(dpsd["privacy"]), teacher["dataset"]["num_classes"])
    return rows


def capacity_bits(privacy: dict[str, Any]) -> float:
    """What all of a data-mode transcription's answers can tell about the teacher, at most, in bits: each is
    beta * u + N(0, (sigma * beta)^2 I) with ||u|| <= 1, a Gaussian channel of capacity below 1 / (2 sigma^2) nats."""
    return privacy["queries"] / (2 * privacy["sigma"] ** 2) / math.log(2)


def _print_table(output: Console, rows: list[dict[str, Any]], title: str, bits: float, classes: int) -> None:
    """The rows, narrow enough for 80 columns (a log's width), then which route to use and why DPSD's is not it."""
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=0, show_edge=False)  # one space apart: 80 columns
    for column, width in (("route", 14), ("what it uses", 11), ("test accuracy", 8), ("sound epsilon", 7),
                          ("paper epsilon*", 8), ("covered", 7), ("report", 19)):
        table.add_column(column, width=width, overflow="fold")
    for row in rows:
        table.add_row(row["route"], row["uses"], f"{100 * row['accuracy']:.1f}%", f"{row['epsilon']:.3g}",
                      "-" if row["paper_epsilon"] is None else f"{row['paper_epsilon']:.3g}",
                      "yes" if row["covered"] else "no", row["report"])
    output.print(table)
    best, dpsd, released, voted = rows[0], rows[1], rows[3], rows[4]
    output.print(f"Sound epsilon: dp-accounting's, for replacing one private example, at delta {DEMO_DELTA:g}. *The "
                 f"DPSD paper's formula for the same run: NOT a guarantee.\n", highlight=False)
    output.print(f"Use DP-SGD on scattering features (`dpdistill train-private --student-arch scatter-linear`): "
                 f"{100 * best['accuracy']:.1f}% at a sound epsilon of {best['epsilon']:.3g}, every update covered, "
                 f"no public data needed.", highlight=False)
    output.print(f"Where a model or images must be released: `dpdistill release` trains a DP teacher and transcribes "
                 f"it for free ({100 * released['accuracy']:.1f}% in this shortened run; its defaults train longer and "
                 f"draw a synthetic set).", highlight=False)
    output.print(f"Where the data can be split into many parts and public images are at hand, an ensemble's noisy "
                 f"votes teach a student too ({100 * voted['accuracy']:.1f}%, `dpdistill train-teacher --partitions` "
                 f"then `dpdistill pate`): one example changes one member's vote.", highlight=False)
    output.print(f"The single-teacher DPSD student is near chance ({100 * dpsd['accuracy']:.1f}%) because of the "
                 f"capacity bound: at this noise all its answers together carry at most {bits:.2g} bits about the "
                 f"teacher, far below the log2({classes}!) = {math.lgamma(classes + 1) / math.log(2):.1f} bits it "
                 f"takes only to tell which class is which.", highlight=False)


def _start_afresh(out: Path) -> None:
    """Remove the run folders an earlier demo wrote under `out` (named in its summary) and refuse to write over
    folders of the same names that it did not write."""
    check_out_dir(out)
    summary = out / SUMMARY
    ours = set(json.loads(summary.read_text())["runs"]) if summary.exists() else set()
    foreign = [name for name in RUNS if (out / name).exists() and name not in ours]
    if foreign:
        raise ConfigError(f"{out / foreign[0]} exists and no earlier demo wrote it: choose another --out")
    for name in RUNS:
        shutil.rmtree(out / name, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    write_json(summary, {"runs": list(RUNS)})  # before any run: an interrupted demo is cleared by the next one


def _done(console: Console, started: float) -> None:
    console.print(f"  done, {time.perf_counter() - started:.0f} s into the demo", highlight=False)


def _every(console: Console, position: str, period: int, accuracy: str) -> Progress:
    """Print every `period`-th progress record's position and accuracy: a few minutes' run shows that it moves."""

    def show(record: dict) -> None:
        if position in record and record[position] % period == 0:  # a named phase's records count other work
            measured = record.get(accuracy)
            shown = "" if measured is None else f": test accuracy {100 * measured:.1f}%"
            console.print(f"  {position} {record[position]}{shown}", highlight=False)

    return show
