"""The whole pipeline in a few minutes on the embedded digits data: teacher, then data- and label-mode students."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from dpdistill.methods.config import build_config
from dpdistill.pipeline import train_teacher, transcribe
from dpdistill.training.teacher import TeacherConfig

DEMO_DATASET = "digits"
DEMO_EPSILON = 10.0


def run_demo(out: Path, console: Console) -> dict[str, dict]:
    """Train a teacher on digits, transcribe it at a sound epsilon of 10 in both modes, print the reports."""
    console.print(f"[bold]1/3[/] training the (non-private) teacher on {DEMO_DATASET}")
    teacher_dir = out / "teacher"
    teacher_report = train_teacher(DEMO_DATASET, teacher_dir, TeacherConfig(arch="cnn", epochs=15, batch_size=64))
    reports = {"teacher": teacher_report}
    for step, mode in enumerate(("data", "label"), start=2):
        console.print(f"[bold]{step}/3[/] DPSD, {mode}-sensitive privacy, sound epsilon {DEMO_EPSILON}")
        config = build_config("demo", {}, {"mode": mode, "epsilon": DEMO_EPSILON})
        run_dir = out / f"dpsd-{mode}"
        reports[mode] = transcribe(teacher_dir, config, run_dir, DEMO_DATASET, resume=False,
                                   progress=_every(50, console))
    table = Table(title=f"dpdistill demo on {DEMO_DATASET} (reports under {out})")
    for column in ("model", "test accuracy", "epsilon (sound)", "paper_epsilon (not a guarantee)", "report"):
        table.add_column(column)
    table.add_row("teacher (not private)", f"{100 * teacher_report['accuracy']['teacher']:.1f}%", "inf", "-",
                  str(teacher_dir / "report.json"))
    for mode in ("data", "label"):
        report = reports[mode]
        privacy = report["privacy"]
        table.add_row(f"DPSD student, {mode} privacy", f"{100 * report['accuracy']['student']:.1f}%",
                      f"{privacy['epsilon']:.3g}", f"{privacy['paper_epsilon']:.3g}", str(out / f"dpsd-{mode}" / "report.md"))
    Console().print(table)
    return reports


def _every(period: int, console: Console):
    def show(record: dict) -> None:
        if record["iteration"] % period == 0:
            accuracy = record.get("student_accuracy")
            shown = "" if accuracy is None else f", student accuracy {100 * accuracy:.1f}%"
            console.print(f"  iteration {record['iteration']}: {record['queries']} teacher queries{shown}")

    return show
