"""The reports of PATE (`dpdistill pate`) and of DGD (`dpdistill dgd`), PATE's answers and student on DGD's images.
Each method's report section lives in a reporting module named for its method or family; what several share (the
student's rounds, also federated PATE's) is in `report.py`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from dpdistill.reporting.report import (guarantee, number, paper_epsilon_row, percent, pyplot, sample_source_rows,
                                       save_plot, student_rounds)


PATE_ROWS = (("epsilon_rdp", "epsilon (RDP cross-check)"), ("delta", "delta"), ("budget_epsilon", "budget"),
             ("teachers", "teachers (ensemble)"), ("queries", "answers released"),
             ("kept_answers", "answers kept (noisy lead >= vote margin)"), ("sigma", "sigma (per vote count: the Gaussian's std, the Laplace's scale)"),
             ("noise_std", "noise std per vote count"),
             ("noise_multiplier", "noise multiplier (Gaussian: std / sqrt 2; Laplace: 1 / eps0)"), ("vote_margin", "vote margin (sigmas)"),
             ("answer_targets", "student's targets (argmax: noisy winner; posterior: soft)"))


STUDENT_TRAINING_NOTES = {
    "consistency": " Each round is consistency training (FixMatch): the student also learns from every public image, "
                   "unlabelled, to give a hard view the class it gives an easy one.",
    "tangent-normal": " Each round is tangent-normal training (DGD, seed 004): a VAE fitted to the public images "
                      "reconstructs each one, a step along its manifold and a step across it, and the student's "
                      "features should not move within each triple."}


def pate_markdown(report: dict[str, Any]) -> str:
    """The human-readable report of a PATE run: the guarantee, the public images, the rounds."""
    privacy = report["privacy"]
    lines = [f"# dpdistill report: PATE on public images, {report['dataset']}", "", _headline(privacy), "",
             f"Public images: {report['public']}.", ""]
    return "\n".join(lines + _answers_and_rounds(report, report["config"])) + "\n"


def dgd_markdown(report: dict[str, Any]) -> str:
    """The human-readable report of a DGD run: the guarantee (none where the generator read the baseline), the
    generative stream, the answers, the student."""
    privacy, generative, config = report["privacy"], report["generative"], report["config"]
    lines = [f"# dpdistill report: DGD (discriminative-generative distillation), {report['dataset']}", "",
             _headline(privacy), ""]
    if generative:
        training = generative.get("training")
        lines += ["## Generative stream", "",
                  f"A generator trained data-free against the baseline {generative['baseline']} (read without noise) "
                  f"made the {generative['images']:,} images the student learns from"
                  + (f"; its last loss terms {', '.join(f'{k} {v:.4g}' for k, v in training['terms'].items())} "
                     f"({training['wall_seconds']:.0f} s)." if training else " (resumed run: the saved generator)."),
                  "", "![synthetic images](samples.png)", ""]
    else:
        lines += ["![the images the student learns from](samples.png)", ""] if "sample_source" in privacy else []
    lines += [f"Images: {report['public']}.", ""]
    return "\n".join(lines + _answers_and_rounds(report, config["labelling"])) + "\n"


def save_vote_leads(votes: Tensor, sigma: float, margin: float, path: Path) -> None:
    """How far each released noisy winner led the runner-up, in noise standard deviations: answers near 0 are
    nearly coin flips, answers far right survived the noise (computed from the released histograms only)."""
    top = votes.float().topk(2, dim=1).values
    leads = ((top[:, 0] - top[:, 1]) / sigma).numpy()
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(5, 3))
    axis.hist(leads, bins=40)
    if margin:
        axis.axvline(margin, color="black", linestyle="--", label=f"kept from {margin:g} sigmas")
        axis.legend()
    axis.set_xlabel("noisy winner's lead over the runner-up (noise standard deviations)", fontsize=7)
    axis.set_ylabel("answers")
    save_plot(figure, path)


def _headline(privacy: dict[str, Any]) -> str:
    """The guarantee and what it covers; for the control (exact votes), that it has none."""
    if privacy["mode"] == "none":
        claim = f"**NO privacy guarantee: a control** ({privacy['aggregation']})"
    else:
        claim = (f"{guarantee(privacy)} with respect to {privacy['unit']} ({privacy['accountant']}; "
                 f"{privacy['aggregation']})")
    return f"{claim}. Covered: {privacy['covered']}. The teachers are not private and must not be released."


def _answers_and_rounds(report: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """PATE's and DGD's figures: the student, the answers, the budget, the student's rounds (`settings`: PATE's)."""
    privacy, accuracy = report["privacy"], report["accuracy"]
    lines = ["| quantity | value |", "| --- | --- |",
             f"| student accuracy (real test images, none of them public) | {percent(accuracy['student'])} |",
             f"| kept answers naming the true class | {percent(accuracy['answers'])} |",
             f"| epsilon (sound, {privacy['accountant']}) | {number(privacy['epsilon'])} |"]
    lines += [f"| {label} | {number(privacy[key])} |" for key, label in PATE_ROWS if key in privacy]
    lines += sample_source_rows(privacy) + paper_epsilon_row(privacy)
    timing = report["timing"]
    lines += [f"| wall time{' (resumed run: this part)' if report.get('resumed') else ''} | "
              f"{timing['wall_seconds']:.1f} s |",
              f"| of which voting and noise | {timing['release_seconds']:.1f} s |", ""]
    if privacy["mode"] != "none":  # a control's exact votes have no noise to measure the leads in
        lines += ["How far each released noisy winner led the runner-up, in noise standard deviations (near 0: a "
                  "coin flip; from the released answers alone):", "", "![the answers' leads](answers.png)", ""]
    lines += ["## Student rounds", "",
              "Round 1 learns from the kept answers; each self-training round adds the public images the previous "
              "student labels confidently (post-processing: no further answers)."
              + STUDENT_TRAINING_NOTES.get(settings.get("student_training"), ""), ""]
    return lines + student_rounds(report, "answers")
