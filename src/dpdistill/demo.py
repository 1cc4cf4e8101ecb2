"""The whole pipeline in a few minutes on the embedded digits data: teacher, then data- and label-mode students.

A third, non-private run (the upper-bound engine: teacher as discriminator, no noise) shows what data-free
distillation of the same teacher reaches without privacy, so the private rows can be read against it.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from dpdistill.methods.config import build_config
from dpdistill.pipeline import train_teacher, transcribe
from dpdistill.training.teacher import TeacherConfig

DEMO_DATASET = "digits"
DEMO_EPSILON = 10.0


DEMO_SIZE = {"iterations": 150, "batch_size": 128, "eval_every": 25, "checkpoint_every": 50}
RUNS = (  # name, title, preset, overrides, privacy
    ("dpsd-data", "DPSD student, data privacy", "demo", {}, {"mode": "data", "epsilon": DEMO_EPSILON}),
    ("dpsd-label", "DPSD student, label privacy", "demo", {}, {"mode": "label", "epsilon": DEMO_EPSILON}),
    ("upper-bound", "NO privacy: upper-bound engine", "upper-bound", {**DEMO_SIZE, "replay_size": 5000},
     {"mode": "none"}),
)


def run_demo(out: Path, console: Console) -> dict[str, dict]:
    """Train a teacher on digits, transcribe it privately in both modes and once without privacy; print a table."""
    total = len(RUNS) + 1
    console.print(f"[bold]1/{total}[/] training the (non-private) teacher on {DEMO_DATASET}")
    teacher_dir = out / "teacher"
    teacher_report = train_teacher(DEMO_DATASET, teacher_dir, TeacherConfig(arch="cnn", epochs=15, batch_size=64))
    reports = {"teacher": teacher_report}
    for step, (name, title, preset, overrides, privacy) in enumerate(RUNS, start=2):
        console.print(f"[bold]{step}/{total}[/] {title}")
        config = build_config(preset, overrides, privacy)
        reports[name] = transcribe(teacher_dir, config, out / name, DEMO_DATASET, resume=False,
                                   progress=_every(50, console))
    table = Table(title=f"dpdistill demo on {DEMO_DATASET} (reports under {out})")
    for column in ("model", "test accuracy", "epsilon (sound)", "paper_epsilon (not a guarantee)", "report"):
        table.add_column(column)
    table.add_row("teacher (not private)", f"{100 * teacher_report['accuracy']['teacher']:.1f}%", "inf", "-",
                  str(teacher_dir / "report.json"))
    for name, title, *_ in RUNS:
        privacy = reports[name]["privacy"]
        sound = "inf" if privacy["mode"] == "none" else f"{privacy['epsilon']:.3g}"
        paper = "-" if privacy["mode"] == "none" else f"{privacy['paper_epsilon']:.3g}"
        table.add_row(title, f"{100 * reports[name]['accuracy']['student']:.1f}%", sound, paper,
                      str(out / name / "report.md"))
    Console(width=max(Console().width, 130)).print(table)
    console.print("A single non-private teacher can pass little information at a sound epsilon of 10 "
                  "(see README, 'What epsilon means here'): the private students are expected to be weak.")
    console.print(f"Each epsilon covers its own run; releases from one teacher compose, and the upper-bound run "
                  f"read it without noise, so together they spend infinity: `dpdistill budget {teacher_dir}`.")
    return reports


def _every(period: int, console: Console):
    def show(record: dict) -> None:
        if record["iteration"] % period == 0:
            accuracy = record.get("student_accuracy")
            shown = "" if accuracy is None else f", student accuracy {100 * accuracy:.1f}%"
            console.print(f"  iteration {record['iteration']}: {record['queries']} teacher queries{shown}")

    return show
