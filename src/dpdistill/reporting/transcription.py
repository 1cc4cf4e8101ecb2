"""The report of a transcription (DPSD, DPDFD, SRR: `dpdistill transcribe`) and of `dpdistill release`, a DP
teacher transcribed: its privacy statement, its figures, the data-free engine's options. Each method's report
section lives in a reporting module named for its method or family; what several share is in `report.py`."""

from __future__ import annotations

import json
from typing import Any, Sequence

from dpdistill.reporting.report import as_written, guarantee, number, percent, sample_source_rows, samples_and_curve


def privacy_statement(privacy: dict[str, Any]) -> str:
    """Plain words on what a transcription's epsilon covers."""
    mode = privacy.get("mode")
    teacher = privacy.get("teacher_release")
    if teacher is not None:
        answers = ("" if mode == "none" else f" Its {privacy['queries']} noisy answers alone spend epsilon "
                   f"{number(privacy.get('route_epsilon'))} more, recorded in the teacher's ledger.")
        claim = ("its owner's declaration, NOT verified by dpdistill" if not teacher["verified"]
                 else f"dpdistill's {teacher['release']} run {teacher.get('run')}")
        return (f"{guarantee(privacy)} with respect to {privacy['unit']}, by post-processing: the teacher is itself "
                f"a DP release ({claim}), and nothing else private was read.{answers} Covered: {privacy['covered']}.")
    if mode == "none":
        return "**No privacy guarantee.** The student learned from the teacher's unprotected answers."
    unit, notion = (("one private training example", "DP") if mode == "data"
                    else ("the label of one private training example", "label-DP"))
    covered = privacy["covered"]
    return (f"{guarantee(privacy, notion)} with respect to {unit}: "
            f"{privacy['queries']} teacher answers, each protected by the mechanism, composed with "
            f"{privacy['accountant']}. Covered: {covered}. The teacher itself is not private and must not be "
            f"released.")


def privacy_mode_words(report: dict[str, Any]) -> str:
    """A transcription's privacy mode in words: of a DP teacher, what makes it private is the teacher."""
    mode = f"{report['privacy_mode']} privacy"
    return f"a DP teacher, {mode}" if "teacher_release" in report["privacy"] else mode


ENGINE_KEYS = ("discriminator", "latents", "generator_width", "generator_lr", "generator_student_weight",
               "one_hot_weight", "entropy_weight", "activation_weight", "batchnorm_weight", "smoothness_weight",
               "adversarial_weight", "student_steps", "replay_size", "augment_shift", "augment_flip",
               "student_schedule", "class_balanced", "distill_loss", "gradient_operation", "top_k", "candidates",
               "candidate_threshold")


def _engine_lines(config: dict[str, Any]) -> list[str]:
    """Which options of the data-free loop were on: the generator's teacher, its loss terms, the student's diet."""
    lines = ["| option | value |", "| --- | --- |"]
    lines += [f"| {key} | {config[key]} |" for key in ENGINE_KEYS if key in config]
    return lines


def _phase_breakdown(phases: dict[str, float]) -> str:
    total = sum(phases.values()) or 1.0
    return ", ".join(f"{phase} {seconds:.1f} s ({seconds / total:.0%})" for phase, seconds in phases.items())


def release_markdown(report: dict[str, Any]) -> str:
    """The report of `dpdistill release`: the DP teacher it trained, then its transcription."""
    teacher = report["teacher"]
    return transcription_markdown(report, f"# dpdistill release on {report['dataset']}: a DP teacher, transcribed", [
        f"| DP teacher ({teacher['arch']}, {teacher['path']}): accuracy (real test set) | "
        f"{percent(teacher['accuracy'])} |",
        f"| DP teacher: wall time | {teacher['wall_seconds']:.1f} s |",
        f"| release: wall time (teacher and transcription) | {report['timing']['release_seconds']:.1f} s |"])


def _synthetic_rows(report: dict[str, Any]) -> list[str]:
    """A synthetic set's rows: its size and labels, what a classifier trained on it alone reaches, its fidelity."""
    synthetic = report.get("synthetic")
    if synthetic is None:
        return []
    rows = [f"| synthetic set ({synthetic['file']}) | {synthetic['images']} images, labelled by "
            f"{synthetic['labelled_by']} |"]
    if "classifier" in synthetic:
        fidelity = synthetic["fidelity"]
        rows += [f"| a {synthetic['classifier']} classifier trained on the synthetic set alone "
                 f"({synthetic['classifier_epochs']} epochs, final model): accuracy on {synthetic['measured_on']} | "
                 f"{percent(report['accuracy']['synthetic'])} |",
                 f"| synthetic set to the real test split: scattering Fréchet distance (lower is closer; two halves "
                 f"of the test split: {fidelity['real_halves']:.3g}) | {fidelity['synthetic_to_real']:.4g} |"]
    return rows


def transcription_markdown(report: dict[str, Any], title: str | None = None,
                           leading_rows: Sequence[str] = ()) -> str:
    """The human-readable report of a transcription run (`title` and `leading_rows`: another route's around it)."""
    privacy = report["privacy"]
    accuracy = report["accuracy"]
    teacher = ([f"| teacher accuracy (real test set; public: the teacher is a DP release) | "
                f"{percent(accuracy['teacher'])} |"] if "teacher" in accuracy else [])
    lines = [
        title or f"# dpdistill report: {report['method'].upper()} ({privacy_mode_words(report)}) on "
                 f"{report['dataset']}",
        "",
        privacy_statement(privacy),
        "",
        "| quantity | value |",
        "| --- | --- |",
        f"| student accuracy (real test set) | {percent(accuracy['student'])} |",
        *_synthetic_rows(report),
        *teacher,
        *leading_rows,
        f"| epsilon (sound, {privacy.get('accountant') or privacy.get('epsilon_scope', 'n/a')}) | "
        f"{number(privacy.get('epsilon'))} |",
        *([f"| epsilon, replace one example | {number(privacy['epsilon_replace_one'])} |"]
          if privacy.get("relation") == "add-remove" else []),
        f"| epsilon (RDP cross-check) | {number(privacy.get('epsilon_rdp'))} |",
        f"| delta | {number(privacy.get('delta'))} |",
        f"| budget (as requested, {privacy.get('accounting', 'sound')} accounting) | "
        f"{number(privacy.get('budget_epsilon'))} |",
        f"| paper_epsilon ({privacy.get('paper_epsilon_label', 'n/a')}) | {number(privacy.get('paper_epsilon'))} |",
        f"| teacher queries | {privacy.get('queries')} |",
        *sample_source_rows(privacy),
    ]
    for key in ("teachers", "aggregation", "sigma", "beta", "noise_std", "epsilon0", "num_candidates"):
        if key in privacy:
            lines.append(f"| {key} | {number(privacy[key])} |")
    timing = report["timing"]
    lines += [
        f"| wall time | {timing['wall_seconds']:.1f} s |",
        f"| samples per second | {number(timing.get('samples_per_second'))} |",
        "",
        *samples_and_curve(report),
        "",
        "Time per phase: " + _phase_breakdown(timing.get("phases", {})),
        "",
        "## Data-free engine",
        "",
        *_engine_lines(report["config"]),
        "",
        "## Configuration",
        "",
        "```json",
        json.dumps(as_written(report["config"]), indent=2),
        "```",
        "",
        f"Seed {report['seed']}. Every figure above is also in `report.json`.",
    ]
    return "\n".join(lines) + "\n"
