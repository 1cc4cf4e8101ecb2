"""The report of a transcription (DPSD, DPDFD, SRR: `dpdistill transcribe`) and of `dpdistill release`, a DP
teacher transcribed: its privacy statement, its figures, the data-free engine's options. Each method's report
section lives in a reporting module named for its method or family; what several share is in `report.py`."""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

from dpdistill.reporting.report import as_written, guarantee, number, percent, sample_source_rows, samples_and_curve

WITH_TEACHER = "with_teacher_seconds"  # a release's timing: its whole run, where one process ran it all


def privacy_statement(privacy: dict[str, Any]) -> str:
    """Plain words on what a transcription's epsilon covers."""
    mode = privacy.get("mode")
    teacher = privacy.get("teacher_release")
    if teacher is not None:
        answers = ("" if mode == "none" else f" Its {privacy['queries']} noisy answers alone spend epsilon "
                   f"{number(privacy.get('route_epsilon'))} more, recorded in the teacher's ledger.")
        claim = ("its owner's declaration, NOT verified by dpdistill" if not teacher["verified"]
                 else f"dpdistill's {teacher['release']} run {teacher.get('run')}")
        statistics = ("" if "released_statistics" not in privacy else
                      ", and so are its released feature statistics (epsilon "
                      f"{number(privacy['released_statistics']['epsilon'])}, "
                      f"delta {privacy['released_statistics']['delta']:g}: the two add up)")
        return (f"{guarantee(privacy)} with respect to {privacy['unit']}, by post-processing: the teacher is itself "
                f"a DP release ({claim}){statistics}; nothing else private was read.{answers} Covered: "
                f"{privacy['covered']}.")
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
    """A transcription's privacy mode in words: of a DP teacher, what makes it private is the teacher, read without
    noise (post-processing) or with noisy answers besides."""
    mode = report["privacy_mode"]
    if "teacher_release" not in report["privacy"]:
        return f"{mode} privacy"
    return "a DP teacher, read without noise" if mode == "none" else f"a DP teacher, with {mode}-private answers"


ENGINE_KEYS = ("discriminator", "latents", "generator_width", "generator_lr", "generator_student_weight",
               "one_hot_weight", "entropy_weight", "activation_weight", "batchnorm_weight", "smoothness_weight",
               "adversarial_weight", "student_steps", "replay_size", "augment_shift", "augment_flip",
               "student_schedule", "class_balanced", "distill_loss", "gradient_operation", "top_k", "candidates",
               "candidate_threshold")


def _engine_lines(config: dict[str, Any]) -> list[str]:
    """Which options of the data-free loop were on: the generator's teacher, its loss terms, the student's diet
    (a release's are its transcription's)."""
    engine = config.get("transcription", config)
    return ["| option | value |", "| --- | --- |", *(f"| {key} | {engine[key]} |" for key in ENGINE_KEYS)]


def _phase_breakdown(phases: dict[str, float]) -> str:
    total = sum(phases.values()) or 1.0
    return ", ".join(f"{phase} {seconds:.1f} s ({seconds / total:.0%})" for phase, seconds in phases.items())


def release_markdown(report: dict[str, Any]) -> str:
    """The report of `dpdistill release`: the DP teacher it trained, then its transcription."""
    teacher = report["teacher"]  # its training time, which grows with the private count, is the private record's
    return transcription_markdown(report, f"# dpdistill release on {report['dataset']}: a DP teacher, transcribed", [
        f"| DP teacher | {teacher['arch']}, its run in {teacher['path']} |",
        f"| budget (as requested: the DP teacher's{' and its statistics' if 'statistics' in report else ''}) | "
        f"{number(report['config']['teacher']['epsilon'] + report['config'].get('statistics_epsilon', 0.0))} |",
        *([] if "statistics" not in report else [
            f"| released feature statistics (the generator's picture of the data) | epsilon "
            f"{number(report['statistics']['epsilon_add_remove'])}, delta {report['statistics']['delta']:g}, in "
            f"{report['statistics']['path']}{_contents(report['statistics'])} |"])])


def _contents(statistics: dict[str, Any]) -> str:
    """What the statistics hold beside the teacher's layers' moments, and the bound those were clipped to."""
    resolution, clip, median = statistics.get("resolution", 0), statistics.get("clip"), statistics.get("norm_median")
    drawn = "" if median is None else f" ({clip / median:g} times their noisy median, drawn with them)"
    return (f"; with each class's images at {resolution} x {resolution} cells" if resolution else "") + (
        "" if clip is None else f"; the layers' moments bounded at {clip:.3g}{drawn}")


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
                 f"({synthetic['classifier_epochs']} epoch{'' if synthetic['classifier_epochs'] == 1 else 's'}, final model): accuracy on {synthetic['measured_on']} | "
                 f"{percent(report['accuracy']['synthetic'])} |",
                 f"| synthetic set to the real test split: scattering Fréchet distance (lower is closer; two halves "
                 f"of the test split: {fidelity['real_halves']:.3g}) | {fidelity['synthetic_to_real']:.4g} |"]
    return rows


def _known_rows(figures: list[tuple[str, Any, Callable[[Any], str]]]) -> list[str]:
    """Table rows of the figures that are known, each shown by its format: one that cannot be known (no test data,
    no RDP figure, no paper formula) is left out rather than shown as n/a."""
    return [f"| {label} | {shown(value)} |" for label, value, shown in figures if value is not None]


def transcription_markdown(report: dict[str, Any], title: str | None = None,
                           leading_rows: Sequence[str] = ()) -> str:
    """The human-readable report of a transcription run (`title` and `leading_rows`: another route's around it)."""
    privacy = report["privacy"]
    accuracy = report["accuracy"]
    scope = privacy.get("accountant") or privacy.get("epsilon_scope")
    accuracies = _known_rows([
        ("student accuracy (real test set)", accuracy["student"], percent),
        ("teacher accuracy (real test set; public: the teacher is a DP release)", accuracy.get("teacher"), percent)])
    figures = _known_rows([
        (f"epsilon (sound{f', {scope}' if scope else ''})", privacy.get("epsilon"), number),
        ("epsilon, replace one example",
         privacy["epsilon_replace_one"] if privacy.get("relation") == "add-remove" else None, number),
        ("epsilon (RDP cross-check)", privacy.get("epsilon_rdp"), number),
        ("delta", privacy.get("delta"), number),
        (f"budget (as requested, {privacy.get('accounting', 'sound')} accounting)", privacy.get("budget_epsilon"),
         number),
        (f"paper_epsilon ({privacy.get('paper_epsilon_label')})", privacy.get("paper_epsilon"), number),
        ("teacher queries", privacy.get("queries"), number)])
    lines = [
        title or f"# dpdistill report: {report['method'].upper()} ({privacy_mode_words(report)}) on "
                 f"{report['dataset']}",
        "",
        privacy_statement(privacy),
        "",
        "| quantity | value |",
        "| --- | --- |",
        *accuracies,
        *_synthetic_rows(report),
        *leading_rows,
        *figures,
        *sample_source_rows(privacy),
    ]
    for key in ("teachers", "aggregation", "sigma", "beta", "noise_std", "epsilon0", "num_candidates"):
        if key in privacy:
            lines.append(f"| {key} | {number(privacy[key])} |")
    timing = report["timing"]
    lines += [
        f"| wall time of the transcription's loop{' (resumed run: this part)' if report.get('resumed') else ''} | "
        f"{timing['wall_seconds']:.1f} s |",
        *([f"| samples per second | {number(timing['samples_per_second'])} |"]
          if timing.get("samples_per_second") is not None else []),
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
